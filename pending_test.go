package pgchangestream

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// pos returns a position sec seconds after t0.
func pos(sec int, id int64) Position {
	return makePosition(t0.Add(time.Duration(sec)*time.Second), id)
}

func TestPendingAckIsCumulative(t *testing.T) {
	r := newPendingRing(8)
	for i := int64(1); i <= 5; i++ {
		r.push(uint64(i), i, pos(int(i), i))
	}
	require.Equal(t, 3, r.ack(3), "acking the third delivery acknowledges the first three")
	require.Equal(t, 2, r.len())
	p, ok := r.minPredecessor()
	require.True(t, ok)
	require.Equal(t, pos(4, 4).predecessor(), p)

	require.Equal(t, 0, r.ack(3), "an id no longer pending certifies nothing")
	require.Equal(t, 0, r.ack(99), "an unknown id certifies nothing")
	require.Equal(t, 2, r.len())
}

func TestPendingAckMatchesEarliestDuplicate(t *testing.T) {
	r := newPendingRing(8)
	r.push(1, 10, pos(1, 10))
	r.push(2, 11, pos(2, 11))
	r.push(3, 10, pos(1, 10)) // the same row delivered again (late recovery of a duplicate)
	r.push(4, 12, pos(3, 12))
	require.Equal(t, 1, r.ack(10), "the earliest delivery with the id is acknowledged")
	require.Equal(t, 3, r.len())
	require.Equal(t, 2, r.ack(10))
	require.Equal(t, 1, r.len())
}

func TestPendingMinPredecessorWithLateEntries(t *testing.T) {
	r := newPendingRing(8)
	r.push(1, 20, pos(10, 20))
	r.push(2, 21, pos(11, 21))
	r.push(3, 5, pos(3, 5)) // late: below everything pushed before
	p, _ := r.minPredecessor()
	require.Equal(t, pos(3, 4), p)
	require.Equal(t, 1, r.ack(20))
	p, _ = r.minPredecessor()
	require.Equal(t, pos(3, 4), p, "the late entry still holds the minimum")
	require.Equal(t, 2, r.ack(5))
	_, ok := r.minPredecessor()
	require.False(t, ok)
	require.Zero(t, r.late)
}

func TestPendingEvictionFloor(t *testing.T) {
	r := newPendingRing(3)
	for i := int64(1); i <= 5; i++ {
		evicted := r.push(uint64(i), i, pos(int(i), i))
		require.Equal(t, i > 3, evicted)
	}
	require.Equal(t, 3, r.len())
	require.True(t, r.hasFloor)
	p, _ := r.minPredecessor()
	require.Equal(t, pos(1, 0), p, "the floor keeps the first evicted delivery's predecessor")

	require.Equal(t, 0, r.ack(2), "an evicted delivery cannot be acknowledged")
	require.True(t, r.hasFloor)
	require.Equal(t, 1, r.ack(3))
	require.False(t, r.hasFloor, "an ack of a tracked delivery covers everything evicted")
	p, _ = r.minPredecessor()
	require.Equal(t, pos(4, 3), p)
}

// model is the obviously-correct version of the pending rules: every delivery ever made, with a
// flag for acknowledged.
type model struct {
	ids    []int64
	poss   []Position
	acked  []bool
	cursor Position
}

func (m *model) ack(id int64) {
	for i := range m.ids {
		if !m.acked[i] && m.ids[i] == id {
			for j := 0; j <= i; j++ {
				m.acked[j] = true
			}
			return
		}
	}
}

// FuzzPending runs random push/ack sequences (with late positions, duplicate ids and evictions)
// and checks the ring's checkpoint never passes an unacknowledged delivery.
func FuzzPending(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 200, 4, 130, 5}, uint8(4))
	f.Add([]byte{9, 9, 9, 9, 9, 9, 9, 9, 255, 1, 129}, uint8(2))
	f.Fuzz(func(t *testing.T, ops []byte, capacity uint8) {
		r := newPendingRing(int(capacity%8) + 1)
		m := &model{}
		var seq uint64
		next := int64(100)
		for _, op := range ops {
			if op&0x80 == 0 { // push
				seq++
				var id int64
				var p Position
				switch {
				case op%7 == 0 && len(m.ids) > 0: // redeliver an earlier row
					k := int(op) % len(m.ids)
					id, p = m.ids[k], m.poss[k]
				case op%5 == 0: // a late row below the cursor
					next++
					id, p = next, makePosition(m.cursor.ChangedAt.Add(-time.Duration(op)*time.Microsecond), next)
				default:
					next++
					id, p = next, makePosition(t0.Add(time.Duration(next)*time.Millisecond), next)
				}
				r.push(seq, id, p)
				m.ids, m.poss, m.acked = append(m.ids, id), append(m.poss, p), append(m.acked, false)
				if m.cursor.Before(p) {
					m.cursor = p
				}
			} else if len(m.ids) > 0 { // ack
				k := int(op&0x7f) % (len(m.ids) + 2)
				id := int64(-1)
				if k < len(m.ids) {
					id = m.ids[k]
				}
				if r.ack(id) > 0 {
					m.ack(id)
				}
			}
			cp := m.cursor
			if p, ok := r.minPredecessor(); ok {
				cp = minPosition(cp, p)
			}
			for i := range m.ids {
				if !m.acked[i] {
					require.False(t, m.poss[i].predecessor().Before(cp),
						"checkpoint %v passes unacknowledged delivery %d at %v", cp, m.ids[i], m.poss[i])
				}
			}
			require.LessOrEqual(t, r.len(), len(r.buf))
		}
	})
}

func BenchmarkPendingPushAck(b *testing.B) {
	r := newPendingRing(DefaultMaxPending)
	p := pos(0, 0)
	b.ReportAllocs()
	for i := range b.N {
		id := int64(i)
		r.push(uint64(i), id, Position{ChangedAt: p.ChangedAt, ID: id})
		if r.ack(id) != 1 {
			b.Fatal("ack missed")
		}
	}
}

func BenchmarkCheckpointPosition(b *testing.B) {
	w := newWatcher(Config{ClientName: "bench", TableName: "t"}.withDefaults())
	w.loaded = true
	for i := range DefaultMaxPending / 2 {
		w.ring.push(uint64(i), int64(i), pos(i, int64(i)))
	}
	w.cursor = pos(DefaultMaxPending, DefaultMaxPending)
	b.ReportAllocs()
	for range b.N {
		w.mu.Lock()
		_, ok := w.checkpointLocked()
		w.mu.Unlock()
		if !ok {
			b.Fatal("no checkpoint")
		}
	}
}
