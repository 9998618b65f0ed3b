package pgchangestream

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/admin"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// consumeTable reads every row of table as client (from the beginning, batch rows per read),
// acknowledges ack (0: nothing) and closes the watcher, leaving its saved token.
func (e *liveEnv) consumeTable(client, table string, n, batch int, ack int64) {
	e.t.Helper()
	cfg := e.fromBeginning(ModePolling)
	cfg.ClientName, cfg.TableName, cfg.BatchSize = client, table, batch
	w, err := New(cfg)
	require.NoError(e.t, err)
	w.Start(context.Background())
	require.Len(e.t, receiveWithin(e.t, w, n, liveWait), n)
	if ack > 0 {
		require.NoError(e.t, w.MarkProcessed(context.Background(), tok(ack)))
	}
	require.NoError(e.t, w.Close(context.Background()))
}

// saveRawToken saves a token as another watcher, or a tool, wrote it.
func (e *liveEnv) saveRawToken(client, token string) {
	e.t.Helper()
	pgtest.Exec(e.t, e.db, `INSERT INTO resume_tokens (client_name, resume_token) VALUES ($1, $2::jsonb)`, client, token)
}

// pruneScene fills the changelog with rows of two tables, some of them two hours old, and saves
// tokens of every form, each certifying rows the others do not: a snapshot and switch-overs
// (saved by watchers of either table), a position inside a delta, an earlier release's position
// in (txid, id) order, a switch-over whose snapshot misses a row before its position, a legacy
// position and an id-only one without a table (they count for every table), and extra tokens
// as given. One row, late, commits after every snapshot the tokens hold but the last.
func (e *liveEnv) pruneScene(extra map[string]string) {
	e.t.Helper()
	e.captureQuiet()
	items := e.insert(10)
	pgtest.Exec(e.t, e.db, `UPDATE datastore_changelog SET changed_at = changed_at - interval '2 hours' WHERE id <= $1`, items[5])
	for range 6 {
		pgtest.Exec(e.t, e.db, `INSERT INTO quiet DEFAULT VALUES`)
	}
	quiet := e.queryIDs(e.db, `SELECT id FROM datastore_changelog WHERE table_name = 'quiet' ORDER BY id`)
	late := e.openTx()
	insertItem(e.t, late)
	before := e.snapshot()
	bulk := e.insertBulk(12)
	after := e.snapshot()
	var bulkXid string
	require.NoError(e.t, e.db.QueryRow(`SELECT txid::text FROM datastore_changelog WHERE id = $1`, bulk[0]).Scan(&bulkXid))
	e.consumeTable("all", liveTable, 22, 100, bulk[11])     // a snapshot: everything committed
	e.consumeTable("in-delta", liveTable, 22, 4, bulk[5])   // a switch-over from the beginning
	e.consumeTable("early", liveTable, 22, 100, items[3])   // the same, earlier
	e.consumeTable("quiet-client", "quiet", 6, 2, quiet[2]) // of the other table
	require.NoError(e.t, late.Commit())
	more := e.insert(5)
	token := func(id int64, fields string) string {
		p := e.position(id)
		return fmt.Sprintf(`{"timestamp": %q, "eventID": %d%s}`, p.ChangedAt.Format(time.RFC3339Nano), id, fields)
	}
	e.saveRawToken("in-rows", token(bulk[5], fmt.Sprintf(`, "snapshot": %q, "deltaEnd": %q, "deltaAfterID": %d, "table": "items"`,
		before, after, bulk[5])))
	e.saveRawToken("older-delta", token(bulk[7], fmt.Sprintf(`, "snapshot": %q, "deltaEnd": %q, "deltaXid": %q, "deltaID": %d, "table": "items"`,
		before, after, bulkXid, bulk[7])))
	e.saveRawToken("switch", token(bulk[0], fmt.Sprintf(`, "switchover": %q, "table": "items"`, before)))
	e.saveRawToken("legacy", token(more[0], ""))
	e.saveRawToken("id-only", fmt.Sprintf(`{"eventID": %d}`, more[1]))
	for client, token := range extra {
		e.saveRawToken(client, token)
	}
}

// heldBack returns the ids of the rows a saved token that counts for a prune of only (every
// table if empty), without the ignored clients, has not certified: those it must keep (all of
// them for an id-only token whose row is gone).
func (e *liveEnv) heldBack(only string, ignore []string) []int64 {
	e.t.Helper()
	tokens, err := admin.ListTokens(context.Background(), e.db, admin.Options{})
	require.NoError(e.t, err)
	var ids []int64
	for _, st := range tokens {
		p, table, err := position.DecodeTableToken([]byte(st.Token))
		if slices.Contains(ignore, st.Client) || (only != "" && table != "" && table != only) {
			continue
		}
		if err != nil { // id only
			var ts time.Time
			if e.db.QueryRow(`SELECT changed_at FROM datastore_changelog WHERE id = $1`, p.ID).Scan(&ts) != nil {
				return e.queryIDs(e.db, `SELECT id FROM datastore_changelog ORDER BY id`) // its row is gone: all of them
			}
			p = position.Make(ts, p.ID)
		}
		var args changelog.Params
		cond := "(" + changelog.CertifiedBy(p, args.Add) + ") IS NOT TRUE"
		if table != "" {
			cond += " AND c.table_name = " + args.Add(table)
		}
		ids = append(ids, e.queryIDs(e.db, `SELECT c.id FROM datastore_changelog c WHERE `+cond, args...)...)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// TestLivePruneFunctionDeletesWhatPruneDeletes proves that the SQL retention function installed
// by schema.Install deletes exactly the rows admin.Prune deletes, on the same changelog and tokens
// (several clients of two tables, with tokens of every form), with each token alone and all of
// them, with and without a table, an age and ignored clients, in small batches; that neither
// deletes a row a counting token has not certified; and that a token whose row is gone holds
// everything back.
func TestLivePruneFunctionDeletesWhatPruneDeletes(t *testing.T) {
	t.Parallel()
	type pruneCase struct {
		name     string
		opts     admin.PruneOptions
		extra    map[string]string
		deletes  bool
		keepsAll bool
		refused  string // the error of both
	}
	clients := []string{"all", "in-delta", "early", "quiet-client", "in-rows", "older-delta", "switch", "legacy", "id-only"}
	var alone []pruneCase // each token alone decides
	for _, c := range clients {
		others := slices.DeleteFunc(slices.Clone(clients), func(o string) bool { return o == c })
		alone = append(alone, pruneCase{name: "only " + c, opts: admin.PruneOptions{IgnoreClients: others}, deletes: true})
	}
	for _, tc := range append(alone, []pruneCase{
		{name: "every table", opts: admin.PruneOptions{BatchSize: 3}, deletes: true},
		{name: "one table", opts: admin.PruneOptions{Table: liveTable}, deletes: true},
		{name: "the other table", opts: admin.PruneOptions{Table: "quiet"}, deletes: true},
		{name: "ignored clients", opts: admin.PruneOptions{IgnoreClients: []string{"legacy", "id-only", "early", "switch"}, BatchSize: 5},
			deletes: true},
		{name: "older than an hour", opts: admin.PruneOptions{OlderThan: time.Hour}, deletes: true},
		{name: "a token whose row is gone", extra: map[string]string{"gone": `{"eventID": 99999999}`}, keepsAll: true},
		{name: "an unreadable token", extra: map[string]string{"bad": `{"eventID": "x", "timestamp": "2025-01-02T03:04:05Z"}`},
			refused: "eventID"},
		{name: "a token field in other case", extra: map[string]string{"bad": `{"eventID": 1, "Snapshot": "1:1:"}`},
			refused: "Snapshot"},
	}...) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newLive(t)
			e.pruneScene(tc.extra)
			all := `SELECT id FROM datastore_changelog ORDER BY id`
			before := e.queryIDs(e.db, all)
			held := e.heldBack(tc.opts.Table, tc.opts.IgnoreClients)

			tx, err := e.db.Begin()
			require.NoError(t, err)
			var n int64
			var only any
			if tc.opts.Table != "" {
				only = tc.opts.Table
			}
			batch := cmpOrDefault(tc.opts.BatchSize, changelog.DefaultPruneBatch)
			err = tx.QueryRow(`SELECT datastore_changelog_prune($1::interval, $2, $3::text, $4::text[])`,
				fmt.Sprintf("%d seconds", int64(tc.opts.OlderThan.Seconds())), batch, only,
				"{"+strings.Join(tc.opts.IgnoreClients, ",")+"}").Scan(&n)
			if tc.refused != "" {
				require.ErrorContains(t, err, tc.refused)
				require.NoError(t, tx.Rollback())
				_, err := admin.Prune(ctx, e.db, tc.opts)
				require.ErrorIs(t, err, ErrInvalidSavedToken, "admin.Prune refuses it too")
				require.Equal(t, before, e.queryIDs(e.db, all))
				return
			}
			require.NoError(t, err)
			bySQL := e.queryIDs(tx, all)
			require.NoError(t, tx.Rollback())

			res, err := admin.Prune(ctx, e.db, tc.opts)
			require.NoError(t, err)
			byGo := e.queryIDs(e.db, all)
			require.Equal(t, byGo, bySQL, "the function keeps what admin.Prune keeps")
			require.Equal(t, res.Deleted, n)
			require.Equal(t, int64(len(before)-len(bySQL)), n, "it returns the rows it deleted")
			for _, id := range held {
				require.Contains(t, bySQL, id, "row %d is not certified by every token that counts for it", id)
			}
			if tc.deletes {
				require.Positive(t, n, "something is deleted")
				require.NotEmpty(t, held, "something is held back")
			}
			if tc.keepsAll {
				require.Equal(t, before, bySQL)
				require.NotEmpty(t, res.Unresolved)
			}
		})
	}
}

// cmpOrDefault returns v, or def when v is not positive.
func cmpOrDefault(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}
