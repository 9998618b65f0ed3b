// Package procrun is the parallel handling runtime behind the watcher's Process: events taken
// from a channel in delivery order are run by a pool of workers, one at a time per key and in
// delivery order within a key, with retries, dead letters and back-pressure, and their
// acknowledgement is the low-water mark of the finished ones (internal/watermark). It knows
// nothing of the database: the run step, the acknowledgement and the dead-letter store are
// given by its caller (the watcher, or the test kit's fake watcher).
//
// The scheduling state (key queues, ready keys, backoffs, the mark, blocked keys) is guarded by
// one mutex. A dispatcher goroutine takes events from the channel, ends backoffs and polls the
// dead-letter store (through a poller goroutine, over channels); a worker that finishes a task
// applies its result and takes the next ready key's head itself, so a busy run passes no event
// through another goroutine between two handlers. Counters for Stats are atomics in [Stats].
package procrun

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
)

// Policy says what happens to an event whose handler failed MaxAttempts times.
type Policy int

// The policies; they mirror the public FailurePolicy.
const (
	Stop  Policy = iota // stop the run with the failure
	Park                // park the event and go on with its key
	Block               // park the event and every later event of its key until released
)

// Options are the run's settings, already validated and defaulted by the caller.
type Options struct {
	Workers     int // jobs run at once
	MaxInFlight int // full events taken from the source and not finished; >= Workers
	// MaxKeyQueue is how many full events one key holds; its later events are deferred (only
	// with Hooks.Defer). MaxDeferred bounds the deferred events: at it, as at MaxInFlight, the
	// engine stops taking events. Both >= 1 when Hooks.Defer is set.
	MaxKeyQueue, MaxDeferred int
	MaxAttempts              int           // attempts of one event before the policy applies
	Policy                   Policy        // after MaxAttempts
	Grace                    time.Duration // how long a stop waits for running jobs before cancelling them
	PollInterval             time.Duration // how often Park and Block look for released parked events
	// Delay is the wait before attempt n+1 after n failed attempts (n >= 1); also between
	// tries of a dead-letter store call that failed.
	Delay func(n int) time.Duration
}

// Job is one event to run: a delivery from the source (Seq > 0) or the rerun of a parked event
// (Parked > 0, Seq 0; reruns are never acknowledged).
type Job[E any] struct {
	Ev       E
	Key      string
	Seq      uint64 // delivery sequence number, in receipt order; 0 for a rerun
	Parked   int64  // id of the parked event this reruns; 0 for a delivery
	Blocking bool   // a rerun of an event parked under Block: failing again blocks its key
	Attempts int    // failed attempts so far (of this run: a rerun starts again at 0)
	LastErr  error  // the last attempt's error
	// Deferred: Ev is the compact form Hooks.Defer made; it is restored before it runs or is
	// parked. restoreFails counts the failed restores in a row, for the backoff.
	Deferred     bool
	restoreFails int
}

// Parked is a parked event as the store returns it.
type Parked[E any] struct {
	ID       int64
	Key      string
	Ev       E
	Blocking bool
}

// Store is the dead-letter store Park and Block use.
type Store[E any] interface {
	// Park parks j after its last failure (blocking: under Block).
	Park(ctx context.Context, j *Job[E], blocking bool) error
	BlockedKeys(ctx context.Context) ([]string, error)
	Released(ctx context.Context, limit int) ([]Parked[E], error)
	KeyEvents(ctx context.Context, key string) ([]Parked[E], error)
	Repark(ctx context.Context, j *Job[E]) error
	Finish(ctx context.Context, id int64) error
}

// Hooks are what the caller plugs in.
type Hooks[E any] struct {
	Key func(E) string
	// Run is the per-event step: call the handler (recovering a panic into an error). A nil
	// error (or ErrDone) finishes the event; an error wrapped by Fatal stops the run; any other
	// error is a failed attempt.
	Run func(ctx context.Context, j *Job[E]) error
	// Advance is called when the mark advances, with the last event of the finished prefix, by
	// the worker that finished the event, under the scheduling lock: calls never overlap and
	// come in the mark's order. It must not block (acknowledge in memory, wake a saver).
	Advance func(last E)
	Store   Store[E] // required by Park and Block
	// StoreFailed, if set, is told of each failed store call (it is tried again after Delay, or,
	// for the poll of released events, at the next poll), with the number of calls of that
	// retry loop failed in a row; StoreRecovered, if set, once such a loop ends after failing
	// (its call succeeded, or the run stopped), so that failures can be shown while they last.
	StoreFailed    func(err error, failures int)
	StoreRecovered func()
	Stats          *Stats // counters; may be shared across runs
	// Defer, if set, returns the compact form of an event taken while its key holds
	// MaxKeyQueue full events (or deferred ones): the mark and the key's queue keep that form
	// until Restore, called on a worker when the event is next of its key, gives the full event
	// back. A failed Restore is told to RestoreFailed (if set) and tried again after Delay, the
	// key waiting meanwhile; it counts no attempt. One that fails with Fatal stops the run.
	// Advance may be given a compact form.
	Defer         func(E) E
	Restore       func(ctx context.Context, compact E) (E, error)
	RestoreFailed func(key string, err error)
	// Owner, if set, says whether the run owns its events now (owns) and the generation of that
	// ownership (gen), which must grow each time the run gains events to own, before any of
	// them is in src. The engine looks at the dead-letter store for released events only while
	// owns. Under Block it loads the held keys when it starts (if it owns its events then), and
	// again before it takes an event while gen differs from the generation of its last load, so
	// that a key another owner held stays held when its events come to this run. Without Owner
	// the run always owns its events and loads the held keys once, when it starts.
	Owner func() (gen uint64, owns bool)
}

// Failure is the error of a run stopped by an event that failed under Stop.
type Failure[E any] struct {
	Key      string
	Ev       E
	Attempts int
	Err      error
}

func (f *Failure[E]) Error() string {
	return fmt.Sprintf("key %q failed %d attempts: %v", f.Key, f.Attempts, f.Err)
}

func (f *Failure[E]) Unwrap() error { return f.Err }

// Run runs events from src until ctx ends (nil), src is closed (nil) or an event fails under
// Stop (a *Failure). On the way out it stops taking events, retrying and polling, and for up to
// Grace goes on running the events it took (so that a quick stop leaves none unfinished); then
// it cancels the jobs' context, waits for the running ones, and returns once every goroutine it
// started has exited. Events not finished are never passed to Advance.
func Run[E any](ctx context.Context, o Options, src <-chan E, h Hooks[E]) error {
	if h.Stats == nil {
		h.Stats = new(Stats)
	}
	if o.Policy != Stop && h.Store == nil {
		return errors.New("procrun: Park and Block need a dead-letter store")
	}
	if h.Defer != nil && (h.Restore == nil || o.MaxKeyQueue < 1 || o.MaxDeferred < 1) {
		return errors.New("procrun: Defer needs Restore, MaxKeyQueue and MaxDeferred")
	}
	jobCtx, cancelJobs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelJobs()
	if h.Owner == nil {
		h.Owner = func() (uint64, bool) { return 0, true }
	}
	d := newDispatcher(o, h, jobCtx)
	if _, owns := h.Owner(); o.Policy == Block && owns && !d.loadHeld(ctx) {
		return nil
	}
	var wg sync.WaitGroup
	for range o.Workers {
		wg.Go(func() {
			for t := range d.work {
				for ok := true; ok; {
					t, ok = d.complete(d.do(jobCtx, t))
				}
			}
		})
	}
	pollCtx, stopPoll := context.WithCancel(ctx)
	if o.Policy != Stop {
		wg.Go(func() { d.pollLoop(pollCtx) })
	}
	err := d.loop(ctx, src, cancelJobs, stopPoll)
	wg.Wait()
	h.Stats.InFlight.Store(0) // gauges of the run in progress
	h.Stats.Busy.Store(0)
	h.Stats.Deferred.Store(0)
	return err
}

// retry calls f until it succeeds or ctx ends, waiting delay between tries and telling h's
// StoreFailed and StoreRecovered (if set) of its failures.
func retry[T, E any](ctx context.Context, delay func(int) time.Duration, h Hooks[E], f func() (T, error)) (T, bool) {
	for n := 1; ; n++ {
		v, err := f()
		if err == nil {
			h.storeRecovered(n - 1)
			return v, true
		}
		h.storeFailed(err, n)
		if !backoff.Sleep(ctx, delay(n)) {
			h.storeRecovered(n)
			return v, false
		}
	}
}

// storeFailed tells StoreFailed, if set, of the failures-th failure in a row of a store call.
func (h Hooks[E]) storeFailed(err error, failures int) {
	if h.StoreFailed != nil {
		h.StoreFailed(err, failures)
	}
}

// storeRecovered tells StoreRecovered, if set, that a loop with failures failed calls ended.
func (h Hooks[E]) storeRecovered(failures int) {
	if failures > 0 && h.StoreRecovered != nil {
		h.StoreRecovered()
	}
}
