package pgchangestream

import (
	"context"
	"fmt"

	"github.com/pgchangestream/pgchangestream/internal/deadletter"
	"github.com/pgchangestream/pgchangestream/internal/procface"
	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

// deadLetterTable returns the dead-letter table of the watcher's client, unfenced.
func (w *Watcher) deadLetterTable() *deadletter.Store {
	return deadletter.New(w.cfg.DB, w.cfg.ChangelogTable, w.cfg.ClientName)
}

// parkedStore returns the dead-letter table of the watcher's client, its parks fenced as the
// watcher's saves are (fencedParks).
func (w *Watcher) parkedStore() procface.ParkedStore {
	return fencedParks{w.deadLetterTable(), w}
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
