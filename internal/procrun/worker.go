package procrun

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// do is one worker's handling of a task; it runs on a worker goroutine and touches only the
// task's job (which no other goroutine touches while it is out) and the atomic counters.
func (d *dispatcher[E]) do(ctx context.Context, t task[E]) result[E] {
	j, s := t.job, d.h.Stats
	r := result[E]{task: t, outcome: abandoned}
	// store calls a dead-letter store method until it succeeds (true) or ctx ends; an error
	// wrapped by Fatal is not retried: it fails the event, as under Stop.
	store := func(f func() error) bool {
		var fatal fatalError
		_, ok := retry(ctx, d.o.Delay, d.h, func() (struct{}, error) {
			err := f()
			if errors.As(err, &fatal) {
				return struct{}{}, nil
			}
			return struct{}{}, err
		})
		if fatal.err != nil {
			j.LastErr = fatal.err
			r.outcome = failed
			return false
		}
		return ok
	}
	if j.Deferred {
		ev, err := d.h.Restore(ctx, j.Ev)
		var fatal fatalError
		if errors.As(err, &fatal) { // it can never be restored: the run stops
			j.LastErr = fatal.err
			r.outcome = failed
			return r
		}
		if err != nil {
			j.restoreFails++
			if d.h.RestoreFailed != nil {
				d.h.RestoreFailed(j.Key, err)
			}
			if ctx.Err() == nil {
				r.outcome = unrestored
			}
			return r
		}
		j.Ev, j.Deferred, j.restoreFails = ev, false, 0
	}
	switch t.kind {
	case releaseJob:
		var ok bool
		if r.reruns, ok = retry(ctx, d.o.Delay, d.h, func() ([]Parked[E], error) { return d.h.Store.KeyEvents(ctx, j.Key) }); ok {
			r.outcome = loaded
		}
		return r
	case parkJob:
		if store(func() error { return d.h.Store.Park(ctx, j, true) }) {
			s.Parked.Add(1)
			r.outcome = finished
		}
		return r
	}
	start := time.Now()
	err := d.h.Run(ctx, j)
	s.HandlerTime.Add(int64(time.Since(start)))
	var fatal fatalError
	switch {
	case j.Parked > 0 && errors.Is(err, ErrNotOwned):
		r.outcome = finished
		if j.Blocking {
			r.outcome = blockKey
		}
		return r
	case errors.As(err, &fatal):
		j.Attempts++
		j.LastErr = fatal.err
		r.outcome = failed
		return r
	case err == nil || errors.Is(err, ErrDone):
		if err == nil {
			s.Handled.Add(1)
		} else {
			s.Done.Add(1)
		}
		if j.Parked == 0 || store(func() error { return d.h.Store.Finish(ctx, j.Parked) }) {
			r.outcome = finished
		}
		return r
	}
	j.Attempts++
	j.LastErr = err
	switch {
	case ctx.Err() != nil: // stopped past the grace period: the failure may be the cancellation
	case j.Attempts < d.o.MaxAttempts:
		r.outcome = retryIt
	case j.Parked > 0:
		if store(func() error { return d.h.Store.Repark(ctx, j) }) {
			r.outcome = finished
			if j.Blocking {
				r.outcome = blockKey
			}
		}
	case d.o.Policy == Stop:
		r.outcome = failed
	default:
		blocking := d.o.Policy == Block
		if store(func() error { return d.h.Store.Park(ctx, j, blocking) }) {
			s.Parked.Add(1)
			r.outcome = finished
			if blocking {
				r.outcome = blockKey
			}
		}
	}
	return r
}

// ErrNotOwned, returned (wrapped or not) by Run for a rerun, says the run no longer owns the
// parked event (another owner runs it): the rerun is dropped without running and its parked
// event is left as it is. A blocking rerun's key is held again, its other reruns dropped too, so
// that none of them runs ahead of it.
var ErrNotOwned = errors.New("procrun: the run does not own the parked event")

// ErrDone, returned (wrapped or not) by Run, says the event was done already, without running
// its handler: it finishes as a success does, and counts in Stats.Done instead of Handled.
var ErrDone = errors.New("procrun: the event was done already")

// Fatal wraps a Run error that must be neither retried nor parked, or a Store or Restore error
// that must not be retried: the run stops with it at once (a *Failure whose Err is err),
// whatever the policy and the attempts left.
func Fatal(err error) error { return fatalError{err} }

type fatalError struct{ err error }

func (f fatalError) Error() string { return f.err.Error() }
func (f fatalError) Unwrap() error { return f.err }

// Stats are the run's counters, safe for concurrent use: the gauges are stored under the
// scheduling lock, the counters added by workers, the longest queue noted under mu.
type Stats struct {
	InFlight    atomic.Int64  // deliveries taken and not finished
	Deferred    atomic.Int64  // of those, the deferred ones not being restored
	Busy        atomic.Int64  // tasks at workers
	Handled     atomic.Uint64 // handler runs that succeeded
	Done        atomic.Uint64 // runs that found their event done already (ErrDone)
	Retries     atomic.Uint64 // failed attempts retried
	Parked      atomic.Uint64 // events parked
	HandlerTime atomic.Int64  // nanoseconds spent in handlers

	longestN   atomic.Int64 // copy of longest, so that a shorter queue is noted without the lock
	mu         sync.Mutex
	longest    int
	longestKey string
}

// noteQueue records a key's queue length if it is the longest seen.
func (s *Stats) noteQueue(key string, n int) {
	if int64(n) <= s.longestN.Load() {
		return
	}
	s.longestN.Store(int64(n))
	s.mu.Lock()
	defer s.mu.Unlock()
	if n > s.longest {
		s.longest, s.longestKey = n, key
	}
}

// Longest returns the longest queue of one key seen, and its key.
func (s *Stats) Longest() (int, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.longest, s.longestKey
}
