package pgchangestream

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// changelogTuplesRead returns the tuples read from the changelog so far (fetched through an
// index or read by a sequential scan), once the statistics of ended sessions have arrived.
func (e *liveEnv) changelogTuplesRead() int64 {
	e.t.Helper()
	const q = `SELECT coalesce(idx_tup_fetch, 0) + seq_tup_read FROM pg_stat_user_tables WHERE relname = 'datastore_changelog'`
	var last int64 = -1
	for range 50 {
		var n int64
		require.NoError(e.t, e.db.QueryRow(q).Scan(&n))
		if n == last {
			return n
		}
		last = n
		time.Sleep(200 * time.Millisecond)
	}
	e.t.Fatal("the changelog's statistics did not settle")
	return 0
}

// newLiveWithoutTxid gives the test a fresh database installed by schema.Install whose changelog
// then lost its txid column: a legacy changelog with every index reads need.
func newLiveWithoutTxid(t *testing.T) *liveEnv {
	e := newLive(t)
	_, err := e.db.Exec(`ALTER TABLE datastore_changelog DROP COLUMN txid`)
	require.NoError(t, err)
	return e
}

// inEachSchemaState runs test in parallel subtests, each on a fresh database in one of the two
// schema states, each with every index schema.Install builds: upgraded, and legacy (the txid
// column dropped).
func inEachSchemaState(t *testing.T, test func(t *testing.T, e *liveEnv)) {
	for _, tc := range []struct {
		name string
		env  func(*testing.T) *liveEnv
	}{{"upgraded", newLive}, {"legacy", newLiveWithoutTxid}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			test(t, tc.env(t))
		})
	}
}

// TestLiveBulkTransactionAckCost proves that a save costs what it certifies (the processed flag
// is set through an index range from the previous saved position): one transaction writes 5,000
// rows with one changed_at, and 2,000 per-event acknowledgements, each a save, read a few
// changelog tuples each (the read of the rows included), not thousands. Both schema states, each
// with the indexes schema.Install builds.
func TestLiveBulkTransactionAckCost(t *testing.T) {
	inEachSchemaState(t, func(t *testing.T, e *liveEnv) {
		const rows, acks = 5000, 2000
		db, err := sql.Open("pgx", e.dsn) // a pool of its own: closing it flushes its statistics
		require.NoError(t, err)
		cfg := e.config(ModeHybrid)
		cfg.DB = db
		cfg.ProcessedFlag = true // the flag is measured too
		w := e.start(cfg)
		waitStartSaved(t, w)
		_, err = e.db.Exec(`INSERT INTO items (n) SELECT g FROM generate_series(1, $1::int) g`, rows)
		require.NoError(t, err)
		_, err = e.db.Exec(`ANALYZE datastore_changelog`)
		require.NoError(t, err)
		ids := receiveWithin(t, w, acks, liveWait)
		require.NoError(t, w.MarkProcessed(context.Background(), tok(ids[0])))
		before := e.changelogTuplesRead()
		for _, id := range ids[1:] {
			require.NoError(t, w.MarkProcessed(context.Background(), tok(id)))
		}
		require.NoError(t, w.Close(context.Background()))
		require.NoError(t, db.Close())
		perAck := float64(e.changelogTuplesRead()-before) / float64(acks-1)
		t.Logf("%.1f changelog tuples read per acknowledgement", perAck)
		require.LessOrEqual(t, perAck, 20.0)
		require.True(t, e.processed(ids[acks-1]), "the flag follows the saved position")
		require.False(t, e.processed(ids[acks-1]+1), "the flag never passes the saved position")
	})
}

// TestLiveBacklog proves that Backlog counts exactly the rows of the client's table that its
// saved token does not certify, whatever the processed flag says, in both schema states.
func TestLiveBacklog(t *testing.T) {
	inEachSchemaState(t, func(t *testing.T, e *liveEnv) {
		ctx := context.Background()
		w := e.start(e.config(ModeHybrid))
		waitStartSaved(t, w)
		backlog := func() int64 {
			n, err := w.Backlog(ctx)
			require.NoError(t, err)
			return n
		}
		require.Zero(t, backlog())
		ids := e.insert(5)
		open := e.openTx()
		insertItem(t, open) // not visible: not in the backlog
		require.Equal(t, ids, receiveWithin(t, w, 5, liveWait))
		require.Equal(t, int64(5), backlog(), "delivered but not acknowledged")
		require.NoError(t, w.MarkProcessed(ctx, tok(ids[1])))
		require.Equal(t, int64(3), backlog())
		_, err := e.db.Exec(`UPDATE datastore_changelog SET processed = TRUE`)
		require.NoError(t, err)
		require.Equal(t, int64(3), backlog(), "the shared flag does not count")
		require.NoError(t, w.MarkProcessed(ctx, tok(ids[4])))
		require.Zero(t, backlog())
		require.NoError(t, open.Commit())
		receiveWithin(t, w, 1, liveWait)
		require.Equal(t, int64(1), backlog(), "the transaction that was open, once committed")
	})
}

// TestLiveLargeMarkingPass proves that a marking pass split into statements that run at once
// sets the flag of exactly the rows the saved token certifies: one acknowledgement certifies
// thousands of rows at once, and the rows delivered after it stay unmarked. Both schema states.
func TestLiveLargeMarkingPass(t *testing.T) {
	inEachSchemaState(t, func(t *testing.T, e *liveEnv) {
		const rows, acked = 5000, 4000
		cfg := e.config(ModePolling)
		cfg.ProcessedFlag = true
		w := e.start(cfg)
		waitStartSaved(t, w)
		_, err := e.db.Exec(`INSERT INTO items (n) SELECT g FROM generate_series(1, $1::int) g`, rows)
		require.NoError(t, err)
		ids := receiveWithin(t, w, rows, liveWait)
		require.NoError(t, w.MarkProcessed(context.Background(), tok(ids[acked-1])))
		count := func(cond string) int {
			var n int
			require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog WHERE id = ANY($1) AND `+cond, ids).Scan(&n))
			return n
		}
		waitFor(t, func() bool { return count(`processed`) == acked }, "the certified rows are marked")
		require.NoError(t, w.Close(context.Background()))
		require.Equal(t, acked, count(`processed AND id <= `+strconv.FormatInt(ids[acked-1], 10)))
		require.Equal(t, rows-acked, count(`NOT processed`), "rows the token does not certify stay unmarked")
	})
}
