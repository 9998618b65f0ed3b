package marker

import (
	"context"
	"database/sql/driver"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// testBundle is a marker on sqlmock, with what its watcher saved set by the test.
type testBundle struct {
	m    *Marker
	mock sqlmock.Sqlmock

	mu     sync.Mutex
	saved  Saved
	passed int // passes reported as succeeded
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	b := &testBundle{mock: mock}
	b.m = New(Config{
		DB: db, ChangelogTable: changelog.DefaultChangelogTable, TableName: "t",
		Logger: slog.New(slog.DiscardHandler),
		Saved: func() Saved {
			b.mu.Lock()
			defer b.mu.Unlock()
			return b.saved
		},
		Report: Report{
			Passed: func() {
				b.mu.Lock()
				defer b.mu.Unlock()
				b.passed++
			},
			Panicked: func(r any) error { return errors.New("panic") },
			Retrying: func(error, time.Duration) {},
			Resumed:  func() {},
		},
	})
	return b
}

// save records p as the watcher's saved position.
func (b *testBundle) save(p position.Position) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.saved = Saved{Position: p, Loaded: true}
}

func (b *testBundle) passes() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.passed
}

// expectCatchUp expects the first page of the catch-up after loading loaded, with saved as the
// saved position, which finds rows ids (changed_at ts), and their marking.
func (b *testBundle) expectCatchUp(loaded, saved position.Position, ts time.Time, ids ...int64) {
	q, args := b.m.q.CatchUpStatement("t", loaded, saved, position.Position{})
	rows := sqlmock.NewRows([]string{"id", "changed_at"})
	for _, id := range ids {
		rows.AddRow(id, ts)
	}
	values := make([]driver.Value, len(args))
	for i, a := range args {
		values[i] = a
	}
	b.mock.ExpectQuery(q).WithArgs(values...).WillReturnRows(rows)
	if len(ids) > 0 {
		b.mock.ExpectExec(b.m.q.MarkIDs).WithArgs(changelog.Array(ids)).WillReturnResult(sqlmock.NewResult(0, int64(len(ids))))
	}
}

// A pass that marks many rows splits them, in id order, into statements of contiguous ids that
// run at once; if one fails, the pass fails and the next one marks from the same position again.
func TestLargeMarkingPassRunsStatementsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
		b := setup(t)
		b.mock.MatchExpectationsInOrder(false) // the statements of a pass run at once
		n := markStatements * markChunk
		from, to := position.Make(ts, 0), position.Make(ts, int64(n))
		b.save(to)
		b.m.SetMarked(from)
		ids := make([]int64, n)
		for i := range ids {
			ids[i] = int64(n - i) // selected in (changed_at, id) order, which need not be id order
		}
		chunks := slices.Collect(slices.Chunk(slices.Sorted(slices.Values(ids)), markChunk))
		require.Len(t, chunks, markStatements)
		const took = time.Second // each statement's
		b.expectCatchUp(from, to, ts)
		pass := func(fail error) (time.Duration, error) {
			rows := sqlmock.NewRows([]string{"id"})
			for _, id := range ids {
				rows.AddRow(id)
			}
			b.mock.ExpectQuery(b.m.q.Legacy).WithArgs("t", ts, int64(0), ts, int64(n)).WillReturnRows(rows)
			for i, c := range chunks {
				e := b.mock.ExpectExec(b.m.q.MarkIDs).WithArgs(changelog.Array(c)).WillDelayFor(took)
				if i == 0 && fail != nil {
					e.WillReturnError(fail)
				} else {
					e.WillReturnResult(sqlmock.NewResult(0, int64(len(c))))
				}
			}
			start := time.Now()
			err := b.m.markSaved(context.Background())
			return time.Since(start), err
		}

		d, err := pass(errors.New("deadlock"))
		require.ErrorContains(t, err, "deadlock")
		require.Equal(t, took, d, "the pass waits for all its statements, which run at once")
		require.Equal(t, from, b.m.Marked(), "a failed pass marks nothing as done")
		d, err = pass(nil)
		require.NoError(t, err)
		require.Equal(t, took, d)
		require.Equal(t, to, b.m.Marked())
		require.NoError(t, b.mock.ExpectationsWereMet())
	})
}

// A row that the selection of a pass returns twice (the two parts of Switch can both select
// it), or out of id order, is updated once, in ascending id order.
func TestMarkingPassUpdatesEachRowOnce(t *testing.T) {
	ts := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
	b := setup(t)
	from, to := position.Make(ts, 0), position.Make(ts, 9)
	b.save(to)
	b.m.SetMarked(from)
	b.expectCatchUp(from, to, ts)
	rows := sqlmock.NewRows([]string{"id"}).AddRow(int64(7)).AddRow(int64(3)).AddRow(int64(7)).AddRow(int64(5))
	b.mock.ExpectQuery(b.m.q.Legacy).WithArgs("t", ts, int64(0), ts, int64(9)).WillReturnRows(rows)
	b.mock.ExpectExec(b.m.q.MarkIDs).WithArgs(changelog.Array([]int64{3, 5, 7})).WillReturnResult(sqlmock.NewResult(0, 3))
	require.NoError(t, b.m.markSaved(context.Background()))
	require.Equal(t, to, b.m.Marked())
	require.NoError(t, b.mock.ExpectationsWereMet())
}

// Before Start a save's rows are marked at once; while the marker goroutine runs a save only
// wakes it, and its pass marks them; after Stop they are marked at once again.
func TestAfterSaveWakesTheRunningMarker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
		b := setup(t)
		start := position.Make(ts, 1)
		b.save(start)
		b.m.SetMarked(start)
		b.expectCatchUp(start, position.Make(ts, 2), ts) // the first pass, with the first save
		mark := func(from, to int64) {
			b.save(position.Make(ts, to))
			b.mock.ExpectQuery(b.m.q.Legacy).WithArgs("t", ts, from, ts, to).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(to))
			b.mock.ExpectExec(b.m.q.MarkIDs).WithArgs(changelog.Array([]int64{to})).WillReturnResult(sqlmock.NewResult(0, 1))
		}
		mark(1, 2)
		b.m.AfterSave(context.Background())
		require.Equal(t, 1, b.passes(), "not started: marked at once")
		require.NoError(t, b.mock.ExpectationsWereMet())

		require.NoError(t, b.m.Start(context.Background()))
		require.Error(t, b.m.Start(context.Background()), "started twice")
		synctest.Wait() // the pass SetMarked asked for: nothing new to mark
		require.Equal(t, 2, b.passes())
		mark(2, 3)
		b.m.AfterSave(context.Background())
		require.Equal(t, 2, b.passes(), "started: the save only wakes the marker")
		time.Sleep(markInterval) // at most one pass per markInterval
		synctest.Wait()
		require.Equal(t, 3, b.passes(), "the marker goroutine's pass")
		require.Equal(t, position.Make(ts, 3), b.m.Marked())
		b.m.Stop()
		require.NoError(t, b.mock.ExpectationsWereMet())

		mark(3, 4)
		b.m.AfterSave(context.Background())
		require.Equal(t, 4, b.passes(), "stopped: marked at once")
		require.NoError(t, b.mock.ExpectationsWereMet())
	})
}
