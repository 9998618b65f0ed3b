package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgchangestream/pgchangestream/admin"
)

// sharedStatus is a shared client's members and ranges, in status and token list.
type sharedStatus struct {
	Members []memberStatus `json:"members"`
	Ranges  []rangeStatus  `json:"ranges"`
}

// memberStatus is one member of a shared client.
type memberStatus struct {
	Member           int64     `json:"member"`
	Name             string    `json:"name"`
	JoinedAt         time.Time `json:"joined_at"`
	LeaseLeftSeconds float64   `json:"lease_left_seconds"` // 0 or less: the lease ran out
	Ranges           int       `json:"ranges"`             // the ranges it owns
}

// rangeStatus is one range of a shared client: its owner and saved position. The age is the
// database's now() less the position's changed_at (its token's timestamp): per range, status
// reads no changelog rows.
type rangeStatus struct {
	Range        int             `json:"range"`
	Owner        *int64          `json:"owner"` // null: free
	OwnerName    *string         `json:"owner_name"`
	Token        json.RawMessage `json:"token"`
	TokenFormat  string          `json:"token_format"`
	PositionID   *int64          `json:"position_id"`
	PositionTime *time.Time      `json:"position_time"`
	AgeSeconds   *float64        `json:"age_seconds"`
	SavedAt      time.Time       `json:"saved_at"`
}

// newSharedStatus describes c, by the database's clock now.
func newSharedStatus(c admin.SharedClient, now time.Time) *sharedStatus {
	s := &sharedStatus{Members: []memberStatus{}, Ranges: []rangeStatus{}}
	for _, m := range c.Members {
		s.Members = append(s.Members, memberStatus{Member: m.Member, Name: m.Name, JoinedAt: m.JoinedAt,
			LeaseLeftSeconds: roundSeconds(m.LeaseLeft), Ranges: m.Ranges})
	}
	for _, r := range c.Ranges {
		rs := rangeStatus{Range: r.Range, Token: json.RawMessage(r.Token), SavedAt: r.UpdatedAt}
		rs.TokenFormat, _ = tokenFormat(r.Token)
		if r.Owner != 0 {
			owner, name := r.Owner, r.OwnerName
			rs.Owner, rs.OwnerName = &owner, &name
		}
		if rs.TokenFormat != tokenInvalid {
			id := r.Position.ID
			rs.PositionID = &id
		}
		if at := r.Position.ChangedAt; !at.IsZero() {
			age := roundSeconds(now.Sub(at))
			rs.PositionTime, rs.AgeSeconds = &at, &age
		}
		s.Ranges = append(s.Ranges, rs)
	}
	return s
}

// roundSeconds returns d in seconds, to the millisecond.
func roundSeconds(d time.Duration) float64 {
	return math.Round(d.Seconds()*1000) / 1000
}

// behindmost returns the token of c's range the furthest behind (by position), as a saved
// token of c: the one that holds back the most of the client's rows.
func behindmost(c admin.SharedClient) admin.SavedToken {
	r := slices.MinFunc(c.Ranges, func(a, b admin.SharedRangeInfo) int { return a.Position.Compare(b.Position) })
	return admin.SavedToken{Client: c.Client, Token: r.Token, UpdatedAt: r.UpdatedAt}
}

// withShared returns tokens with each shared client's token row replaced by its range the
// furthest behind, and the shared clients without a token row added (by client name).
func withShared(tokens []admin.SavedToken, shared []admin.SharedClient) []admin.SavedToken {
	added := false
	for _, c := range shared {
		if len(c.Ranges) == 0 {
			continue
		}
		i := slices.IndexFunc(tokens, func(t admin.SavedToken) bool { return t.Client == c.Client })
		if i >= 0 {
			tokens[i] = behindmost(c)
			continue
		}
		tokens, added = append(tokens, behindmost(c)), true
	}
	if added {
		slices.SortStableFunc(tokens, func(a, b admin.SavedToken) int { return strings.Compare(a.Client, b.Client) })
	}
	return tokens
}

// writeSharedTables writes, for each shared client, its members and its ranges.
func writeSharedTables(w io.Writer, clients []string, shared []*sharedStatus) error {
	for i, s := range shared {
		tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		fmt.Fprintf(tw, "\nshared client %s: %d members\n", clients[i], len(s.Members))
		fmt.Fprintln(tw, "MEMBER\tNAME\tLEASE LEFT\tRANGES")
		for _, m := range s.Members {
			left := "expired"
			if m.LeaseLeftSeconds > 0 {
				left = formatAge(time.Duration(m.LeaseLeftSeconds * float64(time.Second)))
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\n", m.Member, m.Name, left, m.Ranges)
		}
		fmt.Fprintln(tw, "\nRANGE\tOWNER\tPOSITION\tPOSITION TIME\tTOKEN\tSAVED\tAGE")
		for _, r := range s.Ranges {
			owner, id, posTime, age := ownerText(r), "-", "-", "-"
			if r.PositionID != nil {
				id = strconv.FormatInt(*r.PositionID, 10)
			}
			if r.PositionTime != nil {
				posTime = r.PositionTime.UTC().Format(eventTimeFormat)
				age = formatAge(time.Duration(*r.AgeSeconds * float64(time.Second)))
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Range, owner, id, posTime, r.TokenFormat,
				r.SavedAt.UTC().Format(time.RFC3339), age)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// listTokens returns every client's token-table row and every shared client's members and
// ranges, by client name.
func listTokens(ctx context.Context, db *sql.DB, opts admin.Options) ([]listedToken, error) {
	tokens, err := admin.ListTokens(ctx, db, opts)
	if err != nil {
		return nil, err
	}
	shared, err := admin.ListShared(ctx, db, opts)
	if err != nil {
		return nil, err
	}
	var now time.Time
	if err := db.QueryRowContext(ctx, `SELECT now()`).Scan(&now); err != nil {
		return nil, fmt.Errorf("read the database's clock: %w", err)
	}
	out := make([]listedToken, 0, len(tokens))
	for _, t := range tokens {
		out = append(out, listedToken{Client: t.Client, Token: json.RawMessage(t.Token), SavedAt: &t.UpdatedAt})
	}
	added := false
	for _, c := range shared {
		i := slices.IndexFunc(out, func(t listedToken) bool { return t.Client == c.Client })
		if i < 0 {
			out, i, added = append(out, listedToken{Client: c.Client}), len(out), true
		}
		out[i].Shared = newSharedStatus(c, now)
	}
	if added {
		slices.SortStableFunc(out, func(a, b listedToken) int { return strings.Compare(a.Client, b.Client) })
	}
	return out, nil
}

// writeSharedTokens writes, for each shared client, its ranges' owners and tokens as stored.
func writeSharedTokens(w io.Writer, clients []string, shared []*sharedStatus) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	for i, s := range shared {
		fmt.Fprintf(tw, "\nshared client %s: %d members\nRANGE\tOWNER\tSAVED\tTOKEN\n", clients[i], len(s.Members))
		for _, r := range s.Ranges {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", r.Range, ownerText(r), r.SavedAt.UTC().Format(time.RFC3339), r.Token)
		}
	}
	return tw.Flush()
}

// ownerText names a range's owner: its id and name, or free.
func ownerText(r rangeStatus) string {
	if r.Owner == nil {
		return "free"
	}
	owner := strconv.FormatInt(*r.Owner, 10)
	if *r.OwnerName != "" {
		owner += " (" + *r.OwnerName + ")"
	}
	return owner
}
