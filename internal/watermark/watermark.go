// Package watermark is the low-water mark of work taken in one order and finished in any
// order: the longest prefix of consecutive sequence numbers that are all finished. Acknowledging
// the last item of that prefix certifies every item before it and no unfinished one, which is
// what a cumulative acknowledgement (a resume token, a committed offset) needs. The watcher's
// Process and the test kit share it.
package watermark

// Mark is a low-water mark over sequence numbers 1, 2, 3, ... Each added sequence number
// carries a value (for example the event's token), returned when the mark reaches it.
//
// Invariants (checked against a model in the tests):
//
//   - Entries are the sequence numbers done+1 .. done+Len(), in order, in a circular buffer;
//     entry i is seq done+1+i. Add appends the next sequence number; it grows the buffer only
//     when full, so memory follows the number of unfinished items.
//   - Done() is the highest sequence number such that it and every one before it are finished.
//     The entry at the front is always unfinished (finished entries at the front are dropped
//     at once), so Done never passes an unfinished sequence number.
//
// A Mark is not safe for concurrent use.
type Mark[V any] struct {
	buf  []entry[V]
	head int    // index of the entry of seq done+1
	n    int    // number of entries
	done uint64 // the mark
}

type entry[V any] struct {
	v        V
	finished bool
}

// New returns an empty mark: nothing added, Done() is 0.
func New[V any]() *Mark[V] { return &Mark[V]{buf: make([]entry[V], 16)} }

// Done returns the mark: every sequence number up to it is finished.
func (m *Mark[V]) Done() uint64 { return m.done }

// Len returns the number of sequence numbers added and not yet under the mark.
func (m *Mark[V]) Len() int { return m.n }

// Add adds seq, which must be the next sequence number (Done()+Len()+1), with its value. A
// sequence number out of order is a bug of the caller: Add panics.
func (m *Mark[V]) Add(seq uint64, v V) {
	if seq != m.done+uint64(m.n)+1 {
		panic("watermark: sequence numbers must be added in order, without gaps")
	}
	if m.n == len(m.buf) {
		grown := make([]entry[V], 2*len(m.buf))
		for i := range m.n {
			grown[i] = m.buf[(m.head+i)%len(m.buf)]
		}
		m.buf, m.head = grown, 0
	}
	m.buf[(m.head+m.n)%len(m.buf)] = entry[V]{v: v}
	m.n++
}

// Finish marks seq finished. When the mark advances it returns true and the value of the new
// mark's sequence number (the last of the finished prefix). A sequence number not added, or
// already finished, changes nothing.
func (m *Mark[V]) Finish(seq uint64) (last V, advanced bool) {
	if seq <= m.done || seq > m.done+uint64(m.n) {
		return last, false
	}
	m.buf[(m.head+int(seq-m.done-1))%len(m.buf)].finished = true
	for m.n > 0 && m.buf[m.head].finished {
		last, advanced = m.buf[m.head].v, true
		m.buf[m.head] = entry[V]{} // drop the value: the mark holds nothing it no longer needs
		m.head = (m.head + 1) % len(m.buf)
		m.n--
		m.done++
	}
	return last, advanced
}
