package pgchangestream

import (
	"context"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// afterStart is the id a delta is read after from its start.
const afterStart = int64(position.MinID)

const savedDeltaToken = `{"timestamp":"2025-05-06T07:08:09Z","eventID":5,"snapshot":"100:105:"}`

// expectIncarnationLoad expects the load of an upgraded changelog with an incarnation table:
// the look for both, the current snapshot with its incarnation, and the token.
func expectIncarnationLoad(w *Watcher, mock sqlmock.Sqlmock, snapshot, inc, token string) {
	mock.ExpectQuery(wantDetect).WithArgs(`"datastore_changelog"`, `"datastore_changelog_incarnation"`).
		WillReturnRows(sqlmock.NewRows([]string{"skip_free", "incarnation", "stats"}).AddRow(true, true, true))
	mock.ExpectQuery(w.q.DeltaStartInc).WithArgs("t").
		WillReturnRows(sqlmock.NewRows([]string{"snapshot", "newest_txid", "incarnation"}).AddRow(snapshot, nil, inc))
	mock.ExpectQuery(wantLoad).WithArgs("c").WillReturnRows(savedTokenRows(token))
}

// expectSnapshotInc expects the snapshot taken at the start of a delta, with its incarnation.
func expectSnapshotInc(w *Watcher, mock sqlmock.Sqlmock, snapshot string, inc any) {
	mock.ExpectQuery(w.q.SnapshotInc).WillReturnRows(sqlmock.NewRows([]string{"s", "inc"}).AddRow(snapshot, inc))
}

// expectDeltaRows expects a one-range delta read after key (lo, loID) up to hi in end's
// visibility, of the rows with an id above after, returning rows with the given ids and txids.
func expectDeltaRows(mock sqlmock.Sqlmock, lo string, loID int64, hi, end string, after int64, ids []int64, xids []string) {
	rows := sqlmock.NewRows(deltaCols)
	ts := time.Date(2025, 5, 6, 7, 8, 10, 0, time.UTC)
	for i, id := range ids {
		rows.AddRow(id, "r", "INSERT", nil, []byte(`{"n":1}`), ts, xids[i])
	}
	mock.ExpectQuery(wantDeltaRange).WithArgs("t", lo, loID, hi, int64(position.MaxID), end, after).WillReturnRows(rows)
}

// readTwoRowsInIncarnationA loads a saved token in incarnation "A" and reads a delta of two
// rows (ids 6 and 7, txids 105 and 106) to its end.
func readTwoRowsInIncarnationA(t *testing.T) (*Watcher, sqlmock.Sqlmock) {
	t.Helper()
	ctx := context.Background()
	w, mock := newMockWatcher(t, Config{})
	expectIncarnationLoad(w, mock, "100:105:", "A", savedDeltaToken)
	require.NoError(t, w.load(ctx))
	expectSnapshotInc(w, mock, "100:108:", "A")
	expectDeltaRows(mock, "104", position.MaxID, "107", "100:108:", afterStart, []int64{6, 7}, []string{"105", "106"})
	n, err := w.readBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, "100:108:", w.Stats().Cursor.Span.Base.String(), "the delta was read to its end")
	return w, mock
}

// A snapshot whose incarnation differs from the one its delta started in (the server recovered
// from a crash): the watcher reloads the saved token, keeps its deliveries pending but held at
// that token, and reads the rows after the token again. Nothing is saved meanwhile.
func TestRewindWhenTheIncarnationChanges(t *testing.T) {
	ctx := context.Background()
	w, mock := readTwoRowsInIncarnationA(t)

	// After the crash the counter is back at 106: ids 106 and 107 are handed out again.
	expectSnapshotInc(w, mock, "106:109:", "B")
	expectIncarnationLoad(w, mock, "106:109:", "B", savedDeltaToken)
	_, err := w.readBatch(ctx)
	require.ErrorIs(t, err, errRewound)
	s := w.Stats()
	require.Equal(t, uint64(1), s.Rewinds)
	require.Equal(t, 2, s.Pending, "the deliveries stay pending")
	require.Equal(t, "100:105:", s.Cursor.Span.Base.String(), "reading starts again after the saved token")
	w.mu.Lock()
	p, ok := w.checkpointLocked()
	w.mu.Unlock()
	require.True(t, ok)
	require.True(t, unchanged(p, w.saved), "the checkpoint is held at the saved token: %s", p)

	// Acknowledging the first delivery saves nothing new: the token already certifies as much.
	require.NoError(t, w.MarkProcessed(ctx, tok(6)))
	require.NoError(t, mock.ExpectationsWereMet())

	// The next delta is read from the token's snapshot, in the new incarnation.
	expectSnapshotInc(w, mock, "106:109:", "B")
	expectDeltaRows(mock, "104", position.MaxID, "108", "106:109:", afterStart, []int64{8}, []string{"106"})
	n, err := w.readBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, mock.ExpectationsWereMet())
}

// A save of a position read in an older incarnation writes nothing, fails with
// ErrServerRecovered, keeps the acknowledgement, and has the reader rewind before its next read.
func TestSaveOfAnOlderIncarnationIsRefused(t *testing.T) {
	ctx := context.Background()
	w, mock := readTwoRowsInIncarnationA(t)
	var err error

	mock.ExpectExec(w.q.SaveTokenInc).WithArgs("c", sqlmock.AnyArg(), "A").WillReturnResult(sqlmock.NewResult(0, 0))
	err = w.MarkProcessed(ctx, tok(7))
	require.ErrorIs(t, err, ErrServerRecovered)
	require.True(t, w.rewindAsked.Load())
	require.Zero(t, w.Stats().Pending, "the acknowledgement is kept")

	expectIncarnationLoad(w, mock, "106:109:", "B", savedDeltaToken)
	expectSnapshotInc(w, mock, "106:109:", "B")
	expectDeltaRows(mock, "104", position.MaxID, "108", "106:109:", afterStart, nil, nil)
	_, err = w.readBatch(ctx)
	require.NoError(t, err)
	require.False(t, w.rewindAsked.Load())
	require.Equal(t, uint64(1), w.Stats().Rewinds)
	require.NoError(t, mock.ExpectationsWereMet())
}

// After a crash the incarnation row is missing: the first watcher to notice inserts it.
func TestIncarnationRowIsInsertedWhenMissing(t *testing.T) {
	ctx := context.Background()
	w, mock := newMockWatcher(t, Config{})
	expectIncarnationLoad(w, mock, "100:105:", "A", savedDeltaToken)
	require.NoError(t, w.load(ctx))
	expectSnapshotInc(w, mock, "100:105:", nil)
	mock.ExpectExec(w.q.ClaimIncarnation).WillReturnResult(sqlmock.NewResult(0, 1))
	expectSnapshotInc(w, mock, "100:105:", "B")
	expectIncarnationLoad(w, mock, "100:105:", "B", savedDeltaToken)
	_, err := w.readBatch(ctx)
	require.ErrorIs(t, err, errRewound, "the new incarnation is noticed")
	require.NoError(t, mock.ExpectationsWereMet())
}

// Without an incarnation table, a snapshot whose xmax went back is noticed all the same.
func TestRewindWhenXmaxGoesBack(t *testing.T) {
	ctx := context.Background()
	w, mock := newMockWatcher(t, Config{})
	expectUpgradedLoad(w, mock, "100:105:", nil, savedTokenRows(savedDeltaToken))
	require.NoError(t, w.load(ctx))
	mock.ExpectQuery(w.q.Snapshot).WillReturnRows(sqlmock.NewRows([]string{"s"}).AddRow("100:108:"))
	expectDeltaRows(mock, "104", position.MaxID, "107", "100:108:", afterStart, []int64{6}, []string{"105"})
	_, err := w.readBatch(ctx)
	require.NoError(t, err)

	mock.ExpectQuery(w.q.Snapshot).WillReturnRows(sqlmock.NewRows([]string{"s"}).AddRow("105:106:"))
	expectUpgradedLoad(w, mock, "105:106:", nil, savedTokenRows(savedDeltaToken))
	_, err = w.readBatch(ctx)
	require.ErrorIs(t, err, errRewound)
	require.Equal(t, 1, w.Stats().Pending)
	require.NoError(t, mock.ExpectationsWereMet())
}

func TestServerRecovered(t *testing.T) {
	base := &position.Span{Seq: 2, Base: position.Snapshot{Xmin: 100, Xmax: 110}, Inc: "A"}
	require.Empty(t, serverRecovered(base, position.Snapshot{Xmin: 100, Xmax: 110}, "A"))
	require.Empty(t, serverRecovered(base, position.Snapshot{Xmin: 105, Xmax: 120}, "A"))
	require.NotEmpty(t, serverRecovered(base, position.Snapshot{Xmin: 105, Xmax: 120}, "B"), "a new incarnation, even with the counter ahead")
	require.NotEmpty(t, serverRecovered(base, position.Snapshot{Xmin: 100, Xmax: 109}, "A"), "xmax went back")
	bare := &position.Span{Seq: 2, Base: position.Snapshot{Xmin: 100, Xmax: 110}}
	require.Empty(t, serverRecovered(bare, position.Snapshot{Xmin: 100, Xmax: 111}, ""))
	require.NotEmpty(t, serverRecovered(bare, position.Snapshot{Xmin: 100, Xmax: 105}, ""))
}

// A fenced save (an exclusive watcher's) of a position read in an older incarnation also writes
// nothing; the watcher tells that apart from being fenced off by a successor, which stops it.
func TestFencedSaveTellsARecoveryFromAFence(t *testing.T) {
	for _, tc := range []struct {
		name      string
		sameInc   bool
		want      error
		wantStops bool
	}{
		{"server recovered", false, ErrServerRecovered, false},
		{"fenced off", true, ErrFenced, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			w, mock := readTwoRowsInIncarnationA(t)
			w.fenced, w.epoch = true, 4 // as claimed at the load
			mock.ExpectExec(w.q.SaveFencedInc).WithArgs("c", sqlmock.AnyArg(), int64(4), "A").
				WillReturnResult(sqlmock.NewResult(0, 0))
			mock.ExpectQuery(w.q.IncarnationIs).WithArgs("A").
				WillReturnRows(sqlmock.NewRows([]string{"same"}).AddRow(tc.sameInc))
			err := w.MarkProcessed(ctx, tok(7))
			require.ErrorIs(t, err, tc.want)
			require.Equal(t, !tc.wantStops, w.rewindAsked.Load(), "a recovery has the reader rewind")
			require.Equal(t, tc.wantStops, w.excl.lostErr() != nil, "being fenced off stops the watcher")
			require.NoError(t, mock.ExpectationsWereMet())
		})
	}
}
