package pgchangestream

import (
	"context"
	"database/sql"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/pgtest"
)

// TestLiveTxAckExactlyOnce: contract rule 19. While writers commit, a consumer inserts one row
// per event into an effects table and acknowledges the event with MarkProcessedTx in the same
// transaction. It is interrupted again and again: by cancelling Start's context without Close
// (sometimes with a transaction open, committed after the watcher stopped), and by terminating
// every session of the database; after each it restarts from the saved token. In the end the
// effects table has exactly one row per committed changelog row.
func TestLiveTxAckExactlyOnce(t *testing.T) {
	for _, mode := range []Mode{ModePolling, ModeNotify, ModeHybrid} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newLive(t)
			runTxAckExactlyOnce(t, e, mode, func(interrupts int) bool { return interrupts >= 8 },
				txAckRounds(t, e, mode, e.terminateOthers))
		})
	}
}

// TestLiveTxAckExactlyOnceServerFaults: the same as [TestLiveTxAckExactlyOnce], the session
// terminations replaced by faults of the server of the test's own: a restart (fast shutdown)
// and a kill (SIGKILL, then crash recovery), in turn, each while the consumer goes on, so that
// it lands at any point of a transaction.
func TestLiveTxAckExactlyOnceServerFaults(t *testing.T) {
	srv := pgtest.NewServer(t, pgtest.Options{})
	for _, mode := range []Mode{ModePolling, ModeNotify, ModeHybrid} {
		t.Run(string(mode), func(t *testing.T) {
			e := newLiveOn(t, srv)
			faults, pending := 0, make(chan error, 1)
			fault := func() { // on its own goroutine, so that it lands while the consumer goes on
				f := srv.Restart
				if faults%2 == 1 {
					f = srv.Kill
				}
				faults++
				go func() { pending <- f(context.Background()) }()
			}
			rounds := txAckRounds(t, e, mode, fault)
			round := func(rng *rand.Rand, drain bool) bool {
				before := faults
				interrupted := rounds(rng, drain)
				if faults > before { // the server is up again before the next round
					require.NoError(t, <-pending)
				}
				return interrupted
			}
			runTxAckExactlyOnce(t, e, mode, func(int) bool { return faults >= 4 }, round)
			t.Logf("%s: %d server faults (restarts and kills in turn)", mode, faults)
		})
	}
}

// txAckRound runs the consumer once and reports whether it was interrupted; drain asks it to
// consume until it has caught up.
type txAckRound func(rng *rand.Rand, drain bool) bool

// runTxAckExactlyOnce runs rounds of the consumer while writers commit, until enough(the
// interruptions so far), then until the consumer has caught up with the stopped writers (or
// two rounds added no effect), and checks that the effects table has exactly one row per committed changelog row, keyed by the
// event's IdempotencyKey.
func runTxAckExactlyOnce(t *testing.T, e *liveEnv, mode Mode, enough func(interrupts int) bool, round txAckRound) {
	_, err := e.db.Exec(`CREATE TABLE effects (changelog_id bigint NOT NULL, idempotency_key text NOT NULL)`)
	require.NoError(t, err)
	writers := e.startWriters(1, 5*time.Millisecond)
	rng := rand.New(rand.NewPCG(uint64(len(mode)), 19))
	interrupts, stopped, idle, effects := 0, false, 0, -1
	for r := 0; idle < 2; r++ { // after the writers stopped: until two drain rounds add nothing
		if !stopped && enough(interrupts) {
			writers.stop()
			stopped = true
		}
		if n := e.effectsCount(); stopped {
			if n == e.changelogCount() {
				break
			}
			if idle++; n != effects {
				idle = 0
			}
			effects = n
		}
		require.Less(t, r, 300, "the consumer makes no progress")
		if round(rng, stopped) {
			interrupts++
		}
	}
	var total, distinct, missing, badKeys int
	require.NoError(t, e.db.QueryRow(`SELECT count(*), count(DISTINCT changelog_id),
		count(*) FILTER (WHERE idempotency_key <> $1 || '/' || changelog_id) FROM effects`, liveTable).
		Scan(&total, &distinct, &badKeys))
	require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog c WHERE table_name = $1
		AND NOT EXISTS (SELECT FROM effects WHERE changelog_id = c.id)`, liveTable).Scan(&missing))
	rows := e.changelogCount()
	t.Logf("%s: %d effects (%d distinct) for %d changelog rows (%d committed by the writers) after %d interruptions",
		mode, total, distinct, rows, writers.committed(), interrupts)
	require.Zero(t, missing, "no committed changelog row is without its effect")
	require.Equal(t, distinct, total, "no effect is written twice")
	require.Equal(t, rows, total)
	require.GreaterOrEqual(t, rows, writers.committed(), "every row the writers committed is in the changelog")
	require.Zero(t, badKeys, "each effect's idempotency key is its table and changelog id")
	require.Positive(t, interrupts)
}

// txAckRounds returns the in-process round: a watcher on a pool of its own consumes a random
// number of events, is interrupted (fault is the session fault of kind 1, see txAckConsume) and
// crashes.
func txAckRounds(t *testing.T, e *liveEnv, mode Mode, fault func()) txAckRound {
	return func(rng *rand.Rand, drain bool) bool {
		cfg := e.config(mode)
		cfg.StartFromBeginning = true
		c := e.startCrashable(cfg)
		defer c.crash()
		limit, kind := 5+rng.IntN(25), rng.IntN(3)
		if drain {
			limit, kind = math.MaxInt, 2
		}
		return txAckConsume(t, e.db, c, limit, kind, rng, txAckFault{session: fault})
	}
}

// txAckFault is what txAckConsume does at its interruption points: session is the fault of
// kind 1; mark, when set, is told "begin" once a transaction is open, "acked" once
// MarkProcessedTx wrote in it and "commit" once it committed.
type txAckFault struct {
	session func()
	mark    func(phase string)
}

func (f txAckFault) at(phase string) {
	if f.mark != nil {
		f.mark(phase)
	}
}

// txAckConsume consumes up to limit events of c, each in its own transaction on db with its
// effect, then interrupts: kind 0 stops the watcher with a transaction open and commits it
// after; kind 1 applies f.session and goes on until an error; kind 2 just stops. It returns
// whether it interrupted, and stops at the first error (a later acknowledgement would certify
// the event whose transaction failed).
func txAckConsume(t *testing.T, db *sql.DB, c *crashable, limit, kind int, rng *rand.Rand, f txAckFault) bool {
	ctx := context.Background()
	for n := 0; ; n++ {
		var ev EventWithToken
		select {
		case got, ok := <-c.Events():
			if !ok {
				return false
			}
			ev = got
		case <-time.After(2 * time.Second): // caught up
			return false
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return true
		}
		f.at("begin")
		if err := insertEffect(t, tx, ev); err != nil {
			_ = tx.Rollback()
			return true
		}
		if err := c.MarkProcessedTx(ctx, tx, ev.ResumeToken); err != nil {
			_ = tx.Rollback()
			return true
		}
		f.at("acked")
		last := n+1 >= limit
		if last && kind == 0 {
			c.stop() // the watcher stops before the transaction ends
			require.NoError(t, tx.Commit())
			return true
		}
		if err := tx.Commit(); err != nil {
			return true
		}
		f.at("commit")
		if last && kind == 1 {
			f.session()
			kind, limit = 2, n+1+rng.IntN(10) // go on for a while, then stop
			continue
		}
		if last {
			return true
		}
	}
}

// insertEffect writes ev's effect in tx: its changelog id and idempotency key.
func insertEffect(t *testing.T, tx *sql.Tx, ev EventWithToken) error {
	id, err := strconv.ParseInt(string(ev.ResumeToken), 10, 64)
	require.NoError(t, err)
	key, err := ev.IdempotencyKey()
	require.NoError(t, err)
	_, err = tx.Exec(`INSERT INTO effects (changelog_id, idempotency_key) VALUES ($1, $2)`, id, key)
	return err
}

func (e *liveEnv) effectsCount() int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.db.QueryRow(`SELECT count(*) FROM effects`).Scan(&n))
	return n
}

func (e *liveEnv) changelogCount() int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog WHERE table_name = $1`, liveTable).Scan(&n))
	return n
}

// terminateOthers ends every other session of the test's database: the watcher's, its
// listener's and the writers'.
func (e *liveEnv) terminateOthers() {
	e.t.Helper()
	_, err := e.db.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	require.NoError(e.t, err)
}

// A rolled-back transaction leaves the token and the watcher's counters as they were, and so
// does the next save.
func TestLiveTxAckRollback(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	ctx := context.Background()
	cfg := e.config(ModePolling)
	cfg.StartFromBeginning = true
	w := e.start(cfg)
	ids := e.insert(3)
	require.Equal(t, ids, receiveWithin(t, w, 3, liveWait))
	require.NoError(t, w.Flush(ctx))
	raw, before := e.rawToken("c"), w.Stats()

	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.MarkProcessedTx(ctx, tx, tok(ids[2])))
	require.NoError(t, tx.Rollback())
	require.NoError(t, w.Flush(ctx))
	after := w.Stats()
	require.Equal(t, raw, e.rawToken("c"), "the token is unchanged")
	require.Equal(t, before.Acked, after.Acked)
	require.Equal(t, before.Pending, after.Pending)
	require.Equal(t, before.Checkpoint, after.Checkpoint)
	require.Equal(t, before.CheckpointWrites, after.CheckpointWrites)

	tx, err = e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.MarkProcessedTx(ctx, tx, tok(ids[2])))
	require.NoError(t, tx.Commit())
	require.Equal(t, ids[2], e.savedToken("c").ID, "committed: in the database at once")
	require.NoError(t, w.Flush(ctx))
	require.Equal(t, uint64(3), w.Stats().Acked, "and in memory after the next save")
	e.requireRestartDelivers(ModePolling, nil, "everything was acknowledged")
}

// The watcher's background saves while a caller's transaction holds the token row: they do not
// wait for it (Close neither), and once it commits they never write an older position over it.
func TestLiveTxAckBackgroundSaveWhileRowLocked(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	ctx := context.Background()
	cfg := e.config(ModePolling)
	cfg.StartFromBeginning = true
	cfg.CheckpointInterval = 20 * time.Millisecond
	w := e.start(cfg)
	ids := e.insert(6)
	require.Equal(t, ids, receiveWithin(t, w, 6, liveWait))

	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.MarkProcessedTx(ctx, tx, tok(ids[4])))
	require.NoError(t, w.MarkProcessed(ctx, tok(ids[1])), "acknowledged in memory; saved in the background")
	time.Sleep(200 * time.Millisecond) // about ten background saves try the locked row
	flushed := make(chan error, 1)
	start := time.Now()
	go func() { flushed <- w.Flush(ctx) }()
	select {
	case err := <-flushed:
		t.Logf("a save with the row locked returned after %v: %v", time.Since(start), err)
		require.ErrorIs(t, err, errTokenLocked)
	case <-time.After(5 * time.Second):
		t.Fatal("a save waits for the caller's transaction")
	}
	require.NoError(t, tx.Commit())
	waitFor(t, func() bool { return w.Stats().Acked == 5 }, "the committed acknowledgement reaches memory by a background save")
	time.Sleep(100 * time.Millisecond) // more background saves
	require.Equal(t, ids[4], e.savedToken("c").ID, "no save went back to the in-memory acknowledgement of %d", ids[1])
	require.NoError(t, w.MarkProcessed(ctx, tok(ids[5])))
	require.NoError(t, w.Close(ctx))
	require.Equal(t, ids[5], e.savedToken("c").ID)
}

// An ex-owner's transaction cannot commit a token: after a later owner claimed the client (here
// token reset's epoch bump, which the owner has not noticed), its write affects no row.
func TestLiveTxAckFencedOwner(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	ctx := context.Background()
	cfg := e.config(ModePolling)
	cfg.Exclusive, cfg.StartFromBeginning = true, true
	w := e.start(cfg)
	waitFor(t, func() bool { return w.Stats().Active }, "the owner takes the lock")
	ids := e.insert(3)
	require.Equal(t, ids, receiveWithin(t, w, 3, liveWait))
	_, err := e.db.Exec(w.q.BumpEpoch, "c")
	require.NoError(t, err)
	raw := e.rawToken("c")

	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.Exec(`INSERT INTO items (n) VALUES (2)`) // the caller's effect
	require.NoError(t, err)
	err = w.MarkProcessedTx(ctx, tx, tok(ids[2]))
	require.ErrorIs(t, err, ErrFenced)
	require.NoError(t, tx.Commit()) // a caller that commits anyway still writes no token
	require.Equal(t, raw, e.rawToken("c"), "the ex-owner's transaction wrote no token")
	requireClosed(t, w)
}

// Two transactions acknowledge in delivery order and commit in the opposite order: the later
// acknowledgement holds, and the earlier one does not move the token back.
func TestLiveTxAckOppositeCommitOrder(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	ctx := context.Background()
	cfg := e.config(ModePolling)
	cfg.StartFromBeginning = true
	w := e.start(cfg)
	ids := e.insert(4)
	require.Equal(t, ids, receiveWithin(t, w, 4, liveWait))

	earlier, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.MarkProcessedTx(ctx, earlier, tok(ids[1])))
	var wg sync.WaitGroup
	laterErr := make(chan error, 1)
	wg.Add(1)
	go func() { // waits for the earlier transaction's row lock
		defer wg.Done()
		later, err := e.db.BeginTx(ctx, nil)
		if err == nil {
			err = w.MarkProcessedTx(ctx, later, tok(ids[3]))
		}
		if err == nil {
			err = later.Commit()
		}
		laterErr <- err
	}()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, earlier.Commit())
	wg.Wait()
	require.NoError(t, <-laterErr)
	require.Equal(t, ids[3], e.savedToken("c").ID)

	// Now the other way round: the later one commits first, the earlier one finds it and
	// writes nothing.
	more := e.insert(3)
	require.Equal(t, more, receiveWithin(t, w, 3, liveWait))
	earlier, err = e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	later, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, w.MarkProcessedTx(ctx, later, tok(more[2])))
	require.NoError(t, later.Commit())
	require.NoError(t, w.MarkProcessedTx(ctx, earlier, tok(more[0])))
	require.NoError(t, earlier.Commit())
	require.Equal(t, more[2], e.savedToken("c").ID, "the earlier acknowledgement did not move the token back")
	require.NoError(t, w.Flush(ctx))
	require.Equal(t, uint64(7), w.Stats().Acked)
	require.NoError(t, w.Close(ctx))
	e.requireRestartDelivers(ModePolling, nil)
}
