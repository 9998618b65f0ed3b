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
