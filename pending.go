package pgchangestream

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/listen"
	"github.com/pgchangestream/pgchangestream/internal/marker"
	"github.com/pgchangestream/pgchangestream/internal/pending"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// The watcher's side of pending deliveries: a delivery is registered as pending, and the cursor
// advanced, in one locked step before it is sent; an acknowledgement removes the prefix of
// deliveries up to it; the checkpoint is the minimum of the cursor, the floor and the
// predecessors of the pending deliveries. These follow rules 1 to 7 of the delivery contract
// (CONTRACT.md; in short in docs/design.md). The bounded ring itself, its floor and its
// invariants are internal/pending; the ring is guarded by mu.

// reader is the delivery state: the cursor, the pending deliveries and their counters, guarded
// by mu. The read loop (the reader goroutine) registers deliveries and moves the cursor; the
// consumer's acknowledgements and the saver's checkpoints read and change it through its
// methods, each one short locked step: nothing slow happens while mu is held. The Watcher
// embeds it.
type reader struct {
	cfg *Config               // the watcher's configuration; set by newWatcher, immutable after
	q   *changelog.Statements // the watcher's statements; set by newWatcher, immutable after
	log *slog.Logger          // the watcher's logger; set by newWatcher, immutable after

	// Delivery state, guarded by mu.
	mu             sync.Mutex
	loaded         bool // cursor holds the loaded position; checkpoints may be computed
	cursor         Position
	seq            uint64
	ring           *pending.Ring[Position]
	filtered       uint64
	acked          uint64
	evicted        uint64
	savedMirror    Position // copy of saved for Stats
	lastEmptyBatch time.Time
	lastEventRead  time.Time
	// switched is the span of an in-place switch-over (seq 0, its snapshot as base), set by the
	// reader when it switches, for the marker's passes (markTarget); guarded by mu, not by the
	// marker's lock, so that the reader never waits for a marking statement (one held up by a
	// row lock, say).
	switched *position.Span

	delivered atomic.Uint64 // added by the reader after each completed send

	// noStats: the changelog had no statistics when last looked for (delta.go). Set by the
	// reader; read by its reads and prefetches.
	noStats atomic.Bool

	// Reader goroutine only.
	// rq: the row reads; a Shared member's change with its ranges (set by its hand-overs,
	// before any prefetch that uses them starts).
	rq             *changelog.Reads
	recent         *listen.RecentIDs
	batch          []changelogRow // the rows being delivered
	spare          []changelogRow // the other buffer; owned by the prefetch while one runs
	next           *nextBatch     // the prefetch of the next batch, if one was started
	pager          deltaPager     // the delta being read; owned by the prefetch while one runs
	floorNoted     bool
	legacyNoted    bool      // the legacy changelog was reported (by the load, which the reader runs)
	upgradeChecked time.Time // when a legacy watcher last looked for the txid column
	hasInc         bool      // the changelog has an incarnation table (set by the load; see load.go)
	readNow        bool      // readBatch ended a span at a snapshot it did not take: read on at once
	incNoted       bool      // its absence was reported
	statsChecked   time.Time // when the changelog's statistics were last looked for (delta.go)
}

// track records the delivery of row at pos as pending and advances the cursor, in one locked
// step; it reports an eviction, and a late row behind the token already saved.
func (r *reader) track(row *changelogRow, pos Position, late bool) (evicted, behindSaved bool) {
	r.mu.Lock()
	defer r.mu.Unlock() // the ring's code runs under mu: a panic in it must not leave mu held
	r.seq++
	evicted = r.ring.Push(r.seq, row.ID, pos)
	if evicted {
		r.evicted++
	}
	r.advanceLocked(pos)
	return evicted, late && pos.Predecessor().Before(r.savedMirror)
}

// advanceLocked moves the cursor forward to pos (never back). mu must be held.
func (r *reader) advanceLocked(pos Position) {
	if r.cursor.Before(pos) {
		r.cursor = pos
	}
	if pos.ChangedAt.After(r.lastEventRead) {
		r.lastEventRead = pos.ChangedAt
	}
}

// noteFloor warns, once per watcher, that deliveries were evicted into the floor. It logs, so
// it runs outside mu. Reader goroutine only.
func (r *reader) noteFloor() {
	if r.floorNoted {
		return
	}
	r.floorNoted = true
	r.log.Warn("more unacknowledged deliveries than Config.MaxPending; the oldest now hold the checkpoint through a floor",
		"max_pending", r.cfg.MaxPending)
}

// ack acknowledges the earliest pending delivery of id and every one before it.
func (r *reader) ack(id int64) {
	r.mu.Lock()
	defer r.mu.Unlock() // the ring's code runs under mu: a panic in it must not leave mu held
	r.acked += uint64(r.ring.Ack(id))
}

// checkpointLocked computes the position to save: min(cursor, floor, predecessor of every
// pending delivery). ok is false before the saved token is loaded. mu must be held.
func (r *reader) checkpointLocked() (p Position, ok bool) {
	if !r.loaded {
		return Position{}, false
	}
	p = r.cursor
	if m, ok := r.ring.MinPredecessor(); ok {
		p = position.Min(p, m)
	}
	return p, true
}

// checkpoint computes the position to save under mu (see checkpointLocked), and the seq of the
// last delivery acknowledged; busy reports deliveries pending or a floor.
func (r *reader) checkpoint() (p Position, seq uint64, ok, busy bool) {
	r.mu.Lock()
	defer r.mu.Unlock() // the ring's code runs under mu: a panic in it must not leave mu held
	p, ok = r.checkpointLocked()
	return p, r.ring.AckedSeq(), ok, r.ring.Len() > 0 || r.ring.HasFloor()
}

// peekCheckpoint returns the checkpoint that acknowledging id (when ok) would give, and the
// seq of the last delivery it acknowledges, changing nothing.
func (r *reader) peekCheckpoint(id int64, ok bool) (Position, uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock() // the ring's code runs under mu: a panic in it must not leave mu held
	p, loaded := r.checkpointLocked()
	if !loaded {
		return Position{}, 0, errors.New("the saved token is not loaded yet")
	}
	seq := r.ring.AckedSeq()
	if !ok {
		return p, seq, nil
	}
	s, m, hasMin, found := r.ring.PeekAck(id)
	if !found {
		return p, seq, nil
	}
	p = r.cursor
	if hasMin {
		p = position.Min(p, m)
	}
	return p, max(seq, s), nil
}

// applyTxAck acknowledges in memory every delivery up to seq, named by a committed marker.
func (r *reader) applyTxAck(seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock() // the ring's code runs under mu: a panic in it must not leave mu held
	if seq > r.ring.AckedSeq() {
		r.acked += uint64(r.ring.AckSeq(seq))
	}
}

// ackedSeq returns the seq of the last delivery acknowledged in memory.
func (r *reader) ackedSeq() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ring.AckedSeq()
}

// noteEmptyRead records that a read found nothing new.
func (r *reader) noteEmptyRead() {
	r.mu.Lock()
	r.lastEmptyBatch = time.Now()
	r.mu.Unlock()
}

// markTarget is what the marker marks up to: the saved position, with the in-place
// switch-over's span, read under mu.
func (r *reader) markTarget() marker.Saved {
	r.mu.Lock()
	defer r.mu.Unlock()
	return marker.Saved{Position: r.savedMirror, Loaded: r.loaded, Switched: r.switched}
}

// lagLocked is the lag at now: the age of the oldest row not yet acknowledged or not yet read,
// measured from its changed_at, 0 when nothing is pending and the last read found no more rows.
// Rows not yet read are newer than the cursor, so while the reader is behind, the cursor's
// changed_at bounds their age from above. mu must be held.
func (r *reader) lagLocked(now time.Time, caughtUp bool) time.Duration {
	var oldest time.Time
	if p, ok := r.ring.MinPredecessor(); ok {
		oldest = p.ChangedAt
	} else if !caughtUp && r.loaded {
		oldest = r.cursor.ChangedAt
	}
	if oldest.IsZero() || !oldest.Before(now) {
		return 0
	}
	return now.Sub(oldest)
}

// noteSaved records p, just saved, for Stats, the lag and the marker's target.
func (r *reader) noteSaved(p Position) {
	r.mu.Lock()
	r.savedMirror = p
	r.mu.Unlock()
}
