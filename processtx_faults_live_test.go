package pgchangestream

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/pgtest"
)

// TestLiveProcessTxExactlyOnce: ProcessTx's effects happen exactly once with parallel handlers.
// While writers commit, ProcessTx with 4 or 8 workers inserts one row per event into an effects
// table in the handler's transaction. It is interrupted again and again at random points: by
// cancelling Start's context without Close, by cancelling ProcessTx's context (with a grace
// period that cancels the handlers mid-transaction, in some rounds), and by terminating every
// session of the database; after each it starts again from the saved token. In the end the
// effects table has exactly one row per committed changelog row.
func TestLiveProcessTxExactlyOnce(t *testing.T) {
	for _, mode := range []Mode{ModePolling, ModeNotify, ModeHybrid} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newLive(t)
			terminate := func() {
				e.terminateOthers()
				// The pool's idle connections were ended too, unnoticed until used: close them.
				e.db.SetMaxIdleConns(0)
				e.db.SetMaxIdleConns(2)
			}
			runTxAckExactlyOnce(t, e, mode, func(interrupts int) bool { return interrupts >= 8 },
				processTxRounds(t, e, mode, terminate))
		})
	}
}

// TestLiveProcessTxExactlyOnceServerFaults: the same, the session terminations replaced by a
// restart and a kill (crash recovery) of the test's own server, in turn, landing while the
// handlers' transactions are in flight.
func TestLiveProcessTxExactlyOnceServerFaults(t *testing.T) {
	srv := pgtest.NewServer(t, pgtest.Options{})
	for _, mode := range []Mode{ModePolling, ModeNotify, ModeHybrid} {
		t.Run(string(mode), func(t *testing.T) {
			e := newLiveOn(t, srv)
			faults, pending := 0, make(chan error, 1)
			fault := func() {
				f := srv.Restart
				if faults%2 == 1 {
					f = srv.Kill
				}
				faults++
				go func() { pending <- f(context.Background()) }()
			}
			rounds := processTxRounds(t, e, mode, fault)
			round := func(rng *rand.Rand, drain bool) bool {
				before := faults
				interrupted := rounds(rng, drain)
				if faults > before {
					require.NoError(t, <-pending)
				}
				return interrupted
			}
			runTxAckExactlyOnce(t, e, mode, func(int) bool { return faults >= 4 }, round)
			t.Logf("%s: %d server faults (restarts and kills in turn)", mode, faults)
		})
	}
}

// processTxHandler writes ev's effect in tx and keeps the transaction open a random moment, so
// that interruptions land inside transactions; calls counts its calls.
func processTxHandler(t *testing.T, calls *atomic.Int64) TxHandler {
	return func(_ context.Context, tx *sql.Tx, ev EventWithToken) error {
		calls.Add(1)
		if err := insertEffect(t, tx, ev); err != nil {
			return err
		}
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		return nil
	}
}

// processTxRounds returns the round of the ProcessTx tests: a watcher on a pool of its own runs
// ProcessTx until its handler was called a random number of times, then is interrupted: kind 0
// cancels Start's context (no Close), kind 1 applies fault and goes on for a while, kind 2
// cancels ProcessTx's context. The watcher then crashes (no final save of its own).
func processTxRounds(t *testing.T, e *liveEnv, mode Mode, fault func()) txAckRound {
	return func(rng *rand.Rand, drain bool) bool {
		cfg := e.config(mode)
		cfg.StartFromBeginning = true
		c := e.startCrashable(cfg)
		defer c.crash()
		limit, kind := int64(5+rng.IntN(40)), rng.IntN(3)
		if drain {
			limit, kind = math.MaxInt64, 2
		}
		opts := ProcessOptions{Workers: 4 << rng.IntN(2), MaxAttempts: 20,
			RetryMinBackoff: 10 * time.Millisecond, RetryMaxBackoff: 200 * time.Millisecond}
		if rng.IntN(2) == 0 {
			opts.GracePeriod = time.Millisecond // a stop cancels the handlers mid-transaction
		}
		var calls atomic.Int64
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = c.ProcessTx(ctx, opts, processTxHandler(t, &calls)) // an interruption may fail it
		}()
		defer func() { // before the crash: ProcessTx has returned
			cancel()
			<-done
		}()
		if !awaitCalls(&calls, limit, done) {
			return false // caught up, or ProcessTx stopped by itself
		}
		switch kind {
		case 0:
			c.cancel()
		case 1:
			fault()
			awaitCalls(&calls, calls.Load()+1+int64(rng.IntN(20)), done)
		}
		return true
	}
}

// awaitCalls waits until calls reaches n; it returns false if done is closed first, or if calls
// stays the same for 2 s (caught up).
func awaitCalls(calls *atomic.Int64, n int64, done <-chan struct{}) bool {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	last, since := calls.Load(), time.Now()
	for {
		if c := calls.Load(); c >= n {
			return true
		} else if c != last {
			last, since = c, time.Now()
		} else if time.Since(since) > 2*time.Second {
			return false
		}
		select {
		case <-done:
			return false
		case <-tick.C:
		}
	}
}

// TestLiveProcessTxExactlyOnceProcessKill: the same as [TestLiveProcessTxExactlyOnce], ProcessTx
// running in a child process that is killed with SIGKILL at random moments while its handlers'
// transactions are in flight, and started again, while writers commit. The child is this test
// run with txAckChildDSN and txAckChildMode set.
func TestLiveProcessTxExactlyOnceProcessKill(t *testing.T) {
	if dsn := os.Getenv(txAckChildDSN); dsn != "" {
		runProcessTxChild(t, dsn, Mode(os.Getenv(txAckChildMode)))
		return
	}
	for _, mode := range []Mode{ModePolling, ModeNotify, ModeHybrid} {
		t.Run(string(mode), func(t *testing.T) {
			e := newLive(t)
			killedIn := map[string]int{}
			kills := 0
			round := func(rng *rand.Rand, drain bool) bool {
				run := 300*time.Millisecond + time.Duration(rng.IntN(900))*time.Millisecond
				if drain {
					run = 3 * time.Second
				}
				killedIn[runChildFor(t, e, "TestLiveProcessTxExactlyOnceProcessKill", mode, run)]++
				kills++
				return true
			}
			runTxAckExactlyOnce(t, e, mode, func(int) bool { return kills >= 10 }, round)
			t.Logf("%s: %d kills by the child's last phase: %v", mode, kills, killedIn)
			require.Positive(t, killedIn["begin"]+killedIn["effect"], "no kill came with a handler's transaction open")
		})
	}
}

// runProcessTxChild is the child's side: ProcessTx with 8 workers and the handler of
// processTxHandler, reporting "begin" when a handler starts and "effect" once it wrote its
// effect. It runs until it is killed.
func runProcessTxChild(t *testing.T, dsn string, mode Mode) {
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	e := &liveEnv{t: t, db: db, dsn: dsn}
	var calls atomic.Int64
	inner := processTxHandler(t, &calls)
	handle := func(ctx context.Context, tx *sql.Tx, ev EventWithToken) error {
		fmt.Println(txAckPhase + "begin")
		err := inner(ctx, tx, ev)
		fmt.Println(txAckPhase + "effect")
		return err
	}
	for {
		cfg := e.config(mode)
		cfg.StartFromBeginning = true
		c := e.startCrashable(cfg)
		_ = c.ProcessTx(context.Background(), ProcessOptions{Workers: 8}, handle) // returns when the watcher fails
		c.crash()
	}
}

// BenchmarkProcessTx drains a backlog of b.N rows through ProcessTx, one effect row per event in
// the transaction ProcessTx owns, with 1 and 8 workers, on the test server (whose fsync setting
// decides how much parallel commits gain; benchmarks/cmd/bench runs with fsync on).
func BenchmarkProcessTx(b *testing.B) {
	for _, workers := range []int{1, 8} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			ctx := context.Background()
			srv := pgtest.Shared(b)
			require.NoError(b, srv.CreateTemplate(ctx, liveTemplate, setupLiveTemplate))
			db, _ := srv.NewDatabase(b, liveTemplate)
			_, err := db.Exec(`CREATE TABLE effects (changelog_id bigint NOT NULL)`)
			require.NoError(b, err)
			_, err = db.Exec(`INSERT INTO items (n) SELECT generate_series(1, $1)`, b.N)
			require.NoError(b, err)
			w, err := New(Config{DB: db, ClientName: "c", TableName: liveTable, Mode: ModePolling, Logger: quietLogger,
				StartFromBeginning: true, DisableProcessedFlag: true})
			require.NoError(b, err)
			defer func() { _ = w.Close(ctx) }()
			b.ResetTimer()
			w.Start(ctx)
			runCtx, cancel := context.WithCancel(ctx)
			errc := make(chan error, 1)
			go func() {
				errc <- w.ProcessTx(runCtx, ProcessOptions{Workers: workers}, func(ctx context.Context, tx *sql.Tx, ev EventWithToken) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO effects (changelog_id) VALUES ($1)`, string(ev.ResumeToken))
					return err
				})
			}()
			for w.Stats().Process.Handled < uint64(b.N) {
				select {
				case err := <-errc:
					b.Fatalf("ProcessTx stopped: %v", err)
				case <-time.After(time.Millisecond):
				}
			}
			cancel()
			require.NoError(b, <-errc)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
