package admin

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// DefaultPruneBatch is the number of rows [Prune] deletes per statement by default.
const DefaultPruneBatch = changelog.DefaultPruneBatch

// PruneOptions configures [Prune].
type PruneOptions struct {
	Options
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
	// Holders are the clients whose tokens kept rows that are old enough (and of Table, when
	// set), the most rows first.
	Holders []PruneHolder
}

// PruneHolder is a client whose token kept rows [Prune] would otherwise have deleted.
type PruneHolder struct {
	Client string
	// Table is the table its token records; "" for a token that records none, which counts
	// for every table.
	Table string
	// Rows is the number of rows, old enough and of Table (and of PruneOptions.Table), that
	// its token has not passed; for a shared client, that the token of its range the furthest
	// behind has not passed (SavedAt and Age are that token's).
	Rows int64
	// SavedAt is when its token was last saved, and Age how long ago, by the database's clock.
	// A running watcher saves at least once per Config.CheckpointRefreshInterval while it has
	// nothing pending: a much older token often belongs to a client that no longer runs.
	SavedAt time.Time
	Age     time.Duration
}

// pruneToken is a token that counts for the rows [Prune] may delete.
type pruneToken struct {
	SavedToken
	pos    Position
	table  string // the table it records; "" for every table
	ranged bool   // a range's token of a shared client
}

// Prune deletes the changelog rows that every client of their table has passed: a row is
// deleted only if it is older than OlderThan, some saved token counts for its table, and every
// such token (but those in IgnoreClients) certifies it. A token counts for the table it
// records (Config.TableName of the watcher that saved it); a token that records none (saved
// by an older watcher, or by [ResetToken] for a client without a token) counts for every
// table. So the rows of a table that no token counts for are kept, and so is everything when
// there is no token. Prune never uses the legacy processed flag, which is shared by all
// clients. It refuses when a token cannot be parsed, and deletes nothing when a token's row
// cannot be found. A row whose transaction was still open when a legacy token passed its
// position is certified by that token too, but its watcher may not have fetched it yet:
// OlderThan keeps a margin against that. The tokens are read once, before the first batch: do
// not move a token back ([ResetToken]) while Prune runs. The result names the clients whose
// tokens kept rows back, with the age of their tokens. A shared client's (Config.Shared) tokens
// are the saved positions of its ranges, each counted for every row as a client's token is;
// its token-table row, which only gave its ranges their first position, no longer counts once
// they exist.
func Prune(ctx context.Context, db *sql.DB, opts PruneOptions) (PruneResult, error) {
	tables, err := opts.resolve()
	if err != nil {
		return PruneResult{}, err
	}
	cl := tables.cl
	if opts.BatchSize <= 0 {
		opts.BatchSize = DefaultPruneBatch
	}
	var res PruneResult
	tokens, err := pruneTokens(ctx, db, tables, opts, &res)
	if err != nil || len(tokens) == 0 || len(res.Unresolved) > 0 {
		return res, err
	}
	var args changelog.Params
	conds := opts.reach(args.Add)
	everyTable := false
	var tokenTables []string
	for _, t := range tokens {
		switch {
		case t.table == "":
			everyTable = true
		case opts.Table == "": // it holds back only the rows of its table
			tokenTables = append(tokenTables, t.table)
			other := args.Add(t.table)
			conds = append(conds, "(c.table_name <> "+other+" OR "+changelog.CertifiedBy(t.pos, args.Add)+")")
			continue
		}
		conds = append(conds, changelog.CertifiedBy(t.pos, args.Add))
	}
	if !everyTable && opts.Table == "" { // keep the rows of tables no token counts for
		slices.Sort(tokenTables)
		in := make([]string, 0, len(tokenTables))
		for _, table := range slices.Compact(tokenTables) {
			in = append(in, args.Add(table))
		}
		conds = append(conds, "c.table_name IN ("+strings.Join(in, ", ")+")")
	}
	where := strings.Join(conds, "\n\tAND ")
	if opts.DryRun {
		err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+cl+` c WHERE `+where, args...).Scan(&res.Deleted)
		if err != nil {
			return res, fmt.Errorf("count passed rows of changelog %s: %w", tables.changelog, err)
		}
	} else if err := deletePassed(ctx, db, tables, where, args, opts, &res); err != nil {
		return res, err
	}
	return res, findHolders(ctx, db, tables, opts, tokens, &res)
}

// reach returns the conditions, on changelog row c, of the rows Prune may delete whatever the
// tokens: old enough, and of Table when set.
func (opts PruneOptions) reach(arg func(any) string) []string {
	conds := []string{"c.changed_at < now() - make_interval(secs => " + arg(opts.OlderThan.Seconds()) + "::float8)"}
	if opts.Table != "" {
		conds = append(conds, "c.table_name = "+arg(opts.Table))
	}
	return conds
}

// restrictedTokensSQL reads changelog.RestrictedTokens of the token table $1.
var restrictedTokensSQL = `SELECT ` + changelog.RestrictedTokens("to_regclass($1)")

// pruneTokens returns the tokens that count for the rows Prune may delete: all but the ignored
// ones and, with Table set, those of other tables. A shared client's tokens are those of its
// ranges, each counted as a client's token is; its token-table row, which only gave the ranges
// their first position, does not count once they exist. It adds their clients to res.Clients, or to
// res.Unresolved for those whose row is gone.
func pruneTokens(ctx context.Context, db *sql.DB, tables resolved, opts PruneOptions, res *PruneResult) ([]pruneToken, error) {
	var restricted bool
	if err := db.QueryRowContext(ctx, restrictedTokensSQL, tables.tok).Scan(&restricted); err != nil {
		return nil, fmt.Errorf("read the policies of token table %s: %w", tables.tokens, err)
	}
	if restricted {
		return nil, fmt.Errorf(changelog.RestrictedTokensMessage, tables.tokens)
	}
	saved, err := ListTokens(ctx, db, opts.Options)
	if err != nil {
		return nil, err
	}
	shared, err := listShared(ctx, db, tables)
	if err != nil {
		return nil, err
	}
	type labeled struct {
		SavedToken
		label  string // the client, and the range of a shared client's, for messages
		ranged bool
	}
	var all []labeled
	for _, t := range saved {
		if !slices.ContainsFunc(shared, func(c SharedClient) bool { return c.Client == t.Client && len(c.Ranges) > 0 }) {
			all = append(all, labeled{t, t.Client, false})
		}
	}
	for _, c := range shared {
		for _, r := range c.Ranges {
			all = append(all, labeled{SavedToken{Client: c.Client, Token: r.Token, UpdatedAt: r.UpdatedAt}, rangeLabel(c.Client, r.Range), true})
		}
	}
	var out []pruneToken
	for _, t := range all {
		if slices.Contains(opts.IgnoreClients, t.Client) {
			continue
		}
		pos, table, rowGone, err := loadSavedToken(ctx, db, tables, t.Token)
		if opts.Table != "" && table != "" && table != opts.Table {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("client %s: %w", t.label, err)
		}
		if rowGone {
			res.Unresolved = appendNew(res.Unresolved, t.Client)
			continue
		}
		res.Clients = appendNew(res.Clients, t.Client)
		out = append(out, pruneToken{SavedToken: t.SavedToken, pos: pos, table: table, ranged: t.ranged})
	}
	return out, nil
}

// appendNew appends s unless it is already the last element (a shared client's ranges come
// one after the other).
func appendNew(list []string, s string) []string {
	if len(list) > 0 && list[len(list)-1] == s {
		return list
	}
	return append(list, s)
}

// deletePassed deletes the rows matching where, in batches.
func deletePassed(ctx context.Context, db *sql.DB, tables resolved, where string, args changelog.Params, opts PruneOptions, res *PruneResult) error {
	del := `WITH doomed AS (SELECT c.id FROM ` + tables.cl + ` c WHERE ` + where + ` ORDER BY c.id LIMIT ` +
		strconv.Itoa(opts.BatchSize) + `)
	DELETE FROM ` + tables.cl + ` WHERE id IN (SELECT id FROM doomed)`
	for {
		r, err := db.ExecContext(ctx, del, args...)
		if err != nil {
			return fmt.Errorf("delete passed rows of changelog %s: %w", tables.changelog, err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return err
		}
		res.Deleted += n
		res.Batches++
		if opts.Progress != nil {
			opts.Progress(res.Deleted)
		}
		if n < int64(opts.BatchSize) {
			return nil
		}
	}
}

// findHolders counts, for each token, the rows in reach of the prune that it has not passed,
// and lists the tokens that kept some in res.Holders.
func findHolders(ctx context.Context, db *sql.DB, tables resolved, opts PruneOptions, tokens []pruneToken, res *PruneResult) error {
	for _, t := range tokens {
		var args changelog.Params
		conds := opts.reach(args.Add)
		if t.table != "" && opts.Table == "" {
			conds = append(conds, "c.table_name = "+args.Add(t.table))
		}
		h := PruneHolder{Client: t.Client, Table: t.table, SavedAt: t.UpdatedAt}
		var (
			now time.Time
			err error
		)
		h.Rows, _, now, err = changelog.CountNotCertified(ctx, db, tables.cl, t.pos, conds, args)
		if err != nil {
			return fmt.Errorf("count the rows client %s holds back in changelog %s: %w", t.Client, tables.changelog, err)
		}
		if h.Rows == 0 {
			continue
		}
		if !h.SavedAt.IsZero() {
			h.Age = now.Sub(h.SavedAt)
		}
		if i := slices.IndexFunc(res.Holders, func(o PruneHolder) bool { return o.Client == h.Client }); t.ranged && i >= 0 {
			if h.Rows > res.Holders[i].Rows { // a shared client: its range the furthest behind
				res.Holders[i] = h
			}
			continue
		}
		res.Holders = append(res.Holders, h)
	}
	slices.SortStableFunc(res.Holders, func(a, b PruneHolder) int { return cmp.Compare(b.Rows, a.Rows) })
	return nil
}

// lookUpTokenRow returns the legacy position of an id-only token, whose changed_at is its row's
// (read by the rowTime query); sql.ErrNoRows if the row is gone.
func lookUpTokenRow(ctx context.Context, db *sql.DB, rowTime string, id int64) (Position, error) {
	var ts time.Time
	if err := db.QueryRowContext(ctx, rowTime, id).Scan(&ts); err != nil {
		return Position{}, err
	}
	return position.Make(ts, id), nil
}
