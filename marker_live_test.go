package pgchangestream

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/pgchangestream/pgchangestream/internal/marker"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// TestLiveMarkerCatchesUpAfterCrash proves rule 12 across a crash: rows acknowledged just
// before the watcher stops without marking them (their token was saved, then the process was
// gone before its marker ran) are flagged by the next watcher of the client once it has loaded
// that token, and rows the token does not certify are not. The first watcher's marker is held
// back by a row lock, then the watcher is abandoned (Start's context ends, it is never Closed,
// so no final pass runs). Both schema states, and the existing schema with its partial resume
// index; and an exclusive client, whose successor catches up once it holds the lock.
func TestLiveMarkerCatchesUpAfterCrash(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       func(*testing.T) *liveEnv
		exclusive bool
	}{{"upgraded", newLive, false}, {"legacy", newLiveWithoutTxid, false}, {"existing schema", newLegacy, false},
		{"upgraded exclusive", newLive, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := tc.env(t)
			cfg := e.config(ModePolling)
			cfg.ProcessedFlag, cfg.Exclusive = true, tc.exclusive
			ctx, crash := context.WithCancel(context.Background())
			first := e.startCtx(ctx, cfg)
			waitStartSaved(t, first)
			ids := e.insert(6)
			require.Equal(t, ids, receiveWithin(t, first, 6, liveWait))
			lock := e.openTx()
			_, err := lock.Exec(`SELECT FROM datastore_changelog WHERE id = $1 FOR UPDATE`, ids[0])
			require.NoError(t, err)
			require.NoError(t, first.MarkProcessed(context.Background(), tok(ids[3])))
			markerWaits := func() bool { // runs on waitFor's goroutine: no t.FailNow
				var n int
				return e.db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
					AND wait_event_type = 'Lock' AND query LIKE 'UPDATE "datastore_changelog" SET processed%'`).Scan(&n) == nil && n == 1
			}
			waitFor(t, markerWaits, "the marker waits on the row lock")
			crash()
			waitFor(t, func() bool { // cancelled with Start's context
				var n int
				return e.db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
					AND state = 'active' AND query LIKE 'UPDATE "datastore_changelog" SET processed%'`).Scan(&n) == nil && n == 0
			}, "the marker's statement ends")
			requireClosed(t, first)
			require.NoError(t, lock.Rollback())
			count := func(cond string) int {
				var n int
				require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog WHERE id = ANY($1) AND `+cond, ids).Scan(&n))
				return n
			}
			require.Zero(t, count(`processed`), "the crash left the acknowledged rows unmarked")
			raw := e.rawToken("c")

			second := e.start(cfg)
			waitFor(t, func() bool { return count(`processed`) == 4 }, "the rows the loaded token certifies are marked")
			require.Equal(t, ids[4:], receiveWithin(t, second, 2, liveWait), "delivered again: not acknowledged")
			require.NoError(t, second.Close(context.Background()))
			require.Equal(t, 4, count(`processed AND id <= `+strconv.FormatInt(ids[3], 10)), "exactly the certified rows")
			require.Zero(t, e.markedNotCertified(raw), "the flag never leads the loaded token")
			require.Zero(t, e.markedNotCertified(e.rawToken("c")), "nor the token saved since")
		})
	}
}

// TestLiveCatchUpReadsTheRowsNotMarked proves that the catch-up after a load costs about the rows
// not marked, not the changelog: on a changelog of 50,000 marked rows of the table and of
// another table, the selection of its first page reads a few buffers, through a partial index
// of the rows not marked, and finds exactly the rows the loaded token certifies that are not
// marked. Both schema states, and the existing schema with its partial resume index.
func TestLiveCatchUpReadsTheRowsNotMarked(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  func(*testing.T) *liveEnv
	}{{"upgraded", newLive}, {"legacy", newLiveWithoutTxid}, {"existing schema", newLegacy}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := tc.env(t)
			pgtest.Exec(t, e.db, `INSERT INTO items (n) SELECT g FROM generate_series(1, 50000) g`)
			pgtest.Exec(t, e.db, `INSERT INTO datastore_changelog (table_name, record_id, operation)
				SELECT 'other', gen_random_uuid(), 'INSERT' FROM generate_series(1, 50000) g`)
			pgtest.Exec(t, e.db, `UPDATE datastore_changelog SET processed = TRUE`)
			unmarked := e.insert(3)
			pgtest.Exec(t, e.db, `VACUUM ANALYZE datastore_changelog`)
			cfg := e.config(ModePolling)
			cfg.ProcessedFlag = true
			w, err := New(cfg)
			require.NoError(t, err)
			require.NoError(t, w.load(t.Context())) // a new client: its start certifies every row
			loaded := w.Stats().Checkpoint
			ahead := e.insert(2)
			q, args := marker.NewStatements(w.cfg.ChangelogTable).CatchUpStatement(w.cfg.TableName, loaded, loaded, Position{})
			plan, buffers := explainWatcherRead(t, w, q, args...)
			require.Less(t, buffers, 50, "reads the rows not marked, not the changelog:\n%s", plan)
			require.Regexp(t, `Index Scan using idx_changelog_(unprocessed|resume) `, plan, "a partial index of the rows not marked")
			rows, err := e.db.QueryContext(t.Context(), q, args...) // the page, as the marker selects it
			require.NoError(t, err)
			var ids []int64
			for rows.Next() {
				var last Position
				require.NoError(t, rows.Scan(&last.ID, &last.ChangedAt))
				ids = append(ids, last.ID)
			}
			require.NoError(t, rows.Err())
			require.NoError(t, rows.Close())
			slices.Sort(ids)
			require.Equal(t, unmarked, ids, "the certified rows not marked, not the rows after the token %v", ahead)
		})
	}
}
