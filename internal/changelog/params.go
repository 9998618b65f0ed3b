package changelog

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/position"
)

// Params collects the parameters of one statement.
type Params []any

// Add appends a parameter and returns its placeholder.
func (p *Params) Add(v any) string {
	*p = append(*p, v)
	return "$" + strconv.Itoa(len(*p))
}

// CountNotCertified counts the rows of changelog cl (quoted) matching conds (on row c, with
// their parameters in args) that a saved token at p has not passed. It also returns the age of
// the oldest of them (0 for none) and now, both by the database's clock. The watcher's Backlog,
// admin.Prune and admin.Backlog count through it, so that they agree.
func CountNotCertified(ctx context.Context, db *sql.DB, cl string, p position.Position, conds []string, args Params) (
	n int64, lag time.Duration, now time.Time, err error) {
	conds = append(conds, NotCertifiedBy(p, args.Add))
	var oldest sql.NullTime
	err = db.QueryRowContext(ctx, `SELECT count(*), min(c.changed_at), now() FROM `+cl+` c WHERE `+
		strings.Join(conds, "\n\tAND "), args...).Scan(&n, &oldest, &now)
	if err != nil {
		return 0, 0, time.Time{}, err
	}
	if oldest.Valid {
		lag = max(now.Sub(oldest.Time), 0)
	}
	return n, lag, now, nil
}
