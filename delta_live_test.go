package pgchangestream

import (
	"context"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// explainDeltaRead returns the EXPLAIN (ANALYZE, BUFFERS) text of the watcher's query q (the
// first page of a delta, or the list of its ids) for the delta from b to end, with its ranges as
// arrays, and the shared buffers its top node touched.
func explainDeltaRead(t *testing.T, e *liveEnv, q string, b, end position.Snapshot) (string, int) {
	t.Helper()
	lo, loID, hi, hiID := changelog.RangeArrays(position.DeltaRanges(b, end))
	return explainLive(t, e, q, liveTable, lo, loID, hi, hiID, end.String(), int64(position.MinID))
}

// explainLive returns the EXPLAIN (ANALYZE, BUFFERS) text of q and the shared buffers its top node
// touched.
func explainLive(t *testing.T, e *liveEnv, q string, args ...any) (string, int) {
	t.Helper()
	plan := pgtest.Explain(t, e.db, `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF) `+q, args...)
	m := regexp.MustCompile(`Buffers: shared hit=(\d+)`).FindStringSubmatch(plan)
	require.NotNil(t, m, plan)
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return plan, n
}

func (e *liveEnv) snapshot() position.Snapshot {
	e.t.Helper()
	var text string
	require.NoError(e.t, e.db.QueryRow(`SELECT pg_current_snapshot()::text`).Scan(&text))
	s, err := position.ParseSnapshot(text)
	require.NoError(e.t, err)
	return s
}

// TestLiveDeltaReadPlans proves that delta reads stay cheap however old the oldest open
// transaction is: with a write transaction open since before 100,000 rows committed, the first
// page of a delta holding one new row is an index range scan of (table_name, txid, id) with both
// keys in the index condition, touching a handful of buffers; so is the list of its ids, which a
// delta larger than a page takes, and its pages are then read by primary key. When the old
// transaction commits, its rows are one more such range. An idle poll, whose snapshot did not
// change, reads nothing at all. It runs on a server of its own: snapshots are cluster-wide, and
// other tests' commits would move them.
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
	require.True(t, position.EmptyDelta(b, e.snapshot()), "an idle poll: no read at all")
	one := e.insert(1)[0]
	end := e.snapshot()
	require.True(t, b.Running(oldXid), "the old transaction is open in both snapshots")
	require.True(t, end.Running(oldXid))
	require.Less(t, oldXid, b.Xmin+1)
	rangeScan := `Index (Only )?Scan using datastore_changelog_txid_unit_idx on datastore_changelog`
	rangeCond := `Index Cond: .*\(ROW\(txid, id\) > ROW\(r\.lo, r\.lo_id\)\) AND \(ROW\(txid, id\) <= ROW\(r\.hi, r\.hi_id\)\)`
	plan, buffers := explainDeltaRead(t, e, w.q.DeltaRead, b, end)
	require.Regexp(t, rangeScan, plan)
	require.Regexp(t, rangeCond, plan)
	require.NotContains(t, plan, "Seq Scan")
	require.NotContains(t, plan, "Bitmap")
	require.LessOrEqual(t, buffers, 20, "one new row behind a transaction open since 100,000 rows ago:\n%s", plan)
	// The id list reads each range whole, then sorts: an index range scan, or a bitmap of one.
	plan, buffers = explainDeltaRead(t, e, w.q.DeltaIDs, b, end)
	require.Regexp(t, `(Bitmap Index Scan on|Index (Only )?Scan using) datastore_changelog_txid_unit_idx`, plan)
	require.Regexp(t, rangeCond, plan)
	require.NotContains(t, plan, "Seq Scan")
	require.LessOrEqual(t, buffers, 20, "the id list of one new row:\n%s", plan)

	r := position.DeltaRanges(b, end)
	require.Len(t, r, 1, "no transaction of the base ended: one range, read by deltaRange")
	plan, buffers = explainLive(t, e, w.q.DeltaRange, liveTable, strconv.FormatUint(r[0].Lo, 10), r[0].LoID,
		strconv.FormatUint(r[0].Hi, 10), r[0].HiID, end.String(), int64(position.MinID))
	require.Regexp(t, `^Limit.*\n.*\n  ->  Index Scan using datastore_changelog_txid_unit_idx on datastore_changelog`, plan)
	require.Regexp(t, `Index Cond: .*\(ROW\(txid, id\) > ROW\(.*\)\) AND \(ROW\(txid, id\) <= ROW\(.*\)\)`, plan)
	require.NotContains(t, plan, "Sort")
	require.LessOrEqual(t, buffers, 20, plan)

	plan, buffers = explainLive(t, e, w.q.DeltaRows, changelog.Array([]int64{one}))
	require.Regexp(t, `Index Scan using datastore_changelog_pkey on datastore_changelog`, plan, "pages of a listed delta, by primary key")
	require.LessOrEqual(t, buffers, 10, plan)

	require.NoError(t, long.Commit())
	next := e.snapshot()
	require.Equal(t, []uint64{oldXid}, position.FinishedBy(end, next), "the old transaction is looked up once, where it ends")
	plan, buffers = explainDeltaRead(t, e, w.q.DeltaRead, end, next)
	require.Regexp(t, rangeScan, plan)
	require.LessOrEqual(t, buffers, 20, "the old transaction's one row:\n%s", plan)
}

// TestLiveListedPageByKeyRange proves that a page of a listed delta whose ids are consecutive
// (a backlog of one captured table) is read as one primary-key range, touching about the
// buffers of a legacy page, rather than by one index descent per id; and that a page with gaps
// (rows of another table between) still returns exactly its rows.
func TestLiveListedPageByKeyRange(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	w, err := New(e.config(ModePolling))
	require.NoError(t, err)
	_, err = e.db.Exec(`INSERT INTO items (n) SELECT g FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	_, err = e.db.Exec(`ANALYZE datastore_changelog`)
	require.NoError(t, err)
	var ids []int64
	rows, err := e.db.Query(`SELECT id FROM datastore_changelog WHERE table_name = $1 ORDER BY id`, liveTable)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	require.Len(t, ids, 20000)
	page := ids[10000:10100]
	require.Equal(t, page[0]+99, page[99], "one statement's rows have consecutive ids")

	q, args := w.rowsByIDQuery(page)
	plan, buffers := explainLive(t, e, q, args...)
	require.Regexp(t, `Index Scan using datastore_changelog_pkey on datastore_changelog`, plan)
	require.LessOrEqual(t, buffers, 12, "a page of 100 consecutive ids:\n%s", plan)
	got, err := w.rowsByID(context.Background(), page, nil)
	require.NoError(t, err)
	require.Equal(t, page, rowIDs(got))

	gaps := append(slices.Clone(ids[100:150]), ids[160:210]...)
	got, err = w.rowsByID(context.Background(), gaps, nil)
	require.NoError(t, err)
	require.Equal(t, gaps, rowIDs(got), "the ids in the gap are not on the page")
}

// rowIDs returns the ids of rows, in order.
func rowIDs(rows []changelogRow) []int64 {
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	return ids
}
