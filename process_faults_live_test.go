package pgchangestream

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/pgtest"
)

// procFaultWait bounds recoveries from a fault on a loaded machine.
const procFaultWait = 60 * time.Second

// procKey spreads the changelog over 16 keys: twice the workers, so that a backlog queues
// several events of each key in MaxInFlight.
func procKey(id int64) string { return strconv.FormatInt(id%16, 10) }

// procOptions are the options of the fault tests: 8 workers, a small in-flight bound.
func procOptions(rec *procRecorder) ProcessOptions {
	return ProcessOptions{Workers: 8, Key: rec.key, MaxInFlight: 64}
}

// procConfig is the watcher config of the fault tests: hybrid mode, quick polls, from the start.
func procConfig(e *liveEnv) Config {
	cfg := e.config(ModeHybrid)
	cfg.StartFromBeginning = true
	cfg.PollInterval = 5 * time.Millisecond
	return cfg
}

// catchUp runs Process on a new watcher of the same client until every row the stopped writers
// committed was handled, then stops it cleanly.
func catchUp(t *testing.T, e *liveEnv, rec *procRecorder, opts ProcessOptions, writers *liveWriters) {
	t.Helper()
	rec.next()
	w := e.start(procConfig(e))
	errc, cancel := startProcess(t, w, opts, rec.handle)
	deadline := time.Now().Add(procFaultWait)
	for !rec.handledAll(writers.rows) {
		if time.Now().After(deadline) {
			t.Fatalf("the last run does not handle every committed row: %d of %d handled; stats %+v",
				rec.handledCount(), len(writers.rows), w.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	require.NoError(t, <-errc)
	require.NoError(t, w.Close(context.Background()))
}

// TestLiveProcessServerFaults: the server is killed (SIGKILL, crash recovery) or restarted
// (fast shutdown) while handlers run and writers commit. Process rides it out (reads and saves
// are retried), keeps per-key order and mutual exclusion, and after a clean stop and a restart
// every committed row is handled, with no finished event delivered again.
func TestLiveProcessServerFaults(t *testing.T) {
	srv := pgtest.NewServer(t, pgtest.Options{})
	for _, f := range []struct {
		name  string
		fault func(context.Context) error
	}{{"kill", srv.Kill}, {"restart", srv.Restart}} {
		t.Run(f.name, func(t *testing.T) {
			runProcessFault(t, newLiveOn(t, srv), 1, func(context.Context) { require.NoError(t, f.fault(context.Background())) })
		})
	}
}

// TestLiveProcessSessionsTerminated: the database's sessions (the watcher's reads, saves and
// LISTEN connection, the writers') are terminated three times while handlers run.
func TestLiveProcessSessionsTerminated(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	runProcessFault(t, e, 3, func(context.Context) { e.terminateOthers() })
}

// runProcessFault runs Process while writers commit and applies fault rounds times, each while a
// handler runs and after the run handled 100 more events, then stops cleanly, catches up on a
// new watcher and checks the record.
func runProcessFault(t *testing.T, e *liveEnv, rounds int, fault func(context.Context)) {
	rec := newProcRecorder(t)
	rec.keyOf = procKey
	opts := procOptions(rec)
	writers := e.startWriters(crashWriters, 2*time.Millisecond)
	waitFor(t, func() bool { return writers.committed() >= 200 }, "a backlog") // so that keys queue
	rec.next()
	w := e.start(procConfig(e))
	errc, cancel := startProcess(t, w, opts, rec.handle)
	for range rounds {
		handled, committed := rec.handledCount(), writers.committed()
		require.Eventually(t, func() bool {
			return rec.handledCount() >= handled+100 && w.Stats().Process.BusyWorkers > 0
		}, procFaultWait, time.Millisecond, "Process does not go on; stats %+v", w.Stats())
		fault(context.Background())
		require.Eventually(t, func() bool { return writers.committed() >= committed+100 }, procFaultWait, 5*time.Millisecond,
			"the writers do not recover")
	}
	handled := rec.handledCount()
	require.Eventually(t, func() bool { return rec.handledCount() >= handled+100 }, procFaultWait, 5*time.Millisecond,
		"Process does not recover from the fault; stats %+v", w.Stats())
	writers.stop()
	cancel()
	require.NoError(t, <-errc)
	require.NoError(t, w.Close(context.Background()))
	firstRun := rec.handledCount()
	catchUp(t, e, rec, opts, writers)
	rec.check()
	require.Zero(t, rec.replays(), "a clean stop after the faults replays nothing")
	require.Positive(t, rec.queuedBehind(), "no event queued behind another of its key")
	t.Logf("%d rows committed (%d transactions failed), %d handled before the restart, %d queued behind their key",
		len(writers.rows), writers.errs, firstRun, rec.queuedBehind())
}

// procChildDSN, set in the environment, makes TestLiveProcessConsumerKilled run as the
// consumer: a child process killed by the test.
const procChildDSN = "PGCHANGESTREAM_PROC_CHILD_DSN"

// procLine prefixes the lines in which the child consumer reports its hooks: "g <id>" (the
// engine took the event), "b <id>" (a handler began), "e <id>" (it finished).
const procLine = "proc: "

// TestLiveProcessConsumerKilled: the consumer, a child process running Process with 8 workers,
// is killed with SIGKILL four times while its handlers run and writers commit, and started
// again; then a last run in this process catches up. Every committed row is handled; the events
// a run was given and did not finish are given again in the next, the replays of a key being a
// suffix of its deliveries that starts at or before its first unfinished event; per-key order
// and mutual exclusion hold in every run.
func TestLiveProcessConsumerKilled(t *testing.T) {
	if dsn := os.Getenv(procChildDSN); dsn != "" {
		runProcChild(t, dsn)
		return
	}
	t.Parallel()
	e := newLive(t)
	rec := newProcRecorder(t)
	rec.keyOf = procKey
	writers := e.startWriters(crashWriters, 2*time.Millisecond)
	midHandler := 0
	for range 4 {
		rec.next()
		if runProcChildFor(t, e, rec, time.Duration(200+rand.IntN(600))*time.Millisecond) > 0 {
			midHandler++
		}
		rec.crash()
	}
	writers.stop()
	catchUp(t, e, rec, procOptions(rec), writers)
	rec.check()
	require.Positive(t, midHandler, "no kill came while a handler ran")
	require.Positive(t, rec.queuedBehind(), "no event queued behind another of its key")
	t.Logf("%d rows committed, 4 kills (%d while handlers ran), %d replays, %d queued behind their key",
		len(writers.rows), midHandler, rec.replays(), rec.queuedBehind())
}

// runProcChildFor starts the child consumer, feeds its reports to rec, kills it with SIGKILL
// once it handled 20 events, run has passed and a handler runs, and returns how many handlers
// were running.
func runProcChildFor(t *testing.T, e *liveEnv, rec *procRecorder, run time.Duration) int {
	child := exec.Command(os.Args[0], "-test.run=^TestLiveProcessConsumerKilled$")
	child.Env = append(os.Environ(), procChildDSN+"="+e.dsn)
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	child.Stderr = os.Stderr
	require.NoError(t, child.Start())
	handled, running := make(chan struct{}), make(chan int, 1)
	var busy atomic.Int64 // handlers begun and not finished, as reported so far
	go func() {
		n, open := 0, 0
		for lines := bufio.NewScanner(out); lines.Scan(); {
			report, ok := strings.CutPrefix(lines.Text(), procLine)
			if !ok {
				fmt.Fprintln(os.Stderr, lines.Text()) // the child's test output
				continue
			}
			var (
				what string
				id   int64
			)
			if _, err := fmt.Sscanf(report, "%s %d", &what, &id); err != nil {
				t.Errorf("child report %q: %v", report, err)
				continue
			}
			switch what {
			case "g":
				rec.gave(id)
			case "b":
				rec.begin(id)
				open++
			case "e":
				rec.end(id)
				open--
				if n++; n == 20 {
					close(handled)
				}
			}
			busy.Store(int64(open))
		}
		running <- open
	}()
	select {
	case <-handled:
	case <-time.After(procFaultWait):
		t.Errorf("the child consumer handled fewer than 20 events")
	}
	time.Sleep(run)
	deadline := time.Now().Add(procFaultWait) // then kill it while a handler runs
	for busy.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Microsecond)
	}
	_ = child.Process.Kill() // fails only if the child has exited: the status below says so
	open := <-running        // the pipe is read to its end before Wait closes it
	err = child.Wait()
	status, _ := child.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, status.Signaled() && status.Signal() == syscall.SIGKILL,
		"the child consumer ended by itself before it was killed: %v", err)
	return open
}

// runProcChild is the child's side: Process with 8 workers, reporting its hooks on stdout (one
// write per line), each handler taking 2 to 15 ms. It runs until it is killed.
func runProcChild(t *testing.T, dsn string) {
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	e := &liveEnv{t: t, db: db, dsn: dsn}
	w := e.start(procConfig(e))
	key := func(ev EventWithToken) string {
		id := tokenID(t, ev)
		fmt.Printf("%sg %d\n", procLine, id)
		return procKey(id)
	}
	err = w.Process(context.Background(), ProcessOptions{Workers: 8, Key: key, MaxInFlight: 64},
		func(_ context.Context, ev EventWithToken) error {
			id := tokenID(t, ev)
			fmt.Printf("%sb %d\n", procLine, id)
			time.Sleep(time.Duration(2000+rand.IntN(13000)) * time.Microsecond)
			fmt.Printf("%se %d\n", procLine, id)
			return nil
		})
	t.Fatalf("Process returned before the kill: %v", err)
}

// TestLiveProcessHotKeyBoundedInFlight: half the events share one hot key whose handler takes
// 15 ms (slower than the writers), the rest spread over 61 cold keys, with MaxInFlight 64.
//   - By default the hot key's backlog fills MaxInFlight: the events taken and not finished
//     never exceed it (sampled every 200 µs), and the cold keys still make progress.
//   - With MaxDeferred, the hot key's events past MaxKeyQueue are deferred (kept as tokens): the
//     events held with their document never exceed MaxInFlight and the deferred ones never
//     exceed MaxDeferred.
//
// In both, everything is handled in the end (the hot handler quick once the writers stop).
func TestLiveProcessHotKeyBoundedInFlight(t *testing.T) {
	t.Run("default", func(t *testing.T) { hotKeyBounded(t, 0) })
	t.Run("deferred", func(t *testing.T) { hotKeyBounded(t, 512) })
}

// hotKeyBounded runs one case of TestLiveProcessHotKeyBoundedInFlight.
func hotKeyBounded(t *testing.T, maxDeferred int) {
	t.Parallel()
	e := newLive(t)
	rec := newProcRecorder(t)
	rec.keyOf = func(id int64) string {
		if id%2 == 0 {
			return "hot"
		}
		return procKey(id)
	}
	var draining atomic.Bool // the writers stopped: the hot key drains quickly
	rec.pause = func(id int64) time.Duration {
		if id%2 == 0 && !draining.Load() {
			return 15 * time.Millisecond
		}
		return 200 * time.Microsecond
	}
	opts := procOptions(rec)
	opts.MaxDeferred = maxDeferred
	writers := e.startWriters(crashWriters, 2*time.Millisecond)
	rec.next()
	w := e.start(procConfig(e))
	errc, cancel := startProcess(t, w, opts, rec.handle)
	sampling, sampled := make(chan struct{}), make(chan [3]int, 1)
	go func() {
		var peak [3]int // events in flight, of those with their document, and kept as a token
		for {
			select {
			case <-sampling:
				sampled <- peak
				return
			case <-time.After(200 * time.Microsecond):
				p := w.Stats().Process
				peak = [3]int{max(peak[0], p.InFlight), max(peak[1], p.InFlight-p.Deferred), max(peak[2], p.Deferred)}
			}
		}
	}()
	cold := func() int {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		n := 0
		for id := range rec.done {
			n += int(id % 2)
		}
		return n
	}
	if maxDeferred == 0 {
		waitFor(t, func() bool { return w.Stats().Process.InFlight == opts.MaxInFlight }, "the hot key's backlog fills the in-flight bound")
	} else {
		waitFor(t, func() bool { return w.Stats().Process.Deferred > 0 }, "the hot key's backlog is deferred past MaxKeyQueue")
	}
	for range 2 { // the cold keys make progress while the hot key is backlogged
		n := cold()
		waitFor(t, func() bool { return cold() >= n+20 }, "the cold keys make progress")
	}
	began, coldBefore := time.Now(), cold()
	time.Sleep(500 * time.Millisecond)
	coldRate := float64(cold()-coldBefore) / time.Since(began).Seconds()
	draining.Store(true)
	writers.stop()
	waitFor(t, func() bool { return rec.handledAll(writers.rows) }, "every committed row is handled")
	close(sampling)
	peak := <-sampled
	cancel()
	require.NoError(t, <-errc)
	rec.check()
	o := opts.withDefaults()
	if maxDeferred == 0 {
		require.LessOrEqual(t, peak[0], o.MaxInFlight, "events taken and not finished")
		require.Zero(t, peak[2], "no event is deferred by default")
	} else {
		require.LessOrEqual(t, peak[1], o.MaxInFlight, "events in flight with their document")
		require.LessOrEqual(t, peak[2], o.MaxDeferred, "events deferred")
	}
	st := w.Stats().Process
	t.Logf("%d rows; peak in flight %d (full %d of %d, deferred %d of %d); cold keys %.0f events/s while the hot key was backlogged; longest queue %d (%s)",
		len(writers.rows), peak[0], peak[1], o.MaxInFlight, peak[2], o.MaxDeferred, coldRate, st.LongestKeyQueue, st.LongestKey)
}

// TestLiveProcessGracefulStop: ctx is cancelled while 8 handlers of 5-20 ms run and writers
// commit, one handler (of the 100th event taken) running until its context ends. Process
// returns nil within GracePeriod and a margin; the next run gives the stuck event again, gives
// no event finished before it in delivery order again, and loses none.
func TestLiveProcessGracefulStop(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	rec := newProcRecorder(t)
	rec.keyOf = procKey
	rec.pause = func(int64) time.Duration { return time.Duration(5+rand.IntN(15)) * time.Millisecond }
	var stuck atomic.Int64
	var taken atomic.Int64
	opts := procOptions(rec)
	opts.GracePeriod = time.Second
	opts.Key = func(ev EventWithToken) string {
		if taken.Add(1) == 100 {
			stuck.Store(tokenID(t, ev))
		}
		return rec.key(ev)
	}
	writers := e.startWriters(crashWriters, 2*time.Millisecond)
	rec.next()
	w := e.start(procConfig(e))
	errc, cancel := startProcess(t, w, opts, func(ctx context.Context, ev EventWithToken) error {
		if tokenID(t, ev) == stuck.Load() {
			<-ctx.Done()
			return ctx.Err()
		}
		return rec.handle(ctx, ev)
	})
	waitFor(t, func() bool { return stuck.Load() != 0 && w.Stats().Process.BusyWorkers > 1 }, "the stuck handler and others run")
	cancel()
	began := time.Now()
	require.NoError(t, <-errc)
	took := time.Since(began)
	require.Less(t, took, opts.GracePeriod+2*time.Second, "Process returned %v after the stop", took)
	require.NoError(t, w.Close(context.Background()))
	writers.stop()
	catchUp(t, e, rec, procOptions(rec), writers)
	rec.check() // the stuck event is given again; nothing finished before it is
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Equal(t, 2, rec.done[stuck.Load()], "the stuck event is handled by the next run")
	t.Logf("%d rows; Process returned %v after the stop (grace %v)", len(writers.rows), took, opts.GracePeriod)
}
