package pgchangestream

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

var txTS = time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)

// txWatcher is a loaded watcher of an upgraded changelog resumed inside the delta from
// snapshot 100:105: to 106:106:, after its row 1, with its rows 2, 3 and 4 (of transaction
// 105) delivered (seqs 1, 2, 3) and not acknowledged.
func txWatcher(t *testing.T) (*Watcher, sqlmock.Sqlmock, *sql.DB) {
	t.Helper()
	db, mock := mockDB(t)
	cfg := testConfig(Config{})
	cfg.DB = db
	w, err := New(cfg)
	require.NoError(t, err)
	expectUpgradedLoad(w, mock, "106:106:", nil, savedTokenRows(string(position.EncodeToken(txPos(t, 1), "t"))))
	require.NoError(t, w.load(context.Background()))
	mock.ExpectQuery(w.q.DeltaRange).WithArgs("t", "104", int64(position.MaxID), "105", int64(position.MaxID), "106:106:", int64(1)).
		WillReturnRows(sqlmock.NewRows(deltaCols).
			AddRow(int64(2), "r2", "INSERT", nil, []byte(`{"a":1}`), txTS, "105").
			AddRow(int64(3), "r3", "INSERT", nil, []byte(`{"a":1}`), txTS, "105").
			AddRow(int64(4), "r4", "INSERT", nil, []byte(`{"a":1}`), txTS, "105"))
	n, err := w.readBatch(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, n)
	return w, mock, db
}

// loadLegacy loads w, a watcher of a legacy changelog, resumed after row 1.
func loadLegacy(t *testing.T, w *Watcher, mock sqlmock.Sqlmock) {
	t.Helper()
	expectLegacyChangelog(mock)
	mock.ExpectQuery(wantLoad).WithArgs("c").WillReturnRows(savedTokenRows(string(position.EncodeToken(position.Make(txTS, 1), "t"))))
	require.NoError(t, w.load(context.Background()))
}

// txPos is the position in txWatcher's delta past its rows up to id.
func txPos(t *testing.T, id int64) Position {
	s := &position.Span{Seq: 1, Base: mustSnapshot(t, "100:105:"), End: mustSnapshot(t, "106:106:"), HasEnd: true}
	return Position{ChangedAt: txTS, ID: id, Xid: 105, Span: s, InRows: true}
}

// markedToken is the token a watcher writes for p with its marker of seq.
func markedToken(w *Watcher, p Position, seq uint64) string {
	return string(appendAck(position.EncodeToken(p, "t"), w.instance, seq))
}

func ackRows(instance any, seq any) *sqlmock.Rows {
	return sqlmock.NewRows([]string{"w", "seq"}).AddRow(instance, seq)
}

func begin(t *testing.T, mock sqlmock.Sqlmock, db *sql.DB) *sql.Tx {
	t.Helper()
	mock.ExpectBegin()
	tx, err := db.Begin()
	require.NoError(t, err)
	t.Cleanup(func() { // end a transaction the test left open (a no-op after Commit or Rollback)
		mock.ExpectRollback()
		_ = tx.Rollback()
	})
	return tx
}

func TestMarkProcessedTxCommit(t *testing.T) {
	ctx := context.Background()
	w, mock, db := txWatcher(t)
	before := ackStats(w)
	tx := begin(t, mock, db)
	p3 := txPos(t, 3) // acking row 3 leaves row 4 pending
	mock.ExpectExec(w.q.AckTx[0]).WithArgs("c", markedToken(w, p3, 2)).WillReturnResult(sqlmock.NewResult(0, 1))
	require.NoError(t, w.MarkProcessedTx(ctx, tx, tok(3)))
	require.Equal(t, before, ackStats(w), "nothing is acknowledged in memory before the commit")
	mock.ExpectCommit()
	require.NoError(t, tx.Commit())

	// The next save learns of the committed acknowledgement, applies it, and saves with it.
	mock.ExpectQuery(w.q.ReadAck).WithArgs("c").WillReturnRows(ackRows(w.instance, "2"))
	mock.ExpectExec(w.q.AckSave[0]).WithArgs("c", markedToken(w, p3, 2)).WillReturnResult(sqlmock.NewResult(0, 1))
	require.NoError(t, w.Flush(ctx))
	st := w.Stats()
	require.Equal(t, uint64(2), st.Acked, "the committed acknowledgement is in memory after the next save")
	require.Equal(t, p3, st.Checkpoint)
	require.NoError(t, mock.ExpectationsWereMet())
}

func TestMarkProcessedTxRollbackLeavesNothing(t *testing.T) {
	ctx := context.Background()
	w, mock, db := txWatcher(t)
	before := ackStats(w)
	tx := begin(t, mock, db)
	mock.ExpectExec(w.q.AckTx[0]).WithArgs("c", sqlmock.AnyArg()).WillReturnResult(sqlmock.NewResult(0, 1))
	require.NoError(t, w.MarkProcessedTx(ctx, tx, tok(4)))
	mock.ExpectRollback()
	require.NoError(t, tx.Rollback())

	// The token still holds the marker of an earlier save (none of this watcher's): the save
	// finds no acknowledgement and has nothing new to write.
	mock.ExpectQuery(w.q.ReadAck).WithArgs("c").WillReturnRows(ackRows(nil, nil))
	require.NoError(t, w.Flush(ctx))
	require.Equal(t, before, ackStats(w), "a rolled-back acknowledgement changes nothing")
	require.NoError(t, mock.ExpectationsWereMet())
}

// Two transactions acknowledge rows 2 and 4; the later acknowledgement commits first. The
// earlier one's write then affects no row, and it succeeds: the later one certifies it.
func TestMarkProcessedTxCommitsInTheOppositeOrder(t *testing.T) {
	ctx := context.Background()
	w, mock, db := txWatcher(t)
	later := begin(t, mock, db)
	mock.ExpectExec(w.q.AckTx[0]).WithArgs("c", markedToken(w, w.cursorForTest(), 3)).WillReturnResult(sqlmock.NewResult(0, 1))
	require.NoError(t, w.MarkProcessedTx(ctx, later, tok(4)))
	mock.ExpectCommit()
	require.NoError(t, later.Commit())

	earlier := begin(t, mock, db)
	mock.ExpectExec(w.q.AckTx[0]).WithArgs("c", markedToken(w, txPos(t, 2), 1)).
		WillReturnResult(sqlmock.NewResult(0, 0))
	mock.ExpectQuery(w.q.ReadAck).WithArgs("c").WillReturnRows(ackRows(w.instance, "3"))
	require.NoError(t, w.MarkProcessedTx(ctx, earlier, tok(2)))
	require.NoError(t, mock.ExpectationsWereMet())
}

// While a transaction that acknowledged holds the token row, an own save fails at once
// without waiting for it; once it committed, a save computed before it landed writes nothing
// over it: it applies the committed marker and saves again with it.
func TestOwnSaveNeverOverwritesACommittedTxAck(t *testing.T) {
	ctx := context.Background()
	w, mock, db := txWatcher(t)
	tx := begin(t, mock, db)
	cursor := w.cursorForTest()
	mock.ExpectExec(w.q.AckTx[0]).WithArgs("c", markedToken(w, cursor, 3)).WillReturnResult(sqlmock.NewResult(0, 1))
	require.NoError(t, w.MarkProcessedTx(ctx, tx, tok(4)))

	p2 := txPos(t, 2)
	mock.ExpectQuery(w.q.ReadAck).WithArgs("c").WillReturnRows(ackRows(nil, nil)) // not committed yet
	mock.ExpectExec(w.q.AckSave[0]).WithArgs("c", markedToken(w, p2, 1)).
		WillReturnError(&pgconn.PgError{Code: changelog.LockNotAvailable, Message: "could not obtain lock on row"})
	err := w.MarkProcessed(ctx, tok(2))
	require.ErrorIs(t, err, errTokenLocked)
	require.NoError(t, w.Health(), "a row held by a caller's transaction is no fault of the database's")
	require.Equal(t, uint64(1), w.Stats().Acked, "the acknowledgement in memory is kept")
	mock.ExpectCommit()
	require.NoError(t, tx.Commit())

	mock.ExpectQuery(w.q.ReadAck).WithArgs("c").WillReturnRows(ackRows(nil, nil)) // read before the commit landed
	mock.ExpectExec(w.q.AckSave[0]).WithArgs("c", markedToken(w, p2, 1)).WillReturnResult(sqlmock.NewResult(0, 0))
	mock.ExpectQuery(w.q.ReadAck).WithArgs("c").WillReturnRows(ackRows(w.instance, "3"))
	mock.ExpectExec(w.q.AckSave[0]).WithArgs("c", markedToken(w, cursor, 3)).WillReturnResult(sqlmock.NewResult(0, 1))
	require.NoError(t, w.Flush(ctx))
	require.Equal(t, uint64(3), w.Stats().Acked)
	require.Equal(t, cursor, w.Stats().Checkpoint)
	require.NoError(t, mock.ExpectationsWereMet())
}

func TestMarkProcessedTxUnknownTokenWritesTheCurrentCheckpoint(t *testing.T) {
	ctx := context.Background()
	w, mock, db := txWatcher(t)
	w.ack(2) // in memory only, as a batched MarkProcessed does
	tx := begin(t, mock, db)
	p3 := txPos(t, 2)
	for _, token := range [][]byte{nil, tok(99), tok(2)} { // empty, unknown, already acknowledged
		mock.ExpectExec(w.q.AckTx[0]).WithArgs("c", markedToken(w, p3, 1)).WillReturnResult(sqlmock.NewResult(0, 1))
		require.NoError(t, w.MarkProcessedTx(ctx, tx, token))
	}
	require.Equal(t, uint64(1), w.Stats().Acked, "they acknowledge nothing")
	require.NoError(t, mock.ExpectationsWereMet())
}

func TestMarkProcessedTxRefusals(t *testing.T) {
	ctx := context.Background()
	t.Run("invalid token", func(t *testing.T) {
		w, mock, db := txWatcher(t)
		tx := begin(t, mock, db)
		require.ErrorIs(t, w.MarkProcessedTx(ctx, tx, []byte("x")), ErrInvalidToken)
		require.NoError(t, mock.ExpectationsWereMet(), "nothing is written")
	})
	t.Run("nil transaction", func(t *testing.T) {
		w, _, _ := txWatcher(t)
		require.ErrorContains(t, w.MarkProcessedTx(ctx, nil, tok(2)), "nil")
	})
	t.Run("ephemeral", func(t *testing.T) {
		db, mock := mockDB(t)
		w, err := New(testConfig(Config{DB: db, Ephemeral: true}))
		require.NoError(t, err)
		tx := begin(t, mock, db)
		require.ErrorContains(t, w.MarkProcessedTx(ctx, tx, tok(2)), "ephemeral")
		require.NoError(t, mock.ExpectationsWereMet())
	})
	t.Run("legacy changelog", func(t *testing.T) {
		w, mock := newMockWatcher(t, Config{})
		loadLegacy(t, w, mock)
		tx := begin(t, mock, w.cfg.DB)
		err := w.MarkProcessedTx(ctx, tx, tok(2))
		require.ErrorIs(t, err, ErrLegacyChangelog)
		require.ErrorContains(t, err, "schema.Install", "the error says how to upgrade")
		require.NoError(t, mock.ExpectationsWereMet(), "nothing is written")
	})
	t.Run("not loaded", func(t *testing.T) {
		db, mock := mockDB(t)
		w, err := New(testConfig(Config{DB: db}))
		require.NoError(t, err)
		tx := begin(t, mock, db)
		require.ErrorContains(t, w.MarkProcessedTx(ctx, tx, tok(2)), "not loaded")
		require.NoError(t, mock.ExpectationsWereMet())
	})
}

// An ex-owner's transactional write affects no row: MarkProcessedTx says it is fenced off.
func TestMarkProcessedTxFenced(t *testing.T) {
	ctx := context.Background()
	w, mock, db := txWatcher(t)
	w.ckMu.Lock()
	w.fenced, w.epoch = true, 4
	w.ckMu.Unlock()
	tx := begin(t, mock, db)
	mock.ExpectExec(w.q.AckTx[1]).WithArgs("c", sqlmock.AnyArg(), int64(4)).WillReturnResult(sqlmock.NewResult(0, 0))
	mock.ExpectQuery(w.q.ReadAck).WithArgs("c").WillReturnRows(ackRows("another watcher", "7"))
	err := w.MarkProcessedTx(ctx, tx, tok(2))
	require.ErrorIs(t, err, ErrFenced)
	require.Zero(t, w.Stats().Acked)
	require.NoError(t, mock.ExpectationsWereMet())
}

// A transactional write of a position read before the server recovered affects no row.
func TestMarkProcessedTxIncarnationChanged(t *testing.T) {
	ctx := context.Background()
	db, mock := mockDB(t)
	w, err := New(testConfig(Config{DB: db}))
	require.NoError(t, err)
	expectIncarnationLoad(w, mock, "100:105:", "i1", savedDeltaToken)
	require.NoError(t, w.load(ctx))
	tx := begin(t, mock, db)
	mock.ExpectExec(w.q.AckTx[2]).WithArgs("c", sqlmock.AnyArg(), "i1").WillReturnResult(sqlmock.NewResult(0, 0))
	mock.ExpectQuery(w.q.ReadAck).WithArgs("c").WillReturnRows(ackRows(nil, nil))
	err = w.MarkProcessedTx(ctx, tx, nil)
	require.ErrorIs(t, err, ErrServerRecovered)
	require.True(t, w.rewindAsked.Load(), "the reader goes back to the saved token")
	require.NoError(t, mock.ExpectationsWereMet())
}

// ackStats is Stats without the lag, which moves with the clock.
func ackStats(w *Watcher) Stats {
	s := w.Stats()
	s.Lag = 0
	return s
}

func (w *Watcher) cursorForTest() Position {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cursor
}
