package pending

import (
	"cmp"
	"testing"

	"github.com/stretchr/testify/require"
)

// pos is a position as the watcher orders legacy ones: by time (here plain seconds), then id.
type pos struct {
	sec int64
	id  int64
}

func (p pos) Compare(q pos) int {
	if c := cmp.Compare(p.sec, q.sec); c != 0 {
		return c
	}
	return cmp.Compare(p.id, q.id)
}

func (p pos) Before(q pos) bool { return p.Compare(q) < 0 }

func predecessor(p pos) pos { return pos{p.sec, p.id - 1} }

func newRing(capacity int) *Ring[pos] { return New(capacity, predecessor) }

func TestAckIsCumulative(t *testing.T) {
	r := newRing(8)
	for i := int64(1); i <= 5; i++ {
		r.Push(uint64(i), i, pos{i, i})
	}
	require.Equal(t, 3, r.Ack(3), "acking the third delivery acknowledges the first three")
	require.Equal(t, 2, r.Len())
	p, ok := r.MinPredecessor()
	require.True(t, ok)
	require.Equal(t, predecessor(pos{4, 4}), p)

	require.Equal(t, 0, r.Ack(3), "an id no longer pending certifies nothing")
	require.Equal(t, 0, r.Ack(99), "an unknown id certifies nothing")
	require.Equal(t, 2, r.Len())
}

func TestAckMatchesEarliestDuplicate(t *testing.T) {
	r := newRing(8)
	r.Push(1, 10, pos{1, 10})
	r.Push(2, 11, pos{2, 11})
	r.Push(3, 10, pos{1, 10}) // the same row delivered again (late recovery of a duplicate)
	r.Push(4, 12, pos{3, 12})
	require.Equal(t, 1, r.Ack(10), "the earliest delivery with the id is acknowledged")
	require.Equal(t, 3, r.Len())
	require.Equal(t, 2, r.Ack(10))
	require.Equal(t, 1, r.Len())
}

func TestMinPredecessorWithLateEntries(t *testing.T) {
	r := newRing(8)
	r.Push(1, 20, pos{10, 20})
	r.Push(2, 21, pos{11, 21})
	r.Push(3, 5, pos{3, 5}) // late: below everything pushed before
	p, _ := r.MinPredecessor()
	require.Equal(t, pos{3, 4}, p)
	require.Equal(t, 1, r.Ack(20))
	p, _ = r.MinPredecessor()
	require.Equal(t, pos{3, 4}, p, "the late entry still holds the minimum")
	require.Equal(t, 2, r.Ack(5))
	_, ok := r.MinPredecessor()
	require.False(t, ok)
	require.Zero(t, r.late)
}

func TestRebaseHoldsEveryEntryAtThePosition(t *testing.T) {
	r := newRing(4)
	for i := int64(1); i <= 5; i++ { // the fifth push evicts the first into the floor
		r.Push(uint64(i), i, pos{10 + i, i})
	}
	r.Push(6, 3, pos{2, 3}) // late, and evicts the second: [3 4 5 3]
	r.Rebase(pos{5, 50})
	p, ok := r.MinPredecessor()
	require.True(t, ok)
	require.Equal(t, pos{5, 49}, p, "entries and floor alike hold the checkpoint at the new position")
	require.Zero(t, r.late, "no entry is late any more")

	require.Equal(t, 1, r.Ack(3), "acknowledgements still match the old deliveries by id, in delivery order")
	r.Push(7, 51, pos{5, 51}) // [4 5 3 51]
	p, _ = r.MinPredecessor()
	require.Equal(t, pos{5, 49}, p, "the old deliveries not acknowledged still hold it")
	require.Equal(t, 3, r.Ack(3))
	p, _ = r.MinPredecessor()
	require.Equal(t, pos{5, 50}, p, "then the first delivery after the rebase holds it")
	require.Equal(t, 1, r.Ack(51))
	_, ok = r.MinPredecessor()
	require.False(t, ok)
}

func TestEvictionFloor(t *testing.T) {
	r := newRing(3)
	for i := int64(1); i <= 5; i++ {
		evicted := r.Push(uint64(i), i, pos{i, i})
		require.Equal(t, i > 3, evicted)
	}
	require.Equal(t, 3, r.Len())
	require.Equal(t, 3, r.Cap())
	require.True(t, r.HasFloor())
	p, _ := r.MinPredecessor()
	require.Equal(t, pos{1, 0}, p, "the floor keeps the first evicted delivery's predecessor")

	require.Equal(t, 0, r.Ack(2), "an evicted delivery cannot be acknowledged")
	require.True(t, r.HasFloor())
	require.Equal(t, 1, r.Ack(3))
	require.False(t, r.HasFloor(), "an ack of a tracked delivery covers everything evicted")
	p, _ = r.MinPredecessor()
	require.Equal(t, pos{4, 3}, p)
}

func TestPeekAckChangesNothing(t *testing.T) {
	r := newRing(8)
	for i := int64(1); i <= 4; i++ {
		r.Push(uint64(i), 10+i, pos{i, 10 + i})
	}
	seq, min, hasMin, ok := r.PeekAck(12)
	require.True(t, ok)
	require.Equal(t, uint64(2), seq)
	require.True(t, hasMin)
	require.Equal(t, predecessor(pos{3, 13}), min, "what stays after acking the second delivery")
	require.Equal(t, 4, r.Len(), "nothing was acknowledged")
	require.Zero(t, r.AckedSeq())

	_, _, hasMin, ok = r.PeekAck(14)
	require.True(t, ok)
	require.False(t, hasMin, "acking the newest leaves nothing pending")
	_, _, _, ok = r.PeekAck(99)
	require.False(t, ok, "an unknown id certifies nothing")
}

func TestAckSeq(t *testing.T) {
	r := newRing(3)
	for i := int64(1); i <= 5; i++ { // 1 and 2 are evicted: [3 4 5]
		r.Push(uint64(i), i, pos{i, i})
	}
	require.Equal(t, 0, r.AckSeq(1), "evicted deliveries are not tracked")
	require.True(t, r.HasFloor(), "delivery 2 was evicted and is not acknowledged by seq 1")
	require.Equal(t, 1, r.AckSeq(3))
	require.False(t, r.HasFloor(), "every evicted delivery is at or before seq 3")
	require.Equal(t, uint64(3), r.AckedSeq())
	require.Equal(t, 0, r.AckSeq(2), "an older seq acknowledges nothing more")
	require.Equal(t, uint64(3), r.AckedSeq(), "and never lowers the acknowledged seq")
	p, _ := r.MinPredecessor()
	require.Equal(t, pos{4, 3}, p)
	require.Equal(t, 1, r.Ack(4))
	require.Equal(t, uint64(4), r.AckedSeq())
}

// model is the obviously-correct version of the pending rules: every delivery ever made, with a
// flag for acknowledged.
type model struct {
	ids    []int64
	poss   []pos
	acked  []bool
	cursor pos
}

// earliest returns the index of the earliest unacknowledged delivery with this id, or -1.
func (m *model) earliest(id int64) int {
	for i := range m.ids {
		if !m.acked[i] && m.ids[i] == id {
			return i
		}
	}
	return -1
}

// ackThrough acknowledges delivery i and every delivery before it.
func (m *model) ackThrough(i int) {
	for j := 0; j <= i; j++ {
		m.acked[j] = true
	}
}

// FuzzPending runs random push/ack sequences (with late positions, duplicate ids and evictions)
// and checks the ring's checkpoint never passes an unacknowledged delivery.
func FuzzPending(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 200, 4, 130, 5}, uint8(4))
	f.Add([]byte{9, 9, 9, 9, 9, 9, 9, 9, 255, 1, 129}, uint8(2))
	f.Add([]byte{1, 2, 3, 4, 5, 6, 0xc3, 8, 0x81, 0xc9, 10}, uint8(3))
	f.Fuzz(func(t *testing.T, ops []byte, capacity uint8) {
		r := newRing(int(capacity%8) + 1)
		m := &model{}
		var seq uint64
		next := int64(100)
		for _, op := range ops {
			if op&0x80 == 0 { // push
				seq++
				var (
					id int64
					p  pos
				)
				switch {
				case op%7 == 0 && len(m.ids) > 0: // redeliver an earlier row
					k := int(op) % len(m.ids)
					id, p = m.ids[k], m.poss[k]
				case op%5 == 0: // a late row below the cursor
					next++
					id, p = next, pos{m.cursor.sec - int64(op), next}
				default:
					next++
					id, p = next, pos{next * 1000, next}
				}
				r.Push(seq, id, p)
				m.ids, m.poss, m.acked = append(m.ids, id), append(m.poss, p), append(m.acked, false)
				if m.cursor.Before(p) {
					m.cursor = p
				}
			} else if op&0x40 != 0 { // ack by seq, as a committed transactional ack does
				s := uint64(op&0x3f) % (seq + 1)
				before := r.Len()
				n := r.AckSeq(s)
				want := 0 // the tracked entries with a seq up to s: the newest deliveries are tracked
				for k := range before {
					if seq-uint64(before-1-k) <= s {
						want++
					}
				}
				require.Equal(t, want, n)
				require.GreaterOrEqual(t, r.AckedSeq(), s)
				if s > 0 {
					m.ackThrough(int(s) - 1)
				}
			} else if len(m.ids) > 0 { // ack
				k := int(op&0x3f) % (len(m.ids) + 2)
				id := int64(-1)
				if k < len(m.ids) {
					id = m.ids[k]
				}
				before := r.Len()
				minBefore, floorBefore := r.MinPredecessor()
				pSeq, pMin, pHasMin, pOK := r.PeekAck(id)
				minAfterPeek, floorAfterPeek := r.MinPredecessor()
				require.Equal(t, before, r.Len(), "PeekAck changes nothing")
				require.Equal(t, minBefore, minAfterPeek)
				require.Equal(t, floorBefore, floorAfterPeek)
				ackedBefore := r.AckedSeq()
				n := r.Ack(id)
				require.Equal(t, pOK, n > 0, "PeekAck finds what Ack acknowledges")
				if pOK {
					require.Equal(t, max(ackedBefore, pSeq), r.AckedSeq())
					require.Equal(t, seq-uint64(before-n), pSeq, "PeekAck names the acknowledged delivery")
					gotMin, gotHas := r.MinPredecessor()
					require.Equal(t, pHasMin, gotHas)
					if gotHas {
						require.Equal(t, pMin, gotMin, "PeekAck predicts the checkpoint after the ack")
					}
				}
				if n > 0 {
					// The ring acknowledged the delivery with index len-before+n-1 (the tracked
					// entries are the newest). It is the model's earliest unacknowledged one
					// with the id, unless that one was evicted: the known limit of an id
					// delivered again, where an ack may certify more.
					i := len(m.ids) - before + n - 1
					require.Equal(t, id, m.ids[i])
					if e := m.earliest(id); e != i {
						require.Less(t, e, len(m.ids)-before, "a tracked earlier delivery with the id was skipped")
					}
					m.ackThrough(i)
				}
			}
			cp := m.cursor
			if p, ok := r.MinPredecessor(); ok && p.Before(cp) {
				cp = p
			}
			for i := range m.ids {
				if !m.acked[i] {
					require.False(t, predecessor(m.poss[i]).Before(cp),
						"checkpoint %v passes unacknowledged delivery %d at %v", cp, m.ids[i], m.poss[i])
				}
			}
			require.LessOrEqual(t, r.Len(), r.Cap())
			for k := range r.n { // the tracked entries are the newest deliveries
				require.Equal(t, seq-uint64(r.n-1-k), r.buf[(r.head+k)%len(r.buf)].seq)
			}
		}
	})
}
