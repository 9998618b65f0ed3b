package pgchangestream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/document"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/internal/procface"
	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

// Handler handles one event for [Watcher.Process]. A nil error finishes the event; an error (or
// a panic, recovered as an error wrapping [ErrPanic]) is retried. ctx is cancelled when Process
// stops and the grace period is over: a handler must return then. A [Config.Shared] member's
// handlers also find ctx done once its lease may have run out (checked at each Done or Err,
// so a process frozen past its lease finds it done when it wakes), and once the member left the
// members at Close; an exclusive watcher's find it done once the watcher lost its lock: use ctx
// in the handler's calls so they fail rather than act after another watcher took the key over.
type Handler func(ctx context.Context, ev EventWithToken) error

// FailurePolicy says what Process does with an event whose handler failed
// [ProcessOptions.MaxAttempts] times.
type FailurePolicy int

const (
	// StopOnFailure (the default): Process stops and returns the handler's error, wrapped with
	// the event's key and token. The event is not acknowledged, so it is delivered again.
	StopOnFailure FailurePolicy = iota
	// ParkOnFailure parks the event in the dead-letter table and goes on with its key. A park
	// is fenced as a save is: an exclusive watcher's only while the token row holds its owner
	// epoch, a Shared member's only while it owns the event's range. A park refused because a
	// later owner took the event over stops Process with an error wrapping [ErrFenced], the
	// event unfinished (its new owner runs it).
	ParkOnFailure
	// BlockOnFailure parks the event and every later event of its key (without running them)
	// until an operator releases the key; the key's parked events then run again, in order. The
	// key stays held on the watcher that takes its events over (exclusive fail-over, Shared
	// hand-over).
	BlockOnFailure
)

// Defaults of [ProcessOptions].
const (
	DefaultProcessMaxInFlight = procface.DefaultMaxInFlight        // 1000
	DefaultProcessMaxAttempts = procface.DefaultMaxAttempts        // 5
	DefaultRetryMinBackoff    = procface.DefaultRetryMinBackoff    // 100ms
	DefaultRetryMaxBackoff    = procface.DefaultRetryMaxBackoff    // 30s
	DefaultGracePeriod        = procface.DefaultGracePeriod        // 10s
	DefaultParkedPollInterval = procface.DefaultParkedPollInterval // 5s
)

// ProcessOptions configure [Watcher.Process]. Zero values take the defaults; negative values
// are invalid.
type ProcessOptions struct {
	Workers int // handlers at once; default 1
	// Key: events of one key run one at a time, in delivery order; default DocumentKey.
	// Events of different keys run in parallel. Events whose key is "" share that one key.
	Key func(EventWithToken) string
	// MaxInFlight is the number of events taken from Events and not finished; at it, Process
	// stops reading (back-pressure), so memory is bounded for any backlog and any hot key, and
	// a crash replays at most that many finished events. With MaxDeferred, it bounds the full
	// events (with their documents) only. Default DefaultProcessMaxInFlight (or Workers, if
	// more); at least Workers.
	MaxInFlight int
	// MaxDeferred, when above 0, lets the other keys flow past a hot key: a key's events past
	// MaxKeyQueue are deferred, kept as a compact handle (token and key, tens of bytes) and read
	// again from the changelog by id, their document built as the reader built it, when they
	// are next of their key. MaxDeferred bounds the deferred events (at it, Process stops
	// reading too). Default 0: no event is deferred, and a key holding MaxInFlight unfinished
	// events holds the other keys to its pace.
	MaxDeferred int
	// MaxKeyQueue is how many full events one key holds before its later ones are deferred
	// (with MaxDeferred only). Default MaxInFlight / (2 × Workers), at least 1: when
	// MaxInFlight stops reading, at least 2 × Workers keys have work.
	MaxKeyQueue int
	// MaxAttempts is the attempts of one event before OnFailure applies; default 5.
	MaxAttempts int
	// RetryMinBackoff and RetryMaxBackoff bound the capped, jittered exponential backoff
	// between attempts (and between tries of a failing dead-letter table); defaults 100ms, 30s.
	RetryMinBackoff, RetryMaxBackoff time.Duration
	OnFailure                        FailurePolicy
	// GracePeriod is how long a stop waits for running handlers before cancelling their
	// context; default 10s.
	GracePeriod time.Duration
	// ParkedPollInterval is how often ParkOnFailure and BlockOnFailure look for parked events an
	// operator released; default 5s.
	ParkedPollInterval time.Duration
}

// options returns o as the shared face's options.
func (o ProcessOptions) options() procface.Options[EventWithToken, FailurePolicy] {
	return procface.Options[EventWithToken, FailurePolicy](o)
}

// events are what the dead-letter adapter needs of an EventWithToken.
var events = procface.Events[EventWithToken]{
	Doc:   func(ev EventWithToken) map[string]any { return ev.Event },
	Token: func(ev EventWithToken) []byte { return ev.ResumeToken },
	Make: func(doc map[string]any, token []byte) EventWithToken {
		return EventWithToken{Event: doc, ResumeToken: token}
	},
}

// errProcessRunning is returned by a Process called while another runs on the same watcher.
var errProcessRunning = errors.New("pgchangestream: Process is already running on this watcher")

// Process handles the watcher's events in parallel: up to Workers handlers at once, one at a
// time per key and in delivery order within a key, and acknowledges them itself. The
// acknowledgement is a low-water mark: an event is acknowledged (and the checkpoint saved, one
// save at a time) only when it and every event delivered before it finished, so a restart never
// replays a finished prefix and never skips an unfinished event. A failed handler is retried for
// its key only, with capped jittered backoff, while other keys go on; after MaxAttempts,
// OnFailure applies.
//
// Process needs a started watcher and must be the only reader of [Watcher.Events]: an event read
// by the caller would be certified by Process's acknowledgements. Only one Process runs on a
// watcher at a time.
//
// Process returns when ctx ends (nil, or the final save's error), when the watcher stops
// (Events closed: [Watcher.Err], or nil after Close) or when a handler fails under
// StopOnFailure (an error wrapping the handler's, naming the key and the token). Before
// returning it stops reading, waits up to GracePeriod for running handlers (then cancels their
// context), saves the checkpoint with a bounded context of its own, and waits for every
// goroutine it started.
func (w *Watcher) Process(ctx context.Context, opts ProcessOptions, handle Handler) error {
	var refuse error
	if handle == nil {
		refuse = procface.ErrNilHandler
	}
	return w.runProcess(ctx, opts, refuse, w.handlerStep(handle))
}

// handlerStep is Process's step: the handler, a panic recovered.
func (w *Watcher) handlerStep(handle Handler) processStep {
	return processStep{run: func(ctx context.Context, j *procrun.Job[EventWithToken]) error {
		return w.runHandler(ctx, handle, j.Ev)
	}}
}

// processStep is what differs between Process and ProcessTx: the per-event step, a background
// task (nil for Process) that runs while the engine does and is stopped after the final save,
// and the least time between two saves of acknowledgements with CheckpointInterval 0 (0 for
// Process: the next save starts as soon as the last one ended).
type processStep struct {
	run        func(ctx context.Context, j *procrun.Job[EventWithToken]) error
	background func(ctx context.Context) (stop func())
	saveGap    time.Duration
}

// runProcess checks the call (refuse is the caller's own objection, if any), then runs the
// engine with step; see Process.
func (w *Watcher) runProcess(ctx context.Context, opts ProcessOptions, refuse error, step processStep) error {
	if w.cfgErr != nil {
		return w.cfgErr
	}
	o, err := procface.Check(opts.options(), refuse, DocumentKey)
	if err != nil {
		return err
	}
	opts = ProcessOptions(o)
	w.lifeMu.Lock()
	started := w.started
	w.lifeMu.Unlock()
	if !started {
		return errors.New("pgchangestream: Process: the watcher is not started")
	}
	if !w.processing.CompareAndSwap(false, true) {
		return errProcessRunning
	}
	defer w.processing.Store(false)
	if opts.MaxInFlight+cap(w.events) > w.cfg.MaxPending {
		w.log.Warn("ProcessOptions.MaxInFlight and Config.BufferSize exceed Config.MaxPending: the oldest deliveries may be evicted into the floor, which holds the checkpoint until a later acknowledgement",
			"max_in_flight", opts.MaxInFlight, "buffer_size", cap(w.events), "max_pending", w.cfg.MaxPending)
	}
	err = w.process(ctx, w.events, opts, step)
	if ctx.Err() == nil && err == nil { // Events closed: the watcher stopped
		return w.Err()
	}
	return err
}

// process runs the engine over src with step and saves at the end; see Process.
func (w *Watcher) process(ctx context.Context, src <-chan EventWithToken, o ProcessOptions, step processStep) error {
	var store procrun.Store[EventWithToken]
	if o.OnFailure != StopOnFailure {
		store = procface.DeadLetters[EventWithToken]{Client: w.cfg.ClientName, Store: w.parkedStore(), Events: events}
	}
	if step.background != nil {
		defer step.background(ctx)()
	}
	s := w.startAckSaver(ctx, step.saveGap)
	err := w.runEngine(ctx, src, o, w.gateOwnership(step.run), store, s.ack, w.restoreEvent, w.ownership)
	s.stop()
	saveCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), backgroundSaveTimeout)
	defer cancel()
	saveErr := w.saveCheckpoint(saveCtx, saveChanged)
	return joinErrors(err, saveErr)
}

// runEngine runs the engine over src with o (defaults filled in), the per-event step run, the
// dead-letter store (nil under StopOnFailure), advance, told of each advance of the mark, and
// restore, which reads a deferred event again (nil, or MaxDeferred 0: no event is deferred), and
// owner, which says whether the watcher owns its events (procrun.Hooks.Owner; nil: always).
// The engine itself, with the options, the key's panics and the failure wrap, is procface's,
// which the test kit's fake runs its Process on too.
func (w *Watcher) runEngine(ctx context.Context, src <-chan EventWithToken, o ProcessOptions,
	run func(context.Context, *procrun.Job[EventWithToken]) error, store procrun.Store[EventWithToken],
	advance func(EventWithToken), restore func(context.Context, EventWithToken) (EventWithToken, error),
	owner func() (uint64, bool)) error {
	storeLog := newRepeatLog(w.log, slog.LevelWarn, "dead-letter table call failed; trying again")
	restoreLog := newRepeatLog(w.log, slog.LevelWarn, "cannot read a deferred event's changelog row again; trying again")
	h := procrun.Hooks[EventWithToken]{
		Run:     run,
		Advance: advance,
		Store:   store,
		Stats:   &w.procStats,
		Owner:   owner,
		StoreFailed: func(err error, failures int) {
			w.health.failRetry(opPark, fmt.Errorf("%s: %w", opPark, err), failures == 1)
			storeLog.fail("error", err)
		},
		StoreRecovered: func() {
			w.health.endRetry(opPark)
			storeLog.ok()
		},
	}
	if restore != nil && o.MaxDeferred > 0 {
		h.Defer, h.Restore = deferEvent, restore
		h.RestoreFailed = func(key string, err error) {
			restoreLog.fail("key", key, "error", err)
		}
	}
	return procface.Run(ctx, w.log, src, o.options(), h, DocumentKey, events.Token)
}

// deferEvent is the compact form of a deferred event: its token only (the engine keeps its key).
func deferEvent(ev EventWithToken) EventWithToken {
	return EventWithToken{ResumeToken: ev.ResumeToken}
}

// restoreEvent reads a deferred event's changelog row again by id and builds its event as the
// reader did. The row is there: the deferred event is unfinished, so the saved token has not
// passed it, and Prune deletes only rows every token passed (unless told to ignore this
// client's token).
func (r *reader) restoreEvent(ctx context.Context, c EventWithToken) (EventWithToken, error) {
	id, _, err := position.ParseToken(c.ResumeToken)
	if err != nil {
		return c, err
	}
	rows, err := r.query(ctx, r.q.ByID, nil, rowColumns{}, r.cfg.TableName, id)
	if err != nil {
		return c, fmt.Errorf("read changelog row %d again: %w", id, err)
	}
	if len(rows) == 0 { // deleted by hand, or by a Prune told to ignore this client: it never comes back
		return c, procrun.Fatal(fmt.Errorf("changelog row %d of a deferred event is gone", id))
	}
	ev, _, _ := document.Build(&rows[0], r.cfg.TableName, r.cfg.documents()) // a decode error was logged at delivery
	return EventWithToken{Event: ev, ResumeToken: c.ResumeToken}, nil
}

// runHandler runs handle, recovering a panic into an error wrapping ErrPanic. A Shared member
// first waits for its lease (one paused past it handles nothing when it wakes), and runs handle
// with a context that ends when the lease may have run out (see leaseContext); an exclusive
// watcher runs it with a context that ends when it loses its lock.
func (w *Watcher) runHandler(ctx context.Context, handle Handler, ev EventWithToken) error {
	switch {
	case w.sh != nil:
		if err := w.sh.waitLease(ctx); err != nil {
			return err
		}
		lc, release := w.sh.handlerContext(ctx)
		defer release()
		ctx = lc
	case w.cfg.Exclusive:
		hc, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(w.excl.gone, cancel)
		defer func() {
			stop()
			cancel()
		}()
		ctx = hc
	}
	return procface.RunHandler(ctx, w.log, handle, ev)
}

// DocumentKey is the default [ProcessOptions.Key]: "<ns.coll>/<documentKey._id>", the changed
// row; "" when the event has neither.
func DocumentKey(ev EventWithToken) string {
	table := procface.Table(ev.Event)
	dk, _ := ev.Event["documentKey"].(map[string]any)
	id, ok := dk["_id"]
	if table == "" || !ok || id == nil {
		return ""
	}
	return table + "/" + fmt.Sprint(id)
}

// NodeNameKey is a [ProcessOptions.Key] for health_events: the node name
// ([EventWithToken.GetNodeName]), else DocumentKey.
func NodeNameKey(ev EventWithToken) string {
	if name, err := ev.GetNodeName(); err == nil {
		return name
	}
	return DocumentKey(ev)
}

// ackSaver is Process's side of acknowledgements: the engine calls ack (one call at a time, in
// the mark's order) each time the low-water mark advances; ack acknowledges in memory and wakes the
// saver goroutine, which saves one checkpoint at a time, each covering every acknowledgement
// made before it started. A failed save is retried with backoff; the acknowledgement stays in
// memory meanwhile, and the failure shows in Health and Stats through the save path. A positive
// gap is the least time from the end of one save to the start of the next. With a batched
// Config.CheckpointInterval the watcher's save loop saves, and there is no saver.
type ackSaver struct {
	w      *Watcher
	gap    time.Duration // immutable
	wake   chan struct{} // capacity 1: a save is wanted
	cancel context.CancelFunc
	done   chan struct{} // closed when the saver goroutine exited
}

func (w *Watcher) startAckSaver(ctx context.Context, gap time.Duration) *ackSaver {
	s := &ackSaver{w: w, gap: gap, wake: make(chan struct{}, 1), done: make(chan struct{})}
	ctx, s.cancel = context.WithCancel(ctx)
	if w.cfg.CheckpointInterval > 0 {
		close(s.done)
		return s
	}
	go s.loop(ctx)
	return s
}

// ack acknowledges the delivery of last, the newest event of the finished prefix: the earliest
// pending delivery of its id, which is in the prefix, and every one before it.
func (s *ackSaver) ack(last EventWithToken) {
	if id, ok, _ := position.ParseToken(last.ResumeToken); ok {
		s.w.ack(id)
	}
	select {
	case s.wake <- struct{}{}:
	default: // a save is already wanted: it will cover this one
	}
}

func (s *ackSaver) loop(ctx context.Context) {
	defer close(s.done)
	b := backoff.Backoff{Min: loadRetryMin, Max: loadRetryMax}
	failed := newRepeatLog(s.w.log, slog.LevelWarn, "checkpoint save after Process acknowledgements failed; trying again")
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		}
		for {
			err := s.w.saveInBackground(ctx, saveChanged)
			if err == nil {
				b.Reset()
				failed.ok()
				break
			}
			failed.fail("error", err)
			if !backoff.Sleep(ctx, b.Next()) {
				return
			}
		}
		if s.gap > 0 && !backoff.Sleep(ctx, s.gap) { // a wake meanwhile waits in s.wake
			return
		}
	}
}

// stop ends the saver goroutine and waits for it. Process saves once more after it.
func (s *ackSaver) stop() {
	s.cancel()
	<-s.done
}
