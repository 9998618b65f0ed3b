package admin

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// SharedClient is a Config.Shared client as its tables hold it (see [ListShared]).
type SharedClient struct {
	Client string
	// Members are the client's members, by id; a member whose lease ran out stays listed (with
	// LeaseLeft 0 or less) until another member removes it.
	Members []SharedMemberInfo
	// Ranges are the client's SharedRanges ranges, by range number.
	Ranges []SharedRangeInfo
}

// SharedMemberInfo is one member of a shared client.
type SharedMemberInfo struct {
	Member     int64
	Name       string
	JoinedAt   time.Time
	LeaseUntil time.Time
	// LeaseLeft is LeaseUntil less the database's now(); 0 or less once the lease ran out.
	LeaseLeft time.Duration
	// Ranges is the number of ranges the member owns.
	Ranges int
}

// SharedRangeInfo is one range of a shared client.
type SharedRangeInfo struct {
	Range int
	// Owner is the member that owns the range, 0 while it is free; OwnerName its name ("" for
	// none, or an owner whose member row is gone).
	Owner     int64
	OwnerName string
	// Token is the range's saved position, JSON as in the token table, saved at UpdatedAt.
	Token     string
	UpdatedAt time.Time
	// Position is where the range's next owner resumes: after it (zero for a token that does
	// not load, or for one that holds only an id, with that ID).
	Position Position
}

// ListShared returns every shared client of the changelog (those with rows in its _ranges
// table), ordered by client name, with their members and ranges. A changelog without the
// shared tables (schema.Install adds them) has none.
func ListShared(ctx context.Context, db *sql.DB, opts Options) ([]SharedClient, error) {
	t, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	return listShared(ctx, db, t)
}

func listShared(ctx context.Context, db *sql.DB, t resolved) ([]SharedClient, error) {
	ranges, members := changelog.RangeTable(t.changelog), changelog.MemberTable(t.changelog)
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL`,
		changelog.Quote(ranges), changelog.Quote(members)).Scan(&exists); err != nil {
		return nil, fmt.Errorf("look for the shared tables of changelog %s: %w", t.changelog, err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := db.QueryContext(ctx, `SELECT r.client_name, r.range_no, COALESCE(r.owner, 0), COALESCE(m.name, ''),
	r.resume_token::text, r.last_updated
	FROM `+changelog.Quote(ranges)+` r LEFT JOIN `+changelog.Quote(members)+` m ON m.client_name = r.client_name AND m.member = r.owner
	ORDER BY r.client_name COLLATE "C", r.range_no`)
	if err != nil {
		return nil, fmt.Errorf("read range table %s: %w", ranges, err)
	}
	var out []SharedClient
	err = scanAll(rows, func() error {
		var (
			client string
			r      SharedRangeInfo
		)
		if err := rows.Scan(&client, &r.Range, &r.Owner, &r.OwnerName, &r.Token, &r.UpdatedAt); err != nil {
			return err
		}
		if p, err := position.DecodeToken([]byte(r.Token)); err == nil || errors.Is(err, position.ErrTokenNeedsLookup) {
			r.Position = p
		}
		if len(out) == 0 || out[len(out)-1].Client != client {
			out = append(out, SharedClient{Client: client})
		}
		c := &out[len(out)-1]
		c.Ranges = append(c.Ranges, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read range table %s: %w", ranges, err)
	}
	rows, err = db.QueryContext(ctx, `SELECT client_name, member, name, joined_at, lease_until, EXTRACT(EPOCH FROM lease_until - now())::float8
	FROM `+changelog.Quote(members)+` ORDER BY client_name COLLATE "C", member`)
	if err != nil {
		return nil, fmt.Errorf("read member table %s: %w", members, err)
	}
	err = scanAll(rows, func() error {
		var (
			client string
			left   float64
			m      SharedMemberInfo
		)
		if err := rows.Scan(&client, &m.Member, &m.Name, &m.JoinedAt, &m.LeaseUntil, &left); err != nil {
			return err
		}
		i, found := slices.BinarySearchFunc(out, client, func(c SharedClient, name string) int { return strings.Compare(c.Client, name) })
		if !found { // a member of a client without ranges yet: it is about to create them
			out = slices.Insert(out, i, SharedClient{Client: client})
		}
		m.LeaseLeft = time.Duration(left * float64(time.Second))
		for _, r := range out[i].Ranges {
			if r.Owner == m.Member {
				m.Ranges++
			}
		}
		out[i].Members = append(out[i].Members, m)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read member table %s: %w", members, err)
	}
	return out, nil
}

// scanAll calls scan for each row of rows, and closes them.
func scanAll(rows *sql.Rows, scan func() error) error {
	defer rows.Close()
	for rows.Next() {
		if err := scan(); err != nil {
			return err
		}
	}
	return rows.Err()
}

// rangeLabel names a range of a client in messages.
func rangeLabel(client string, r int) string {
	return client + " range " + strconv.Itoa(r)
}
