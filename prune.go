package pgchangestream

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
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
		form, err := parseStoredToken([]byte(t.Token))
		if errors.Is(err, errTokenNeedsLookup) {
			err = form.lookUp(ctx, db, tables.q.rowTime)
			if errors.Is(err, sql.ErrNoRows) {
				res.Unresolved = append(res.Unresolved, t.Client)
				continue
			}
		}
		if err != nil {
			return PruneResult{}, fmt.Errorf("client %s: %w", t.Client, err)
		}
		res.Clients = append(res.Clients, t.Client)
		conds = append(conds, form.certifies(arg))
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

// storedToken is a saved token in any of its forms, for the certification predicate:
// legacy {"timestamp", "eventID"} (or id-only); snapshot, with an optional delta; switchover.
type storedToken struct {
	pos        Position
	snapshot   string // pg_snapshot B
	deltaEnd   string // pg_snapshot E
	deltaXid   string // decimal xid8
	deltaID    int64
	switchover string // pg_snapshot S0
}

// parseStoredToken parses a saved token. An id-only token is returned with
// errTokenNeedsLookup: its changed_at is its row's.
func parseStoredToken(raw []byte) (storedToken, error) {
	pos, err := decodeToken(raw)
	needsLookup := errors.Is(err, errTokenNeedsLookup)
	if err != nil && !needsLookup {
		return storedToken{}, err
	}
	var extra struct {
		Snapshot   string       `json:"snapshot"`
		DeltaEnd   string       `json:"deltaEnd"`
		DeltaXid   string       `json:"deltaXid"`
		DeltaID    *json.Number `json:"deltaID"`
		Switchover string       `json:"switchover"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&extra); err != nil {
		return storedToken{}, fmt.Errorf("saved token %q: %w", raw, err)
	}
	t := storedToken{pos: pos, snapshot: extra.Snapshot, deltaEnd: extra.DeltaEnd, deltaXid: extra.DeltaXid,
		switchover: extra.Switchover}
	if (t.deltaEnd != "") != (extra.DeltaID != nil) || (t.deltaEnd != "") != (t.deltaXid != "") ||
		(t.deltaEnd != "" && t.snapshot == "") || (t.snapshot != "" && t.switchover != "") {
		return storedToken{}, fmt.Errorf("saved token %q: incomplete or mixed snapshot fields", raw)
	}
	if extra.DeltaID != nil {
		var err error
		if t.deltaID, err = extra.DeltaID.Int64(); err != nil {
			return storedToken{}, fmt.Errorf("saved token %q: deltaID: %w", raw, err)
		}
	}
	if t.deltaXid != "" {
		if _, err := strconv.ParseUint(t.deltaXid, 10, 64); err != nil {
			return storedToken{}, fmt.Errorf("saved token %q: deltaXid is not a decimal xid8", raw)
		}
	}
	if needsLookup && t.snapshot == "" { // a snapshot token certifies by its snapshots alone
		return t, errTokenNeedsLookup
	}
	return t, nil
}

// lookUp sets the position of an id-only token from its row, read by the rowTime query;
// sql.ErrNoRows if it is gone.
func (t *storedToken) lookUp(ctx context.Context, db *sql.DB, rowTime string) error {
	var ts time.Time
	err := db.QueryRowContext(ctx, rowTime, t.pos.ID).Scan(&ts)
	if err != nil {
		return err
	}
	t.pos = makePosition(ts, t.pos.ID)
	return nil
}

// certifies returns the SQL predicate, on changelog row c, of the rows the token has passed;
// arg adds a parameter and returns its placeholder.
func (t storedToken) certifies(arg func(any) string) string {
	legacy := func() string {
		return "(c.changed_at, c.id) <= (" + arg(t.pos.ChangedAt) + "::timestamptz, " + arg(t.pos.ID) + "::bigint)"
	}
	switch {
	case t.switchover != "":
		return "(" + legacy() + " AND (c.txid IS NULL OR pg_visible_in_snapshot(c.txid, " + arg(t.switchover) + "::pg_snapshot)))"
	case t.snapshot != "":
		p := "c.txid IS NULL OR pg_visible_in_snapshot(c.txid, " + arg(t.snapshot) + "::pg_snapshot)"
		if t.deltaEnd != "" {
			p += " OR (pg_visible_in_snapshot(c.txid, " + arg(t.deltaEnd) + "::pg_snapshot) AND (c.txid, c.id) <= (" +
				arg(t.deltaXid) + "::xid8, " + arg(t.deltaID) + "::bigint))"
		}
		return "(" + p + ")"
	}
	return legacy()
}
