package pgchangestreamtest

import (
	"context"
	"errors"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/internal/procface"
	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

// events are what the dead-letter adapter needs of an EventWithToken.
var events = procface.Events[pgchangestream.EventWithToken]{Doc: func(ev pgchangestream.EventWithToken) map[string]any { return ev.Event },
	Token: func(ev pgchangestream.EventWithToken) []byte { return ev.ResumeToken },
	Make: func(doc map[string]any, tok []byte) pgchangestream.EventWithToken {
		return pgchangestream.EventWithToken{Event: doc, ResumeToken: tok}
	}}

// errProcessRunning is returned by a Process called while another runs on the same fake.
var errProcessRunning = errors.New("pgchangestreamtest: Process is already running on this fake")

// Process handles the fake's events as [pgchangestream.Watcher.Process] does, on the watcher's
// own engine and with the same options, defaults and errors: up to Workers handlers at once,
// one at a time per key and in delivery order within a key, retries with the options' backoff,
// back-pressure at MaxInFlight, the failure policies, the grace period and the shutdown. Its
// acknowledgement is the watcher's low-water mark: when an event and every event delivered
// before it finished, it acknowledges them as MarkProcessed does ([FakeWatcher.Acked],
// [FakeWatcher.Saved] and Stats follow; [FakeWatcher.Marks] lists only MarkProcessed calls).
// Each advance saves at once, where the watcher saves one checkpoint at a time, each covering
// every advance before it; a failed save ([FakeWatcher.FailSaves]) keeps the acknowledgement,
// and the next advance, MarkProcessed or Process's final save includes it.
//
// ParkOnFailure and BlockOnFailure park events in the fake's in-memory dead-letter table:
// [FakeWatcher.Parked] lists it, [FakeWatcher.RetryParked] and [FakeWatcher.DropParked] act as
// the operator's admin.RetryParked and admin.DropParked, and a running Process looks at it
// every ParkedPollInterval. Parked events keep their documents as delivered (the watcher's
// table stores them as JSON).
//
// Process needs a started fake and must be the only reader of Events. It returns when ctx ends
// (nil, or the final save's error), when Events closes (Close, CloseWhenDelivered: nil) or when
// a handler fails under StopOnFailure (an error wrapping the handler's, naming the key and the
// token); with CloseWhenDelivered, it returns once the events it took are handled, so a test or
// an example needs no goroutine. Stats().Process has the engine's counters.
func (f *FakeWatcher) Process(ctx context.Context, opts pgchangestream.ProcessOptions, handle pgchangestream.Handler) error {
	var refuse error
	if handle == nil {
		refuse = procface.ErrNilHandler
	}
	o, err := procface.Check(procface.Options[pgchangestream.EventWithToken, pgchangestream.FailurePolicy](opts), refuse, pgchangestream.DocumentKey)
	if err != nil {
		return err
	}
	f.mu.Lock()
	started := f.started
	f.mu.Unlock()
	if !started {
		return errors.New("pgchangestreamtest: Process: the fake is not started")
	}
	if !f.processing.CompareAndSwap(false, true) {
		return errProcessRunning
	}
	defer f.processing.Store(false)
	var store procrun.Store[pgchangestream.EventWithToken]
	if o.OnFailure != pgchangestream.StopOnFailure {
		store = procface.DeadLetters[pgchangestream.EventWithToken]{Client: f.cfg.ClientName, Store: f.parked, Events: events}
	}
	run := func(ctx context.Context, j *procrun.Job[pgchangestream.EventWithToken]) error {
		return procface.RunHandler(ctx, f.log, handle, j.Ev)
	}
	h := procrun.Hooks[pgchangestream.EventWithToken]{Run: run, Advance: f.advance, Store: store, Stats: &f.procStats}
	err = procface.Run(ctx, f.log, f.events, o, h, pgchangestream.DocumentKey, events.Token)
	f.mu.Lock()
	saveErr := f.saveLocked()
	f.mu.Unlock()
	return errors.Join(err, saveErr)
}

// advance acknowledges the delivery of last, the newest event of the finished prefix, and
// saves; it runs on the engine's goroutine.
func (f *FakeWatcher) advance(last pgchangestream.EventWithToken) {
	id, ok, _ := position.ParseToken(last.ResumeToken)
	f.mu.Lock()
	defer f.mu.Unlock()
	if ok {
		f.ackLocked(id)
	}
	_ = f.saveLocked() // a failure is counted in Stats; the next save includes this acknowledgement
}
