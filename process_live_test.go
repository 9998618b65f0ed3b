package pgchangestream

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// procRecorder records, per run of Process, the events each key was given in delivery order
// (Key is called by the engine in receipt order) and the events its handlers finished, and
// checks that no two handlers of one key run at once.
type procRecorder struct {
	t       *testing.T
	mu      sync.Mutex
	run     int
	running map[string]bool
	given   []map[string][]int64 // per run, per key, in delivery order
	handled []map[string][]int64 // per run, per key, in the order the handlers finished
	done    map[int64]int        // handled events, and the run that handled them first
}

func newProcRecorder(t *testing.T) *procRecorder {
	return &procRecorder{t: t, running: map[string]bool{}, done: map[int64]int{}}
}

// next starts recording a new run.
func (r *procRecorder) next() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.run++
	r.given = append(r.given, map[string][]int64{})
	r.handled = append(r.handled, map[string][]int64{})
}

// key spreads the changelog over 37 keys, each with many events.
func (r *procRecorder) key(ev EventWithToken) string {
	id := tokenID(r.t, ev)
	k := strconv.FormatInt(id%37, 10)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.given[r.run-1][k] = append(r.given[r.run-1][k], id)
	return k
}

func (r *procRecorder) handle(_ context.Context, ev EventWithToken) error {
	id := tokenID(r.t, ev)
	k := strconv.FormatInt(id%37, 10)
	r.mu.Lock()
	if r.running[k] {
		r.t.Errorf("two handlers of key %s at once", k)
	}
	r.running[k] = true
	r.mu.Unlock()
	time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running[k] = false
	r.handled[r.run-1][k] = append(r.handled[r.run-1][k], id)
	if _, ok := r.done[id]; !ok {
		r.done[id] = r.run
	}
	return nil
}

// check checks each run: per key, the handlers finished the events in delivery order (a prefix:
// a stop may leave the tail unrun), and no event handled in an earlier run was given again.
func (r *procRecorder) check() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for run := range r.run {
		for k, given := range r.given[run] {
			handled := r.handled[run][k]
			require.LessOrEqual(r.t, len(handled), len(given))
			require.Equal(r.t, given[:len(handled)], handled, "run %d, key %s: per-key delivery order", run+1, k)
			for _, id := range given {
				if first, ok := r.done[id]; ok && first < run+1 {
					r.t.Errorf("event %d, finished in run %d before a clean stop, was delivered again in run %d", id, first, run+1)
				}
			}
		}
	}
}

func (r *procRecorder) handledAll(ids map[int64]faultRow) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range ids {
		if _, ok := r.done[id]; !ok {
			return false
		}
	}
	return true
}

func TestLiveProcessParallelAcrossACleanRestart(t *testing.T) {
	e := newLive(t)
	cfg := e.config(ModeHybrid)
	cfg.StartFromBeginning = true
	writers := e.startWriters(4, 2*time.Millisecond)
	rec := newProcRecorder(t)
	opts := ProcessOptions{Workers: 8, Key: rec.key, MaxInFlight: 64}

	runFor := func(until func() bool) {
		rec.next()
		w := e.start(cfg)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- w.Process(ctx, opts, rec.handle) }()
		waitFor(t, until)
		cancel()
		require.NoError(t, <-errc)
		require.Zero(t, w.Stats().Process.InFlight)
		require.NoError(t, w.Close(context.Background()))
	}
	start := time.Now()
	runFor(func() bool { return time.Since(start) > 1500*time.Millisecond }) // stopped while writers write
	writers.stop()
	writers.mu.Lock()
	committed := writers.rows
	writers.mu.Unlock()
	require.NotEmpty(t, committed)
	runFor(func() bool { return rec.handledAll(committed) })

	rec.check()
	handledFirst := 0
	for _, run := range rec.done {
		if run == 1 {
			handledFirst++
		}
	}
	require.Positive(t, handledFirst, "the first run handled events")
	require.Less(t, handledFirst, len(committed), "the second run had events to handle")
	t.Logf("%d rows committed, %d handled before the restart", len(committed), handledFirst)
}
