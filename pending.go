package pgchangestream

// The pending ring tracks deliveries that were handed to the consumer and not yet acknowledged.
//
// Invariants (checked by the fuzz test against a simple model):
//
//   - Entries are in delivery order: seq strictly increases from the oldest (head) to the newest.
//   - len(buf) is the capacity, fixed at construction; n <= len(buf). Push and eviction are O(1)
//     and never allocate.
//   - When the ring is full, push evicts the oldest entry and folds its predecessor into the
//     floor: floor = min(floor, predecessor(evicted)). The checkpoint can never pass the floor.
//   - An entry is "late" when its position was below the highest position pushed before it (a
//     late row recovered below the cursor). While no late entry is tracked, positions are
//     non-decreasing from head to tail, so the minimum predecessor is the head's: O(1). With late
//     entries tracked, minPredecessor scans.
//   - ack(id) removes the prefix of entries up to and including the earliest entry with that id,
//     and clears the floor, since everything evicted was delivered before any tracked entry.
//
// The ring is not safe for concurrent use; the watcher guards it with its delivery lock.
type pendingRing struct {
	buf  []pendingEntry
	head int // index of the oldest entry
	n    int // number of entries

	maxPushed Position // highest position ever pushed
	pushedAny bool
	late      int // number of tracked entries with late set

	floor    Position
	hasFloor bool
}

type pendingEntry struct {
	seq  uint64
	id   int64
	pos  Position
	late bool
}

func newPendingRing(capacity int) *pendingRing {
	return &pendingRing{buf: make([]pendingEntry, capacity)}
}

// len returns the number of tracked deliveries.
func (r *pendingRing) len() int { return r.n }

// push records a delivery. It reports whether the oldest entry was evicted to make room.
func (r *pendingRing) push(seq uint64, id int64, pos Position) (evicted bool) {
	if r.n == len(r.buf) {
		r.evictOldest()
		evicted = true
	}
	late := r.pushedAny && pos.Before(r.maxPushed)
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
	r.buf[i] = pendingEntry{seq: seq, id: id, pos: pos, late: late}
	r.n++
	return evicted
}

// evictOldest drops the head entry into the floor.
func (r *pendingRing) evictOldest() {
	e := &r.buf[r.head]
	p := e.pos.predecessor()
	if !r.hasFloor || p.Before(r.floor) {
		r.floor = p
		r.hasFloor = true
	}
	r.dropHead(1)
}

// dropHead removes the k oldest entries.
func (r *pendingRing) dropHead(k int) {
	for range k {
		if r.buf[r.head].late {
			r.late--
		}
		r.buf[r.head] = pendingEntry{}
		r.head++
		if r.head == len(r.buf) {
			r.head = 0
		}
	}
	r.n -= k
}

// ack acknowledges the earliest tracked delivery with this id and every delivery before it. It
// returns how many entries were removed; 0 means the id is not tracked and nothing changed.
func (r *pendingRing) ack(id int64) int {
	i := r.head
	for k := range r.n {
		if r.buf[i].id == id {
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

// minPredecessor returns the lowest of the floor and the predecessors of tracked deliveries.
// ok is false when nothing is tracked and there is no floor.
func (r *pendingRing) minPredecessor() (p Position, ok bool) {
	p, ok = r.floor, r.hasFloor
	if r.n == 0 {
		return p, ok
	}
	if r.late == 0 {
		return minIf(p, ok, r.buf[r.head].pos.predecessor()), true
	}
	i := r.head
	for range r.n {
		p = minIf(p, ok, r.buf[i].pos.predecessor())
		ok = true
		i++
		if i == len(r.buf) {
			i = 0
		}
	}
	return p, true
}

// minIf returns min(p, q), or q when p is not set.
func minIf(p Position, ok bool, q Position) Position {
	if !ok {
		return q
	}
	return minPosition(p, q)
}
