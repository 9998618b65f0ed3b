package pgchangestream

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/pgtest"
)

// explainDeltaRead returns the EXPLAIN (ANALYZE, BUFFERS) text of the watcher's delta read of
// the delta from b to end, with its ranges as arrays, and the shared buffers its top node touched.
func explainDeltaRead(t *testing.T, e *liveEnv, w *Watcher, b, end pgSnapshot) (string, int) {
	t.Helper()
	lo, loID, hi, hiID := rangeArgs(deltaRanges(b, end, 0, 0))
	return explainLive(t, e, w.q.deltaRead, liveTable, lo, loID, hi, hiID, end.String())
}

// explainLive returns the EXPLAIN (ANALYZE, BUFFERS) text of q and the shared buffers its top node
// touched.
func explainLive(t *testing.T, e *liveEnv, q string, args ...any) (string, int) {
	t.Helper()
	plan := explain(t, e.db, `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF) `+q, args...)
	m := regexp.MustCompile(`Buffers: shared hit=(\d+)`).FindStringSubmatch(plan)
	require.NotNil(t, m, plan)
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return plan, n
}

func (e *liveEnv) snapshot() pgSnapshot {
	e.t.Helper()
	var text string
	require.NoError(e.t, e.db.QueryRow(`SELECT pg_current_snapshot()::text`).Scan(&text))
	s, err := parseSnapshot(text)
	require.NoError(e.t, err)
	return s
}

// TestLiveDeltaReadPlans proves that delta reads stay cheap however old the oldest open
// transaction is: with a write transaction open since before 100,000 rows committed, the read
// of a delta holding one new row is an index range scan of (table_name, txid, id) with both keys
// in the index condition, touching a handful of buffers; when the old transaction commits, its
// rows are one more such range. An idle poll, whose snapshot did not change, reads nothing at all.
// It runs on a server of its own: snapshots are cluster-wide, and other tests' commits would move
// them.
func TestLiveDeltaReadPlans(t *testing.T) {
	t.Parallel()
	e := newLiveOn(t, pgtest.NewServer(t, pgtest.Options{}))
	w, err := New(e.config(ModePolling))
	require.NoError(t, err)
	long := e.openTx()
	insertItem(t, long)
	var oldXid uint64
	require.NoError(t, long.QueryRow(`SELECT pg_current_xact_id()::text`).Scan(&oldXid))
	for range 10 {
		_, err := e.db.Exec(`INSERT INTO items (n) SELECT g FROM generate_series(1, 10000) g`)
		require.NoError(t, err)
	}
	_, err = e.db.Exec(`ANALYZE datastore_changelog`)
	require.NoError(t, err)

	b := e.snapshot()
	require.True(t, emptyDelta(b, e.snapshot()), "an idle poll: no read at all")
	e.insert(1)
	end := e.snapshot()
	require.True(t, b.running(oldXid), "the old transaction is open in both snapshots")
	require.True(t, end.running(oldXid))
	require.Less(t, oldXid, b.xmin+1)
	plan, buffers := explainDeltaRead(t, e, w, b, end)
	require.Regexp(t, `Index (Only )?Scan using datastore_changelog_txid_idx on datastore_changelog`, plan)
	require.Regexp(t, `Index Cond: .*\(ROW\(txid, id\) > ROW\(r\.lo, r\.lo_id\)\) AND \(ROW\(txid, id\) <= ROW\(r\.hi, r\.hi_id\)\)`, plan)
	require.NotContains(t, plan, "Seq Scan")
	require.NotContains(t, plan, "Bitmap")
	require.LessOrEqual(t, buffers, 20, "one new row behind a transaction open since 100,000 rows ago:\n%s", plan)

	r := deltaRanges(b, end, 0, 0)
	require.Len(t, r, 1, "no transaction of the base ended: one range, read by deltaRange")
	plan, buffers = explainLive(t, e, w.q.deltaRange, liveTable, strconv.FormatUint(r[0].lo, 10), r[0].loID,
		strconv.FormatUint(r[0].hi, 10), r[0].hiID, end.String())
	require.Regexp(t, `^Limit.*\n.*\n  ->  Index Scan using datastore_changelog_txid_idx on datastore_changelog`, plan)
	require.Regexp(t, `Index Cond: .*\(ROW\(txid, id\) > ROW\(.*\)\) AND \(ROW\(txid, id\) <= ROW\(.*\)\)`, plan)
	require.NotContains(t, plan, "Sort")
	require.LessOrEqual(t, buffers, 20, plan)

	require.NoError(t, long.Commit())
	next := e.snapshot()
	require.Equal(t, []uint64{oldXid}, finishedBy(end, next), "the old transaction is looked up once, where it ends")
	plan, buffers = explainDeltaRead(t, e, w, end, next)
	require.Regexp(t, `Index (Only )?Scan using datastore_changelog_txid_idx on datastore_changelog`, plan)
	require.LessOrEqual(t, buffers, 20, "the old transaction's one row:\n%s", plan)
}
