package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultPruneBatch is the number of rows [Prune] deletes per statement by default.
const DefaultPruneBatch = 10000

// PruneOptions configures [Prune].
type PruneOptions struct {
	AdminOptions
	// OlderThan keeps the rows whose changed_at is less than this old (by the database's
	// clock). 0 keeps none of the passed rows.
	OlderThan time.Duration
	// Table restricts the deletion to the rows of this table. Empty: every table.
	Table string
	// IgnoreClients are tokens that do not hold rows back (clients being retired).
	IgnoreClients []string
	// BatchSize is the number of rows per DELETE. Default DefaultPruneBatch.
	BatchSize int
	// DryRun counts the rows that would be deleted and deletes nothing.
	DryRun bool
	// Progress, if set, is called after each batch with the rows deleted so far.
	Progress func(deleted int64)
}

// PruneResult is what [Prune] did.
type PruneResult struct {
	// Deleted is the number of rows deleted (with DryRun: that would be deleted).
	Deleted int64
	// Batches is the number of DELETE statements run.
	Batches int
	// Clients are the clients whose tokens bounded the deletion.
	Clients []string
	// Unresolved are clients whose token names a changelog row that no longer exists: their
	// watcher replays from the beginning, so they hold every row back and nothing is deleted.
	Unresolved []string
}

// Prune deletes the changelog rows that every client has passed: a row is deleted only if the
// saved token of every client in the token table (but those in IgnoreClients) certifies it.
// The token table does not record a client's table, so every token counts for every table: a
// client that never reads a table still holds back that table's rows after its position.
// Prune never uses the legacy processed flag, which is shared by all clients. It refuses when
// a token cannot be parsed, and deletes nothing when there is no token or when a token's row
// cannot be found. A row whose transaction was still open when a legacy token passed its
// position is certified by that token too, but its watcher may not have fetched it yet:
// OlderThan keeps a margin against that. The tokens are read once, before the first batch: do
// not move a token back ([ResetToken]) while Prune runs.
func Prune(ctx context.Context, db *sql.DB, opts PruneOptions) (PruneResult, error) {
	tables, err := opts.resolve()
	if err != nil {
		return PruneResult{}, err
	}
	cl := tables.cl
	if opts.BatchSize <= 0 {
		opts.BatchSize = DefaultPruneBatch
	}
	tokens, err := ListTokens(ctx, db, opts.AdminOptions)
	if err != nil {
		return PruneResult{}, err
	}
	var res PruneResult
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	conds := []string{"c.changed_at < now() - make_interval(secs => " + arg(opts.OlderThan.Seconds()) + "::float8)"}
	if opts.Table != "" {
		conds = append(conds, "c.table_name = "+arg(opts.Table))
	}
	for _, t := range tokens {
		if slices.Contains(opts.IgnoreClients, t.Client) {
			continue
		}
		pos, err := decodeToken([]byte(t.Token))
		if errors.Is(err, errTokenNeedsLookup) {
			pos, err = lookUpTokenRow(ctx, db, tables.q.rowTime, pos.ID)
			if errors.Is(err, sql.ErrNoRows) {
				res.Unresolved = append(res.Unresolved, t.Client)
				continue
			}
		}
		if err != nil {
			return PruneResult{}, fmt.Errorf("client %s: %w", t.Client, err)
		}
		res.Clients = append(res.Clients, t.Client)
		conds = append(conds, certifiedBy(pos, arg))
	}
	if len(res.Clients) == 0 || len(res.Unresolved) > 0 {
		return res, nil
	}
	where := strings.Join(conds, "\n\tAND ")
	if opts.DryRun {
		err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+cl+` c WHERE `+where, args...).Scan(&res.Deleted)
		if err != nil {
			return res, fmt.Errorf("count passed rows of changelog %s: %w", tables.changelog, err)
		}
		return res, nil
	}
	del := `WITH doomed AS (SELECT c.id FROM ` + cl + ` c WHERE ` + where + ` ORDER BY c.id LIMIT ` +
		strconv.Itoa(opts.BatchSize) + `)
	DELETE FROM ` + cl + ` WHERE id IN (SELECT id FROM doomed)`
	for {
		r, err := db.ExecContext(ctx, del, args...)
		if err != nil {
			return res, fmt.Errorf("delete passed rows of changelog %s: %w", tables.changelog, err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return res, err
		}
		res.Deleted += n
		res.Batches++
		if opts.Progress != nil {
			opts.Progress(res.Deleted)
		}
		if n < int64(opts.BatchSize) {
			return res, nil
		}
	}
}

// lookUpTokenRow returns the legacy position of an id-only token, whose changed_at is its row's
// (read by the rowTime query); sql.ErrNoRows if the row is gone.
func lookUpTokenRow(ctx context.Context, db *sql.DB, rowTime string, id int64) (Position, error) {
	var ts time.Time
	if err := db.QueryRowContext(ctx, rowTime, id).Scan(&ts); err != nil {
		return Position{}, err
	}
	return makePosition(ts, id), nil
}

// certifiedBy returns the SQL predicate, on changelog row c, of the rows a saved token at p has
// passed (see [savedToken]); arg adds a parameter and returns its placeholder.
func certifiedBy(p Position, arg func(any) string) string {
	legacy := func() string {
		return "(c.changed_at, c.id) <= (" + arg(p.ChangedAt) + "::timestamptz, " + arg(p.ID) + "::bigint)"
	}
	switch {
	case p.span == nil:
		return legacy()
	case !p.inDelta():
		return "(" + legacy() + " AND (c.txid IS NULL OR pg_visible_in_snapshot(c.txid, " + arg(p.span.base.String()) + "::pg_snapshot)))"
	}
	cond := "c.txid IS NULL OR pg_visible_in_snapshot(c.txid, " + arg(p.span.base.String()) + "::pg_snapshot)"
	if p.inRows {
		cond += " OR (pg_visible_in_snapshot(c.txid, " + arg(p.span.end.String()) + "::pg_snapshot) AND c.id <= " +
			arg(p.ID) + "::bigint)"
	}
	return "(" + cond + ")"
}

// notCertifiedBy returns the SQL predicate, on changelog row c, of the rows a saved token at p
// has not passed, with a bound an index can serve: a legacy position's, or the base snapshot's
// xmin, below which every transaction is visible.
func notCertifiedBy(p Position, arg func(any) string) string {
	var bound string
	if p.inDelta() {
		bound = "c.txid >= " + arg(strconv.FormatUint(p.span.base.xmin, 10)) + "::xid8"
	} else {
		bound = "(c.changed_at, c.id) > (" + arg(p.ChangedAt) + "::timestamptz, " + arg(p.ID) + "::bigint)"
		if p.span != nil { // the switch-over's legacy part: rows it does not see are ahead too
			bound = "(" + bound + " OR NOT pg_visible_in_snapshot(c.txid, " + arg(p.span.base.String()) + "::pg_snapshot))"
		}
	}
	return bound + " AND NOT " + certifiedBy(p, arg)
}
