package pgchangestream

import (
	"context"
	"database/sql"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// explainWatcherRead returns the EXPLAIN (ANALYZE, BUFFERS) text of the watcher's read q, run
// the way the watcher runs its reads, and the shared buffers its top node touched. With costs,
// the text says whether the plan was compiled (JIT).
func explainWatcherRead(t *testing.T, w *Watcher, q string, args ...any) (string, int) {
	t.Helper()
	var lines []string
	err := w.read(t.Context(), `EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, SUMMARY OFF) `+q, func(rows *sql.Rows) error {
		defer rows.Close()
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				return err
			}
			lines = append(lines, line)
		}
		return rows.Err()
	}, args...)
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	m := regexp.MustCompile(`Buffers: shared hit=(\d+)`).FindStringSubmatch(plan)
	require.NotNil(t, m, plan)
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return plan, n
}

// TestLiveReadPlansWithoutStatistics proves that the watcher's reads keep their index range plans
// whatever the changelog's statistics: on a changelog never analyzed (no statistics at all,
// autovacuum kept off), on one analyzed while empty (which leaves none either), and right after
// a burst of 50,000 rows into an analyzed one, of the same table or of a table the statistics
// have never seen. Each read of a batch (legacy, switch-over and delta reads, the late-row lookup
// and a listed delta's rows) touches a handful of buffers, not the whole backlog; the id list of
// a large delta reads its range whole, by index. Once statistics exist the reads are planned
// from them again, with the same plans. It runs on a server of its own: snapshots are
// cluster-wide, and other tests' commits would move them.
func TestLiveReadPlansWithoutStatistics(t *testing.T) {
	t.Parallel()
	srv := pgtest.NewServer(t, pgtest.Options{})
	for _, tc := range []struct {
		name   string
		before string // run on the empty changelog, before the burst
	}{
		{"never analyzed", ``},
		{"analyzed empty", `ANALYZE datastore_changelog`},
		{"burst after ANALYZE", `INSERT INTO items (n) SELECT g FROM generate_series(1, 1000) g; ANALYZE datastore_changelog`},
		{"burst of a new table after ANALYZE", `INSERT INTO datastore_changelog (table_name, record_id, operation)
			SELECT 'other', g::text, 'INSERT' FROM generate_series(1, 1000) g; ANALYZE datastore_changelog`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e := newLiveOn(t, srv)
			pgtest.Exec(t, e.db, `ALTER TABLE datastore_changelog SET (autovacuum_enabled = false)`)
			if tc.before != "" {
				pgtest.Exec(t, e.db, tc.before)
			}
			b := e.snapshot()
			for range 5 {
				pgtest.Exec(t, e.db, `INSERT INTO items (n) SELECT g FROM generate_series(1, 10000) g`)
			}
			end := e.snapshot()
			w, err := New(e.config(ModePolling))
			require.NoError(t, err)
			require.NoError(t, w.load(ctx))
			requireIndexPlans(t, e, w, b, end)

			pgtest.Exec(t, e.db, `ANALYZE datastore_changelog`)
			require.NoError(t, w.load(ctx))
			requireIndexPlans(t, e, w, b, end)
		})
	}
}

// requireIndexPlans checks the plans of the watcher's reads of the 50,000-row delta from b to end
// (and of the same rows by legacy position).
func requireIndexPlans(t *testing.T, e *liveEnv, w *Watcher, b, end position.Snapshot) {
	t.Helper()
	var (
		ts      any
		id, one int64
	)
	require.NoError(t, e.db.QueryRow(`SELECT changed_at, id FROM datastore_changelog WHERE table_name = $1
		ORDER BY changed_at, id OFFSET 100 LIMIT 1`, liveTable).Scan(&ts, &id))
	require.NoError(t, e.db.QueryRow(`SELECT max(id) FROM datastore_changelog`).Scan(&one))
	stream := `Index Scan using datastore_changelog_stream_idx on datastore_changelog`
	txid := `Index (Only )?Scan using datastore_changelog_txid_unit_idx on datastore_changelog`
	lo, loID, hi, hiID := changelog.RangeArrays(position.DeltaRanges(b, end))
	for _, r := range []struct {
		name, q, index string
		maxBuffers     int
		args           []any
		bitmapOK       bool // it reads its index range whole anyway
		byKey          bool // by primary key: run as it is (queryByKey)
	}{
		{"read", w.q.Read, stream, 20, []any{liveTable, ts, id}, false, false},
		{"switchRead", w.q.SwitchRead, stream, 20, []any{liveTable, ts, id, end.String()}, false, false},
		{"deltaRead", w.q.DeltaRead, txid, 20, []any{liveTable, lo, loID, hi, hiID, end.String(), int64(position.MinID)}, false, false},
		// A listed delta's rows: by primary key, at most a batch of ids (or the key range of a
		// batch of consecutive ids), whatever the plan's shape.
		{"deltaRows", w.q.DeltaRows, `(Bitmap Index Scan on|Index Scan using) datastore_changelog_pkey`, 10,
			[]any{changelog.Array([]int64{one - 1, one})}, true, true},
		{"deltaKeyRange", w.q.DeltaKeyRange, `(Bitmap Index Scan on|Index Scan using) datastore_changelog_pkey`, 10,
			[]any{one - 1, one}, true, true},
		{"byID", w.q.ByID, `Index Scan using datastore_changelog_pkey on datastore_changelog`, 10, []any{liveTable, one}, false, true},
		// The id list of a delta larger than a batch reads the delta whole (50,000 index entries):
		// an index range scan, or a bitmap of one.
		{"deltaIDs", w.q.DeltaIDs, `(Bitmap Index Scan on|Index (Only )?Scan using) datastore_changelog_txid_unit_idx`, 2000,
			[]any{liveTable, lo, loID, hi, hiID, end.String(), int64(position.MinID)}, true, false},
	} {
		explain := func() (string, int) { return explainWatcherRead(t, w, r.q, r.args...) }
		if r.byKey {
			explain = func() (string, int) { return explainLive(t, e, r.q, r.args...) }
		}
		plan, buffers := explain()
		require.Regexp(t, r.index, plan, r.name)
		if !r.bitmapOK {
			require.NotContains(t, plan, "Bitmap", r.name)
		}
		require.NotContains(t, plan, "Seq Scan", r.name)
		require.NotContains(t, plan, "JIT", "%s: compiled:\n%s", r.name, plan)
		require.LessOrEqual(t, buffers, r.maxBuffers, "%s:\n%s", r.name, plan)
	}
	if rs := position.DeltaRanges(b, end); len(rs) == 1 {
		plan, buffers := explainWatcherRead(t, w, w.q.DeltaRange, liveTable, strconv.FormatUint(rs[0].Lo, 10), rs[0].LoID,
			strconv.FormatUint(rs[0].Hi, 10), rs[0].HiID, end.String(), int64(position.MinID))
		require.Regexp(t, `^Limit.*\n.*\n  ->  `+txid, plan, "deltaRange: no sort")
		require.LessOrEqual(t, buffers, 20, "deltaRange:\n%s", plan)
	}
}
