package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/pgchangestream/pgchangestream/internal/deadletter"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/internal/procface"
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
			if err := w.cfg.deadLetterTable().Request(ctx, j.Parked); err != nil && !errors.Is(err, ErrNotParked) {
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

// deadLetterTable returns the dead-letter table of cfg's client, unfenced.
func (cfg *Config) deadLetterTable() *deadletter.Store {
	return deadletter.New(cfg.DB, cfg.ChangelogTable, cfg.ClientName)
}

// parkedStore returns the dead-letter table of the watcher's client, its parks fenced as the
// watcher's saves are (fencedParks).
func (w *Watcher) parkedStore() procface.ParkedStore {
	return fencedParks{w.cfg.deadLetterTable(), w}
}

// fencedParks is the dead-letter table of a watcher whose parks are fenced like its saves: an
// exclusive watcher's insert its row only while the token row holds the watcher's owner epoch,
// a Shared member's only while it owns the event's range (each holding that row FOR KEY SHARE
// until the insert commits). So a former owner that wakes up after a hand-over parks nothing:
// its successor runs the event, and no stale row is left for an operator to run again. A
// refused park is ErrFenced, which stops Process; the watcher stops as for a fenced save.
type fencedParks struct {
	*deadletter.Store
	w *Watcher
}

// Park parks p unless a later owner fenced the watcher off, which it returns as a Fatal error.
func (f fencedParks) Park(ctx context.Context, p ParkedEvent) (int64, error) {
	w := f.w
	if w.sh != nil {
		member := w.sh.id.Load()
		id, inserted, err := f.Insert(ctx, p, w.sh.q.parkFence, member)
		if err != nil || inserted {
			return id, err
		}
		var acked, exists bool
		if err := w.cfg.DB.QueryRowContext(ctx, w.sh.q.ackState, w.cfg.ClientName, p.ChangelogID).Scan(&acked, &exists); err != nil {
			return 0, fmt.Errorf("pgchangestream: park event %d wrote nothing; checking why: %w", p.ChangelogID, err)
		}
		if !exists { // its range is unknown: parked as an unshared watcher parks
			return f.Store.Park(ctx, p)
		}
		return 0, procrun.Fatal(w.rangeFenced(member, p.ChangelogID, "parked"))
	}
	w.ckMu.Lock()
	fenced, epoch, err := w.txFenceLocked()
	w.ckMu.Unlock()
	switch {
	case err != nil:
		return 0, procrun.Fatal(err)
	case !fenced:
		return f.Store.Park(ctx, p)
	}
	id, inserted, err := f.Insert(ctx, p, w.q.ParkFence, epoch)
	if err != nil || inserted {
		return id, err
	}
	return 0, procrun.Fatal(w.noWriteErr(ctx, w.cfg.DB, true, epoch, ""))
}

// Released returns the released events of a Shared member's ranges only (and those whose
// changelog row is gone): each is run again by the member that owns its event's range, not by
// every member polling the client's dead-letter table. Until the member joined, it owns none.
func (f fencedParks) Released(ctx context.Context, limit int) ([]ParkedEvent, error) {
	if f.w.sh == nil {
		return f.Store.Released(ctx, limit)
	}
	return f.ReleasedWhere(ctx, limit, f.w.sh.q.releasedOwned, f.w.sh.id.Load())
}
