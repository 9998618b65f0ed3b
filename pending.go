package pgchangestream

import "github.com/pgchangestream/pgchangestream/internal/position"

// The watcher's side of pending deliveries: a delivery is registered as pending, and the cursor
// advanced, in one locked step before it is sent; an acknowledgement removes the prefix of
// deliveries up to it; the checkpoint is the minimum of the cursor, the floor and the
// predecessors of the pending deliveries. These follow rules 1 to 7 of the delivery contract
// (CONTRACT.md; in short in docs/design.md). The bounded ring itself, its floor and its
// invariants are internal/pending; the ring is guarded by mu.

// track records the delivery of row at pos as pending and advances the cursor, in one locked
// step; it reports an eviction, and a late row behind the token already saved.
func (w *Watcher) track(row *changelogRow, pos Position, late bool) (evicted, behindSaved bool) {
	w.mu.Lock()
	defer w.mu.Unlock() // the ring's code runs under mu: a panic in it must not leave mu held
	w.seq++
	evicted = w.ring.Push(w.seq, row.ID, pos)
	if evicted {
		w.evicted++
	}
	w.advanceLocked(pos)
	return evicted, late && pos.Predecessor().Before(w.savedMirror)
}

// advanceLocked moves the cursor forward to pos (never back). mu must be held.
func (w *Watcher) advanceLocked(pos Position) {
	if w.cursor.Before(pos) {
		w.cursor = pos
	}
	if pos.ChangedAt.After(w.lastEventRead) {
		w.lastEventRead = pos.ChangedAt
	}
}

// noteFloor warns, once per watcher, that deliveries were evicted into the floor. It logs, so
// it runs outside mu. Reader goroutine only.
func (w *Watcher) noteFloor() {
	if w.floorNoted {
		return
	}
	w.floorNoted = true
	w.log.Warn("more unacknowledged deliveries than Config.MaxPending; the oldest now hold the checkpoint through a floor",
		"max_pending", w.cfg.MaxPending)
}

// ack acknowledges the earliest pending delivery of id and every one before it.
func (w *Watcher) ack(id int64) {
	w.mu.Lock()
	defer w.mu.Unlock() // the ring's code runs under mu: a panic in it must not leave mu held
	w.acked += uint64(w.ring.Ack(id))
}

// checkpointLocked computes the position to save: min(cursor, floor, predecessor of every
// pending delivery). ok is false before the saved token is loaded. mu must be held.
func (w *Watcher) checkpointLocked() (p Position, ok bool) {
	if !w.loaded {
		return Position{}, false
	}
	p = w.cursor
	if m, ok := w.ring.MinPredecessor(); ok {
		p = position.Min(p, m)
	}
	return p, true
}

// checkpoint computes the position to save under mu (see checkpointLocked), and the seq of the
// last delivery acknowledged; busy reports deliveries pending or a floor.
func (w *Watcher) checkpoint() (p Position, seq uint64, ok, busy bool) {
	w.mu.Lock()
	defer w.mu.Unlock() // the ring's code runs under mu: a panic in it must not leave mu held
	p, ok = w.checkpointLocked()
	return p, w.ring.AckedSeq(), ok, w.ring.Len() > 0 || w.ring.HasFloor()
}
