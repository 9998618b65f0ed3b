// Package pending is the bounded ring of deliveries handed to a consumer and not yet
// acknowledged. The watcher and the test kit's fake watcher share it, so both follow the same
// delivery contract.
package pending

// Position is what the ring needs of a position type: a total order (Compare returns -1, 0 or
// +1 as p is before, equal to or after q).
type Position[P any] interface {
	Compare(q P) int
}

// Ring tracks deliveries that were handed to the consumer and not yet acknowledged.
//
// Invariants (checked by the fuzz test against a simple model):
//
//   - Entries are in delivery order: seq strictly increases from the oldest (head) to the newest.
//     The tracked entries are always the newest deliveries pushed: push appends, eviction and
//     ack remove the oldest.
//   - len(buf) is the capacity, fixed at construction; n <= len(buf). Push and eviction are O(1)
//     and never allocate.
//   - When the ring is full, push evicts the oldest entry and folds its predecessor into the
//     floor: floor = min(floor, predecessor(evicted)). The checkpoint can never pass the floor.
//   - An entry is "late" when its position was below the highest position pushed before it (a
//     late row recovered below the cursor). While no late entry is tracked, positions are
//     non-decreasing from head to tail, so the minimum predecessor is the head's: O(1). With late
//     entries tracked, MinPredecessor scans.
//   - Ack(id) removes the prefix of entries up to and including the earliest entry with that id,
//     and clears the floor, since everything evicted was delivered before any tracked entry.
//     AckSeq(s) removes the entries with a seq up to s, and clears the floor when every evicted
//     entry had a seq up to s. Both raise the acknowledged seq (AckedSeq), which never goes
//     back. PeekAck reports what Ack would do and changes nothing.
//
// A Ring is not safe for concurrent use; its owner guards it with its delivery lock.
type Ring[P Position[P]] struct {
	buf  []entry[P]
	head int // index of the oldest entry
	n    int // number of entries

	predecessor func(P) P // the position just before a delivery's row

	maxPushed P // highest position ever pushed
	pushedAny bool
	late      int // number of tracked entries with late set

	floor    P
	hasFloor bool

	evictedSeq uint64 // seq of the newest evicted entry
	ackedSeq   uint64 // highest seq acknowledged
}

type entry[P any] struct {
	seq  uint64
	id   int64
	pos  P
	late bool
}

// New returns a ring that tracks at most capacity deliveries. predecessor returns the position
// just before a position's row: resuming after it reads the row again.
func New[P Position[P]](capacity int, predecessor func(P) P) *Ring[P] {
	return &Ring[P]{buf: make([]entry[P], capacity), predecessor: predecessor}
}

// Len returns the number of tracked deliveries.
func (r *Ring[P]) Len() int { return r.n }

// Cap returns the most deliveries the ring tracks.
func (r *Ring[P]) Cap() int { return len(r.buf) }

// HasFloor reports whether evicted deliveries hold the checkpoint back.
func (r *Ring[P]) HasFloor() bool { return r.hasFloor }

// Push records a delivery. It reports whether the oldest entry was evicted to make room.
func (r *Ring[P]) Push(seq uint64, id int64, pos P) (evicted bool) {
	if r.n == len(r.buf) {
		r.evictOldest()
		evicted = true
	}
	late := r.pushedAny && pos.Compare(r.maxPushed) < 0
	if late {
		r.late++
	} else {
		r.maxPushed = pos
		r.pushedAny = true
	}
	i := r.head + r.n
	if i >= len(r.buf) {
		i -= len(r.buf)
	}
	r.buf[i] = entry[P]{seq: seq, id: id, pos: pos, late: late}
	r.n++
	return evicted
}

// evictOldest drops the head entry into the floor.
func (r *Ring[P]) evictOldest() {
	p := r.predecessor(r.buf[r.head].pos)
	r.evictedSeq = r.buf[r.head].seq
	if !r.hasFloor || p.Compare(r.floor) < 0 {
		r.floor = p
		r.hasFloor = true
	}
	r.dropHead(1)
}

// dropHead removes the k oldest entries.
func (r *Ring[P]) dropHead(k int) {
	for range k {
		if r.buf[r.head].late {
			r.late--
		}
		r.buf[r.head] = entry[P]{}
		r.head++
		if r.head == len(r.buf) {
			r.head = 0
		}
	}
	r.n -= k
}

// Ack acknowledges the earliest tracked delivery with this id and every delivery before it. It
// returns how many entries were removed; 0 means the id is not tracked and nothing changed.
func (r *Ring[P]) Ack(id int64) int {
	i := r.head
	for k := range r.n {
		if r.buf[i].id == id {
			r.ackedSeq = max(r.ackedSeq, r.buf[i].seq)
			r.dropHead(k + 1)
			r.hasFloor = false
			return k + 1
		}
		i++
		if i == len(r.buf) {
			i = 0
		}
	}
	return 0
}

// PeekAck reports what Ack(id) would do, changing nothing: seq is the seq of the delivery it
// would acknowledge, and min the lowest predecessor of the deliveries that would stay tracked
// (hasMin is false when none would: the ack also clears the floor). ok is false when the id is
// not tracked, and Ack would change nothing.
func (r *Ring[P]) PeekAck(id int64) (seq uint64, min P, hasMin, ok bool) {
	i := r.head
	for range r.n {
		if ok {
			min, hasMin = minIf(min, hasMin, r.predecessor(r.buf[i].pos)), true
		} else if r.buf[i].id == id {
			seq, ok = r.buf[i].seq, true
		}
		i++
		if i == len(r.buf) {
			i = 0
		}
	}
	return seq, min, hasMin, ok
}

// AckSeq acknowledges every tracked delivery whose seq is up to seq, and clears the floor when
// every evicted delivery's seq was up to seq too. It returns how many entries were removed.
func (r *Ring[P]) AckSeq(seq uint64) int {
	k := 0
	for k < r.n && r.buf[(r.head+k)%len(r.buf)].seq <= seq {
		k++
	}
	r.dropHead(k)
	if r.hasFloor && r.evictedSeq <= seq {
		r.hasFloor = false
	}
	r.ackedSeq = max(r.ackedSeq, seq)
	return k
}

// AckedSeq returns the highest seq acknowledged by Ack or AckSeq (0 before any).
func (r *Ring[P]) AckedSeq() uint64 { return r.ackedSeq }

// Rebase moves every tracked delivery, and the floor, to pos: from here on they hold the
// checkpoint at pos's predecessor until they are acknowledged, whatever positions they had. The
// owner rebases when the positions tracked so far can no longer be trusted and reading starts
// again from pos; later pushes must be at or after pos.
func (r *Ring[P]) Rebase(pos P) {
	i := r.head
	for range r.n {
		r.buf[i].pos, r.buf[i].late = pos, false
		i++
		if i == len(r.buf) {
			i = 0
		}
	}
	r.late = 0
	r.maxPushed, r.pushedAny = pos, true
	if r.hasFloor {
		r.floor = r.predecessor(pos)
	}
}

// MinPredecessor returns the lowest of the floor and the predecessors of tracked deliveries.
// ok is false when nothing is tracked and there is no floor.
func (r *Ring[P]) MinPredecessor() (p P, ok bool) {
	p, ok = r.floor, r.hasFloor
	if r.n == 0 {
		return p, ok
	}
	if r.late == 0 {
		return minIf(p, ok, r.predecessor(r.buf[r.head].pos)), true
	}
	i := r.head
	for range r.n {
		p = minIf(p, ok, r.predecessor(r.buf[i].pos))
		ok = true
		i++
		if i == len(r.buf) {
			i = 0
		}
	}
	return p, true
}

// minIf returns min(p, q), or q when p is not set.
func minIf[P Position[P]](p P, ok bool, q P) P {
	if !ok || q.Compare(p) < 0 {
		return q
	}
	return p
}
