package pgchangestream

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// procRecorder records, per run of Process, the events each key was given in delivery order
// (Key is called by the engine in receipt order) and the events its handlers finished, and
// checks that no two handlers of one key run at once. It is fed by the hooks key and handle, or
// by gave, begin and end (a consumer in a child process reports its hooks on its output).
type procRecorder struct {
	t     *testing.T
	keyOf func(id int64) string        // the event's key; default id % 37
	pause func(id int64) time.Duration // how long a handler of id takes; default up to 1.5 ms

	mu        sync.Mutex
	run       int
	running   map[string]bool
	order     [][]int64            // per run, the events given, in delivery order
	given     []map[string][]int64 // per run, per key, in delivery order
	handled   []map[string][]int64 // per run, per key, in the order the handlers finished
	crashed   []bool               // per run: it ended in a crash, so replays are allowed
	done      map[int64]int        // handled events, and the run that handled them first
	outOfBand map[int64]bool       // events finished outside the recorder (parked, reruns)
	queued    int                  // events given while an earlier one of their key was unfinished
}

func newProcRecorder(t *testing.T) *procRecorder {
	return &procRecorder{t: t, running: map[string]bool{}, done: map[int64]int{}, outOfBand: map[int64]bool{},
		keyOf: func(id int64) string { return strconv.FormatInt(id%37, 10) },
		pause: func(int64) time.Duration { return time.Duration(rand.IntN(1500)) * time.Microsecond }}
}

// next starts recording a new run.
func (r *procRecorder) next() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.run++
	r.order = append(r.order, nil)
	r.given = append(r.given, map[string][]int64{})
	r.handled = append(r.handled, map[string][]int64{})
	r.crashed = append(r.crashed, false)
}

// crash records that the current run ended in a crash: the next may replay finished events.
func (r *procRecorder) crash() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.crashed[r.run-1] = true
	clear(r.running) // the crashed run's handlers are gone
}

// skip exempts id from the checks: it is finished outside the recorder (parked, or rerun).
func (r *procRecorder) skip(id int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outOfBand[id] = true
}

func (r *procRecorder) key(ev EventWithToken) string { return r.gave(tokenID(r.t, ev)) }

// gave records that the engine took id, and returns its key.
func (r *procRecorder) gave(id int64) string {
	k := r.keyOf(id)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.order[r.run-1] = append(r.order[r.run-1], id)
	if len(r.given[r.run-1][k]) > len(r.handled[r.run-1][k]) {
		r.queued++
	}
	r.given[r.run-1][k] = append(r.given[r.run-1][k], id)
	return k
}

func (r *procRecorder) handle(_ context.Context, ev EventWithToken) error {
	id := tokenID(r.t, ev)
	r.begin(id)
	time.Sleep(r.pause(id))
	r.end(id)
	return nil
}

// begin records that a handler of id started.
func (r *procRecorder) begin(id int64) {
	k := r.keyOf(id)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running[k] {
		r.t.Errorf("two handlers of key %s at once (the second of event %d)", k, id)
	}
	r.running[k] = true
}

// end records that the handler of id finished successfully.
func (r *procRecorder) end(id int64) {
	k := r.keyOf(id)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running[k] = false
	r.handled[r.run-1][k] = append(r.handled[r.run-1][k], id)
	if _, ok := r.done[id]; !ok {
		r.done[id] = r.run
	}
}

// finishedBy reports whether id was handled in run or before, or finished outside the recorder.
func (r *procRecorder) finishedBy(id int64, run int) bool {
	first, ok := r.done[id]
	return r.outOfBand[id] || ok && first <= run
}

// check checks each run: per key, the handlers finished the events in delivery order (a prefix:
// a stop may leave the tail unrun). Between runs it checks the low-water mark: every event given
// and not finished is given again in the next run; the events of a key given again are a suffix
// of its deliveries in the run before, starting at or before its first unfinished event; and
// after a run that did not crash, a finished event is given again only if an event given before
// it in that run (of any key) was unfinished.
func (r *procRecorder) check() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for run := range r.run {
		for k, given := range r.given[run] {
			given = slices.DeleteFunc(slices.Clone(given), func(id int64) bool { return r.outOfBand[id] })
			handled := r.handled[run][k]
			require.LessOrEqual(r.t, len(handled), len(given), "run %d, key %s: handled %v, given %v", run+1, k, handled, given)
			if len(handled) > 0 {
				require.Equal(r.t, given[:len(handled)], handled, "run %d, key %s: per-key delivery order", run+1, k)
			}
		}
		if run+1 == r.run {
			break
		}
		again := map[int64]bool{}
		for _, id := range r.order[run+1] {
			again[id] = true
		}
		firstUnfinished := len(r.order[run])
		for i, id := range r.order[run] {
			if !r.finishedBy(id, run+1) {
				require.True(r.t, again[id], "event %d, unfinished in run %d, is not given in run %d", id, run+1, run+2)
				firstUnfinished = min(firstUnfinished, i)
			} else if again[id] && !r.crashed[run] && i < firstUnfinished && !r.outOfBand[id] {
				r.t.Errorf("event %d, finished in run %d before a stop with nothing unfinished before it, was given again in run %d", id, run+1, run+2)
			}
		}
		for k, given := range r.given[run] {
			s := slices.IndexFunc(given, func(id int64) bool { return again[id] })
			if s < 0 {
				continue
			}
			for _, id := range given[s:] {
				require.True(r.t, again[id], "run %d, key %s: replays %v are not a suffix of the deliveries %v", run+2, k, r.given[run+1][k], given)
			}
			u := slices.IndexFunc(given, func(id int64) bool { return !r.finishedBy(id, run+1) })
			require.True(r.t, u < 0 || s <= u, "run %d, key %s: replays start after the first unfinished event", run+2, k)
		}
	}
}

// handledAll reports whether every id of ids was handled (or finished outside the recorder).
func (r *procRecorder) handledAll(ids map[int64]faultRow) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range ids {
		if !r.finishedBy(id, r.run) {
			return false
		}
	}
	return true
}

// handledCount returns how many events were handled.
func (r *procRecorder) handledCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.done)
}

// queuedBehind returns how many events were given while an earlier event of their key was
// unfinished: the events whose order and exclusion the engine had to hold.
func (r *procRecorder) queuedBehind() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.queued
}

// replays returns how many events were given in a run after being handled in an earlier one.
func (r *procRecorder) replays() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for run, order := range r.order {
		for _, id := range order {
			if first, ok := r.done[id]; ok && first <= run {
				n++
			}
		}
	}
	return n
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
