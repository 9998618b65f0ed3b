package pgchangestream

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"
)

// claimIn claims id in a new transaction of w's database and returns the open transaction.
func claimIn(t *testing.T, e *liveEnv, w *Watcher, id int64) (*sql.Tx, bool, error) {
	t.Helper()
	tx := e.openTx()
	claimed, err := w.claimAck(context.Background(), tx, id, false)
	return tx, claimed, err
}

// ackRows returns the changelog ids of client's acknowledgement rows, in order.
func (e *liveEnv) ackRows(client string) []int64 {
	e.t.Helper()
	return e.queryIDs(e.db, `SELECT changelog_id FROM datastore_changelog_acks WHERE client_name = $1 ORDER BY 1`, client)
}

func TestLiveAckClaimOnceAndInParallel(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	ids := e.insert(3)
	cfg := e.config(ModePolling)
	cfg.StartFromBeginning = true
	w := e.start(cfg)
	require.Equal(t, ids, receiveWithin(t, w, 3, liveWait))

	a, claimed, err := claimIn(t, e, w, ids[0])
	require.NoError(t, err)
	require.True(t, claimed)
	// A second event's claim does not wait for the first's open transaction.
	b, claimed, err := claimIn(t, e, w, ids[1])
	require.NoError(t, err)
	require.True(t, claimed)
	require.NoError(t, b.Rollback())
	require.NoError(t, a.Commit())

	again, claimed, err := claimIn(t, e, w, ids[0])
	require.NoError(t, err)
	require.False(t, claimed, "a committed claim is not claimed again")
	require.NoError(t, again.Rollback())
	b, claimed, err = claimIn(t, e, w, ids[1])
	require.NoError(t, err)
	require.True(t, claimed, "a rolled-back claim left nothing")
	require.NoError(t, b.Commit())
	require.Equal(t, ids[:2], e.ackRows("c"))

	other := cfg
	other.ClientName = "other"
	o := e.start(other)
	require.Equal(t, ids, receiveWithin(t, o, 3, liveWait))
	tx, claimed, err := claimIn(t, e, o, ids[0])
	require.NoError(t, err)
	require.True(t, claimed, "claims are per client")
	require.NoError(t, tx.Rollback())
}

func TestLiveAckClaimCompactsWhatTheTokenCertifies(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	ids := e.insert(3)
	cfg := e.config(ModePolling)
	cfg.StartFromBeginning = true
	w := e.start(cfg)
	require.Equal(t, ids, receiveWithin(t, w, 3, liveWait))
	for _, id := range ids {
		tx, claimed, err := claimIn(t, e, w, id)
		require.NoError(t, err)
		require.True(t, claimed)
		require.NoError(t, tx.Commit())
	}
	n, err := w.compactAcks(context.Background())
	require.NoError(t, err)
	require.Zero(t, n, "nothing is certified yet")
	require.NoError(t, w.MarkProcessed(context.Background(), tok(ids[1])))
	n, err = w.compactAcks(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	require.Equal(t, ids[2:], e.ackRows("c"), "the uncertified event keeps its row")

	_, err = e.db.Exec(`DELETE FROM datastore_changelog WHERE id = $1`, ids[2])
	require.NoError(t, err)
	n, err = w.compactAcks(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "a row whose changelog row is gone goes too")
}

func TestLiveAckClaimIsFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLive(t)
	ids := e.insert(2)
	cfg := e.config(ModePolling)
	cfg.StartFromBeginning, cfg.Exclusive = true, true
	w := e.start(cfg)
	require.Equal(t, ids, receiveWithin(t, w, 2, liveWait))

	open, claimed, err := claimIn(t, e, w, ids[0])
	require.NoError(t, err)
	require.True(t, claimed)
	require.NoError(t, w.MarkProcessed(ctx, tok(ids[0])), "the watcher's own save does not wait for an open claim")

	// A new owner's epoch claim waits for the open claim to end.
	bump := e.openTx()
	_, err = bump.Exec(`SET LOCAL lock_timeout = '300ms'`)
	require.NoError(t, err)
	_, err = bump.Exec(w.q.BumpEpoch, "c")
	require.ErrorContains(t, err, "lock timeout", "the epoch claim must wait for the claim in flight")
	require.NoError(t, bump.Rollback())
	require.NoError(t, open.Commit())

	_, err = e.db.Exec(w.q.BumpEpoch, "c")
	require.NoError(t, err)
	// The watcher has not noticed yet (a paused owner waking up): its compaction deletes nothing,
	// though the token it saved certifies the row.
	n, err := w.compactAcks(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a former owner's compaction deletes nothing")
	tx, claimed, err := claimIn(t, e, w, ids[1])
	require.ErrorIs(t, err, ErrFenced, "a claim after a later owner's epoch is refused")
	require.False(t, claimed)
	require.NoError(t, tx.Rollback())
	_, err = w.compactAcks(ctx)
	require.ErrorIs(t, err, ErrFenced, "once it knows, it does not try")
	require.Equal(t, ids[:1], e.ackRows("c"))
}
