package pgchangestreamtest

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream"
)

// mockTxs returns n open transactions of a sqlmock database, rolled back when the test ends.
func mockTxs(t *testing.T, n int) []*sql.Tx {
	t.Helper()
	db, mock, err := sqlmock.New()
	require.NoError(t, err)
	var txs []*sql.Tx
	for range n {
		mock.ExpectBegin()
		tx, err := db.Begin()
		require.NoError(t, err)
		txs = append(txs, tx)
	}
	for range n {
		mock.ExpectRollback()
	}
	for range n { // each open transaction holds a connection of its own
		mock.ExpectClose()
	}
	t.Cleanup(func() {
		for _, tx := range txs {
			require.NoError(t, tx.Rollback())
		}
		require.NoError(t, db.Close())
		require.NoError(t, mock.ExpectationsWereMet())
	})
	return txs
}

func TestFakeMarkProcessedTxAppliesOnlyOnCommit(t *testing.T) {
	ctx := t.Context()
	f := started(t, pgchangestream.Config{TableName: "orders"}, Insert("a", nil), Insert("b", nil), Insert("c", nil))
	toks := receive(t, f, 3)
	txs := mockTxs(t, 1)

	require.NoError(t, f.MarkProcessedTx(ctx, txs[0], []byte(toks[1])))
	require.Empty(t, f.Acked(), "nothing is acknowledged before the commit")
	require.Equal(t, 3, f.Stats().Pending)
	require.Zero(t, savedID(t, f), "the saved checkpoint is unchanged before the commit")

	f.Committed(txs[0])
	require.Equal(t, toks[:2], f.Acked(), "the commit certifies the delivery and every one before it")
	require.Equal(t, int64(2), savedID(t, f))
	st := f.Stats()
	require.Equal(t, 1, st.Pending)
	require.Equal(t, uint64(2), st.Acked)
	require.Empty(t, f.Marks(), "Marks lists MarkProcessed calls only")

	f.Committed(txs[0]) // ended already: nothing changes
	require.Equal(t, uint64(2), f.Stats().Acked)
}

func TestFakeMarkProcessedTxRollbackForgets(t *testing.T) {
	ctx := t.Context()
	f := started(t, pgchangestream.Config{TableName: "orders"}, Insert("a", nil), Insert("b", nil))
	toks := receive(t, f, 2)
	txs := mockTxs(t, 1)

	require.NoError(t, f.MarkProcessedTx(ctx, txs[0], []byte(toks[1])))
	f.RolledBack(txs[0])
	f.Committed(txs[0]) // after the rollback the tx has nothing to apply
	require.Empty(t, f.Acked())
	require.Equal(t, 2, f.Stats().Pending)
	require.Zero(t, savedID(t, f))

	require.NoError(t, f.MarkProcessed(ctx, []byte(toks[0])), "the deliveries stay pending for a later acknowledgement")
	require.Equal(t, toks[:1], f.Acked())
	require.Equal(t, int64(1), savedID(t, f))
}

// An earlier transaction committing after a later acknowledgement was saved does not move the
// checkpoint back.
func TestFakeMarkProcessedTxLateCommitKeepsLaterSave(t *testing.T) {
	ctx := t.Context()
	f := started(t, pgchangestream.Config{TableName: "orders"}, Insert("a", nil), Insert("b", nil), Insert("c", nil))
	toks := receive(t, f, 3)
	txs := mockTxs(t, 2)

	require.NoError(t, f.MarkProcessedTx(ctx, txs[0], []byte(toks[0])))
	require.NoError(t, f.MarkProcessedTx(ctx, txs[1], []byte(toks[2])))
	require.NoError(t, f.MarkProcessedTx(ctx, txs[0], []byte(toks[0])), "a second acknowledgement in a tx keeps its place")
	require.Equal(t, txs, f.OpenTxs(), "in the order of their first acknowledgement")
	f.Committed(txs[1])
	require.Equal(t, txs[:1], f.OpenTxs())
	require.Equal(t, int64(3), savedID(t, f))
	f.Committed(txs[0])
	require.Equal(t, int64(3), savedID(t, f), "the earlier transaction's write does not pass the later marker")
	require.Equal(t, toks, f.Acked())

	g := started(t, pgchangestream.Config{TableName: "orders"}, Insert("a", nil), Insert("b", nil))
	toks = receive(t, g, 2)
	tx := mockTxs(t, 1)[0]
	require.NoError(t, g.MarkProcessedTx(ctx, tx, []byte(toks[0])))
	require.NoError(t, g.MarkProcessed(ctx, []byte(toks[1])))
	g.Committed(tx)
	require.Equal(t, int64(2), savedID(t, g), "nor over a later save of MarkProcessed")
}

func TestFakeMarkProcessedTxErrors(t *testing.T) {
	ctx := t.Context()
	tx := mockTxs(t, 1)[0]

	idle := NewFakeWatcher(pgchangestream.Config{TableName: "orders"})
	require.ErrorContains(t, idle.MarkProcessedTx(ctx, tx, []byte("1")), "not started")

	eph := started(t, pgchangestream.Config{TableName: "orders", Ephemeral: true})
	require.ErrorContains(t, eph.MarkProcessedTx(ctx, tx, []byte("1")), "ephemeral")

	f := started(t, pgchangestream.Config{TableName: "orders"}, Insert("a", nil))
	toks := receive(t, f, 1)
	require.ErrorContains(t, f.MarkProcessedTx(ctx, nil, []byte(toks[0])), "nil")
	require.ErrorIs(t, f.MarkProcessedTx(ctx, tx, []byte("x1")), pgchangestream.ErrInvalidToken)
	disk := errors.New("disk full")
	f.FailSaves(disk)
	require.ErrorIs(t, f.MarkProcessedTx(ctx, tx, []byte(toks[0])), disk)
	f.FailSaves(nil)
	f.Committed(tx)
	require.Empty(t, f.Acked(), "a failed call records nothing")
	require.Equal(t, 1, f.Stats().Pending)

	require.NoError(t, f.MarkProcessedTx(ctx, tx, nil), "an empty token acknowledges nothing")
	f.Committed(tx)
	require.Empty(t, f.Acked())
	require.NoError(t, f.Close(context.Background()))
}
