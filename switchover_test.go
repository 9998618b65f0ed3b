package pgchangestream

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/pgchangestream/pgchangestream/schema"
	"github.com/stretchr/testify/require"
)

// The switch-over from the legacy schema to the upgraded one: schema.Install upgrades an existing
// changelog online, and a client resumes from its legacy token without skipping a row and without
// replaying what it had acknowledged.

// idsAtOrBefore returns the ids of the items changelog rows at or before a legacy saved token
// (its timestamp and eventID), in the order of the ids.
func (e *liveEnv) idsAtOrBefore(token string) []int64 {
	e.t.Helper()
	return e.queryIDs(e.db, `SELECT id FROM datastore_changelog WHERE table_name = 'items'
		AND (changed_at, id) <= (($1::jsonb->>'timestamp')::timestamptz, ($1::jsonb->>'eventID')::bigint)
		ORDER BY id`, token)
}

// rawToken returns the client's saved token as the JSON text stored.
func (e *liveEnv) rawToken(client string) string {
	e.t.Helper()
	var raw string
	require.NoError(e.t, e.db.QueryRow(`SELECT resume_token::text FROM resume_tokens WHERE client_name = $1`, client).Scan(&raw))
	return raw
}

// upgradeWriters is how many writers run during an upgrade, and how long each holds its
// transactions open.
const (
	upgradeWriters = 4
	upgradeHold    = 10 * time.Millisecond
)

// TestLiveSwitchOver proves rule 11 across the upgrade, in every mode: a watcher on the legacy
// schema delivers rows and the client acknowledges some of them (the token is saved in legacy
// form); the watcher stops; writers start and keep committing while schema.Install upgrades the
// schema; then the watcher restarts. Every committed row is delivered (the unacknowledged ones of
// the first run again: at-least-once), and no row at or before the saved legacy token is
// delivered again.
func TestLiveSwitchOver(t *testing.T) {
	runModes(t, allModes, newLegacy, func(t *testing.T, e *liveEnv, mode Mode) {
		ctx := context.Background()
		ids := e.insert(10)
		w := e.start(e.fromBeginning(mode))
		require.Equal(t, ids, receiveWithin(t, w, len(ids), liveWait))
		require.NoError(t, w.MarkProcessed(ctx, tok(ids[5])))
		require.NoError(t, w.Close(ctx))
		token := e.rawToken("c")
		var fields map[string]any
		require.NoError(t, json.Unmarshal([]byte(token), &fields))
		require.ElementsMatch(t, []string{"timestamp", "eventID", "table"}, slices.Collect(maps.Keys(fields)), "a legacy token: %s", token)
		acked := e.idsAtOrBefore(token)
		require.Equal(t, ids[:6], acked)

		writers := e.startWriters(upgradeWriters, upgradeHold)
		time.Sleep(200 * time.Millisecond)
		require.NoError(t, errOf(schema.Install(ctx, e.db, schema.Options{})))
		time.Sleep(200 * time.Millisecond)
		got := newDeliveries()
		got.consume(t, e.start(e.config(mode)))
		time.Sleep(300 * time.Millisecond)
		writers.stop()
		require.Zero(t, writers.errs, "writer errors: %v", writers.lastErr)
		require.Less(t, writers.maxBlock, time.Second, "a writer was blocked by the upgrade")

		all := e.idsInOrder()
		require.Greater(t, len(all), len(ids), "the writers committed rows")
		var after []int64
		for _, id := range all {
			if !slices.Contains(acked, id) {
				after = append(after, id)
			}
		}
		got.requireAll(t, after, liveWait, "after the switch-over")
		for _, id := range acked {
			require.Zero(t, got.count(id), "row %d, acknowledged before the upgrade, was delivered again", id)
		}
		t.Logf("%d rows after the saved token, %d deliveries after the restart", len(after), got.total())
	})
}

// schemaState describes the changelog's columns with their defaults, its indexes with their
// validity, the trigger function and the items triggers: what an schema.Install run may change.
func (e *liveEnv) schemaState() []string {
	e.t.Helper()
	rows, err := e.db.Query(`
		SELECT 'column ' || attname || ' ' || format_type(atttypid, atttypmod) || ' default '
		       || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
		FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attrelid = 'datastore_changelog'::regclass AND a.attnum > 0 AND NOT a.attisdropped
		UNION ALL
		SELECT 'index ' || pg_get_indexdef(indexrelid) || ' valid ' || indisvalid
		FROM pg_index WHERE indrelid = 'datastore_changelog'::regclass
		UNION ALL
		SELECT 'function ' || oid::regprocedure || ' ' || md5(prosrc) FROM pg_proc WHERE proname = 'log_table_changes'
		UNION ALL
		SELECT 'trigger ' || tgname || ' ' || tgfoid::regprocedure FROM pg_trigger
		WHERE tgrelid = 'items'::regclass AND NOT tgisinternal
		ORDER BY 1`)
	require.NoError(e.t, err)
	defer rows.Close()
	var state []string
	for rows.Next() {
		var line string
		require.NoError(e.t, rows.Scan(&line))
		state = append(state, line)
	}
	require.NoError(e.t, rows.Err())
	return state
}

// TestLiveUpgradePopulatedLegacySchema proves the upgrade's promises on a populated legacy
// changelog while writers run: schema.Install returns nil, no writer fails or waits a second, the
// table is not rewritten, the transaction-id and unit columns are added, the first filled for
// new rows, the unit index and the coordination tables are built, and a second run changes
// nothing.
func TestLiveUpgradePopulatedLegacySchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLegacy(t)
	require.NoError(t, e.writeBulk(4, 5000))
	filenode := pgtest.Scalar[int64](t, e.db, `SELECT pg_relation_filenode('datastore_changelog')`)

	writers := e.startWriters(upgradeWriters, upgradeHold)
	time.Sleep(200 * time.Millisecond)
	began := time.Now()
	require.NoError(t, errOf(schema.Install(ctx, e.db, schema.Options{})))
	took := time.Since(began)
	time.Sleep(200 * time.Millisecond)
	writers.stop()
	t.Logf("upgrade of 20,000 rows took %v; %d rows written meanwhile, longest writer wait %v",
		took, writers.committed(), writers.maxBlock)
	require.Zero(t, writers.errs, "writer errors: %v", writers.lastErr)
	require.Less(t, writers.maxBlock, time.Second, "a writer was blocked by the upgrade")
	require.Equal(t, filenode, pgtest.Scalar[int64](t, e.db, `SELECT pg_relation_filenode('datastore_changelog')`),
		"the table was rewritten")
	require.Equal(t, "xid8", pgtest.Scalar[string](t, e.db, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = 'datastore_changelog'::regclass AND attname = 'txid'`))
	e.insert(1)
	require.Positive(t, pgtest.Scalar[int](t, e.db, `SELECT count(*) FROM datastore_changelog WHERE txid IS NOT NULL`),
		"new rows get a transaction id")
	require.Equal(t, pgtest.WantSharedState("(record_id)::text"), pgtest.SharedState(t, e.db),
		"the unit column, the unit index (valid) and the coordination tables")

	upgraded := e.schemaState()
	require.NoError(t, errOf(schema.Install(ctx, e.db, schema.Options{})))
	require.Equal(t, upgraded, e.schemaState(), "a second run is a no-op")
}

// TestLiveRunningWatcherSwitchesOver proves that a watcher started on a legacy changelog
// switches over to snapshot deltas by itself once schema.Install upgrades the changelog while it
// runs: it saves a switch-over token, and from then on, even in polling mode, a row that
// commits behind rows already read is delivered.
func TestLiveRunningWatcherSwitchesOver(t *testing.T) {
	t.Parallel()
	e := newLegacy(t)
	w := e.start(e.config(ModePolling))
	waitStartSaved(t, w)
	before := e.insert(2)
	require.Equal(t, before, receiveWithin(t, w, 2, liveWait))
	require.NoError(t, w.MarkProcessed(context.Background(), tok(before[1])))
	require.NoError(t, errOf(schema.Install(context.Background(), e.db, schema.Options{})))
	require.Eventually(t, func() bool {
		var raw string
		require.NoError(t, e.db.QueryRow(`SELECT resume_token::text FROM resume_tokens WHERE client_name = 'c'`).Scan(&raw))
		return strings.Contains(raw, `"switchover"`) || strings.Contains(raw, `"snapshot"`)
	}, 3*upgradeCheckInterval, 20*time.Millisecond, "the running watcher saves a switch-over")

	txA := e.openTx()
	a := insertItem(t, txA)
	b := e.insert(1)[0]
	require.Equal(t, []int64{b}, receiveWithin(t, w, 1, liveWait))
	require.NoError(t, txA.Commit())
	require.Equal(t, []int64{a}, receiveWithin(t, w, 1, liveWait), "the row that committed behind b")
}

// TestLiveSwitchOverWhileMarkerHeldBack proves that a watcher switching over in place while the
// processed-flag marker is held back (its UPDATE waits on a row lock) goes on working: the
// marker's next pass after the switch-over, from a legacy position to one inside a delta, does
// not take the process down, every row is delivered, and once the lock is released the flag is
// set on every certified row.
func TestLiveSwitchOverWhileMarkerHeldBack(t *testing.T) {
	t.Parallel()
	e := newLegacy(t)
	ctx := context.Background()
	cfg := e.config(ModePolling)
	cfg.ProcessedFlag = true
	w := e.start(cfg)
	waitStartSaved(t, w)
	ids := e.insert(2)
	require.Equal(t, ids, receiveWithin(t, w, 2, liveWait))
	require.NoError(t, errOf(schema.Install(ctx, e.db, schema.Options{}))) // noticed upgradeCheckInterval after the start
	lock := e.openTx()
	_, err := lock.Exec(`SELECT FROM datastore_changelog WHERE id = $1 FOR UPDATE`, ids[1])
	require.NoError(t, err)
	require.NoError(t, w.MarkProcessed(ctx, tok(ids[1])))
	require.NotContains(t, e.rawToken("c"), `"snapshot"`, "saved before the watcher switched over")
	waitFor(t, func() bool {
		var n int
		return e.db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND query LIKE 'UPDATE "datastore_changelog" SET processed%'`).Scan(&n) == nil && n == 1
	}, "the marker waits on the row lock")
	require.Eventually(t, func() bool {
		raw := e.rawToken("c")
		return strings.Contains(raw, `"switchover"`) || strings.Contains(raw, `"snapshot"`)
	}, 3*upgradeCheckInterval, 20*time.Millisecond, "the running watcher switches over")
	after := e.insert(3)
	require.Equal(t, after, receiveWithin(t, w, 3, liveWait))
	require.NoError(t, w.MarkProcessed(ctx, tok(after[2])), "a save inside a delta")
	require.Contains(t, e.rawToken("c"), `"snapshot"`)
	require.NoError(t, lock.Rollback())
	all := append(ids, after...)
	waitFor(t, func() bool {
		var n int
		return e.db.QueryRow(`SELECT count(*) FROM datastore_changelog WHERE id = ANY($1) AND processed`, all).Scan(&n) == nil &&
			n == len(all)
	}, "the flag is set on every certified row")
	more := e.insert(1)
	require.Equal(t, more, receiveWithin(t, w, 1, liveWait), "the watcher still delivers")
	require.NoError(t, w.Health())
}
