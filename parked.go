package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/pgchangestream/pgchangestream/internal/deadletter"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

// ParkedEvent is one event in the dead-letter table of a client (see admin.ListParked). Its
// fields: ID (the parked row's id), Client, Key, Table (ns.coll of the event), ChangelogID (the
// changelog id, the resume token), Event (the document as delivered), Error (the last handler
// error), Attempts, Blocking (parked under BlockOnFailure: holds its key), RetryRequested (an
// operator asked to run it again) and ParkedAt.
type ParkedEvent = deadletter.Event

// parkedStore is a client's dead-letter table as Process uses it: the watcher's (fencedParks)
// or the test kit's in-memory one.
type parkedStore interface {
	// Park inserts p (ID and ParkedAt are filled by the store) and returns its id.
	Park(ctx context.Context, p ParkedEvent) (int64, error)
	// BlockedKeys returns the keys that have a Blocking parked event.
	BlockedKeys(ctx context.Context) ([]string, error)
	// Released returns the parked events an operator asked to retry, oldest first, at most limit.
	Released(ctx context.Context, limit int) ([]ParkedEvent, error)
	// KeyEvents returns every parked event of key, oldest first.
	KeyEvents(ctx context.Context, key string) ([]ParkedEvent, error)
	// Repark records a failed rerun of a parked event: new error and attempts, RetryRequested cleared.
	Repark(ctx context.Context, id int64, attempts int, errText string) error
	// Finish deletes a parked event that ran successfully.
	Finish(ctx context.Context, id int64) error
}

// blockedKeyError is the Error of an event parked without running because an earlier parked
// event blocks its key.
const blockedKeyError = "not run: an earlier event of its key is parked under BlockOnFailure"

// deadLetters adapts a parkedStore to the processing engine's store.
type deadLetters struct {
	client string
	s      parkedStore
}

var _ procrun.Store[EventWithToken] = deadLetters{}

func (d deadLetters) Park(ctx context.Context, j *procrun.Job[EventWithToken], blocking bool) error {
	id, _, _ := position.ParseToken(j.Ev.ResumeToken)
	errText := blockedKeyError
	if j.LastErr != nil {
		errText = j.LastErr.Error()
	}
	_, err := d.s.Park(ctx, ParkedEvent{Client: d.client, Key: j.Key, Table: eventTable(j.Ev), ChangelogID: id,
		Event: j.Ev.Event, Error: errText, Attempts: j.Attempts, Blocking: blocking})
	return err
}

func (d deadLetters) BlockedKeys(ctx context.Context) ([]string, error) { return d.s.BlockedKeys(ctx) }

func (d deadLetters) Released(ctx context.Context, limit int) ([]procrun.Parked[EventWithToken], error) {
	ps, err := d.s.Released(ctx, limit)
	return toParked(ps), err
}

func (d deadLetters) KeyEvents(ctx context.Context, key string) ([]procrun.Parked[EventWithToken], error) {
	ps, err := d.s.KeyEvents(ctx, key)
	return toParked(ps), err
}

func (d deadLetters) Repark(ctx context.Context, j *procrun.Job[EventWithToken]) error {
	return d.s.Repark(ctx, j.Parked, j.Attempts, j.LastErr.Error())
}

func (d deadLetters) Finish(ctx context.Context, id int64) error { return d.s.Finish(ctx, id) }

// toParked turns parked rows into reruns: the event as delivered, with its token.
func toParked(ps []ParkedEvent) []procrun.Parked[EventWithToken] {
	out := make([]procrun.Parked[EventWithToken], len(ps))
	for i, p := range ps {
		out[i] = procrun.Parked[EventWithToken]{ID: p.ID, Key: p.Key, Blocking: p.Blocking,
			Ev: EventWithToken{Event: p.Event, ResumeToken: position.FormatToken(p.ChangelogID)}}
	}
	return out
}

// ownership is Process's view of whether the watcher owns its events now, and the generation of
// that ownership (procrun.Hooks.Owner): a watcher owns them while it delivers (an exclusive one
// while it holds the lock, not as a standby nor once it lost it); a Shared member also only while
// its lease holds and it has not stopped owning its ranges (fenced off, or left).
func (w *Watcher) ownership() (gen uint64, owns bool) {
	gen, owns = w.ownGen.Load(), w.excl.isActive()
	if w.sh != nil {
		owns = owns && w.sh.leaseValid() && w.sh.lost.Err() == nil
	}
	return gen, owns
}

// gateOwnership wraps run so that an event runs only on its owner. A delivery does not start
// once the watcher stopped owning its events (it lost its lock or was fenced off: its successor
// delivers it again), which stops the run. A rerun of a parked event runs only while the watcher
// owns the event (startRerun); one of a released held key's events that is not the watcher's to
// run asks again for its run, so the owner goes on with the release where this watcher stopped.
func (w *Watcher) gateOwnership(run func(context.Context, *procrun.Job[EventWithToken]) error) func(context.Context, *procrun.Job[EventWithToken]) error {
	return func(ctx context.Context, j *procrun.Job[EventWithToken]) error {
		if j.Parked == 0 {
			if err := w.excl.lostErr(); err != nil {
				return procrun.Fatal(err)
			}
			return run(ctx, j)
		}
		err := w.rerun(ctx, j, run)
		if errors.Is(err, procrun.ErrNotOwned) && j.Blocking {
			// One of a held key's parked events, loaded by its release: the key stays held
			// until the owner goes on with the release from this event.
			if err := w.deadLetterTable().Request(ctx, j.Parked); err != nil && !errors.Is(err, ErrNotParked) {
				return err
			}
		}
		return err
	}
}

// rerun runs j, a rerun of a parked event, with run if the watcher owns its event (startRerun).
// One that fails after the watcher stopped owning the event (its context ended then) is not
// parked again either: procrun.ErrNotOwned leaves it released for its owner.
func (w *Watcher) rerun(ctx context.Context, j *procrun.Job[EventWithToken], run func(context.Context, *procrun.Job[EventWithToken]) error) error {
	end, err := w.startRerun(ctx, j.Ev)
	if err != nil {
		return err
	}
	defer end()
	if err := run(ctx, j); err != nil {
		if _, owns := w.ownership(); !owns {
			return procrun.ErrNotOwned
		}
		return err
	}
	return nil
}

// startRerun lets a rerun of a parked event start only while the watcher owns the event (see
// ownership); a Shared member also only while no hand-over is under way and it owns the range of
// the event's changelog row, in its view and in the range table (where another member may have
// claimed it while this one's lease had run out); any member may run an event whose row is
// gone. Otherwise it returns procrun.ErrNotOwned: the rerun is dropped, the parked event stays
// released, and its owner runs it. A Shared member's rerun counts as running until end is
// called: a hand-over waits for it before it gives ranges up.
func (w *Watcher) startRerun(ctx context.Context, ev EventWithToken) (end func(), err error) {
	if _, owns := w.ownership(); !owns {
		return nil, procrun.ErrNotOwned
	}
	if w.sh == nil {
		return func() {}, nil
	}
	id, _, err := position.ParseToken(ev.ResumeToken)
	if err != nil {
		return nil, err
	}
	rangeNo, owned := -1, true
	err = w.cfg.DB.QueryRowContext(ctx, w.sh.q.rerunOwned, w.cfg.ClientName, w.sh.id.Load(), id).Scan(&rangeNo, &owned)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("pgchangestream: find the range of parked event %d: %w", id, err)
	}
	s := w.sh
	s.rerunMu.Lock()
	defer s.rerunMu.Unlock()
	if s.handing || !s.leaseValid() || !owned || (rangeNo >= 0 && !slices.Contains(s.view.Load().owned, rangeNo)) {
		return nil, procrun.ErrNotOwned
	}
	s.reruns++
	return func() {
		s.rerunMu.Lock()
		s.reruns--
		s.rerunMu.Unlock()
	}, nil
}

// holdReruns starts (on) or ends a hand-over for the reruns of parked events: while it is under
// way none starts. Reader goroutine only.
func (s *sharedMember) holdReruns(on bool) {
	s.rerunMu.Lock()
	s.handing = on
	s.rerunMu.Unlock()
}

// rerunsIdle reports whether no rerun of a parked event runs.
func (s *sharedMember) rerunsIdle() bool {
	s.rerunMu.Lock()
	defer s.rerunMu.Unlock()
	return s.reruns == 0
}
