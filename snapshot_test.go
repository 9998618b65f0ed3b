package pgchangestream

import (
	"cmp"
	"context"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/pgchangestream/pgchangestream/internal/marker"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// The model of the database for the delta tests: transactions get increasing ids when they
// begin, rows get increasing ids when they are written, a transaction that writes a key holds
// its lock until it ends (another transaction writing that key would wait: the model skips
// such a write), and snapshots are taken as PostgreSQL takes them (xmax is one past the latest
// finished transaction; xip lists the running ones below it).
type deltaModel struct {
	nextXid, latestDone uint64
	nextID              int64
	running             []uint64       // ascending
	committed           map[uint64]int // the order of the commit: 1, 2, ...
	aborted             map[uint64]bool
	locks               map[int]uint64 // key -> the running transaction that wrote it
	rows                []modelRow     // ascending id

	pageSize, maxIDs int
}

type modelRow struct {
	xid uint64
	id  int64
	key int
}

func newDeltaModel(pageSize, maxIDs int) *deltaModel {
	return &deltaModel{nextXid: position.FirstNormalXid, latestDone: position.FirstNormalXid - 1, nextID: 1,
		committed: map[uint64]int{}, aborted: map[uint64]bool{}, locks: map[int]uint64{},
		pageSize: pageSize, maxIDs: maxIDs}
}

func (m *deltaModel) begin() {
	m.running = append(m.running, m.nextXid)
	m.nextXid++
}

// write has running transaction i write a change of key, unless another transaction holds it.
func (m *deltaModel) write(i, key int) {
	if len(m.running) == 0 {
		return
	}
	x := m.running[i%len(m.running)]
	if holder, ok := m.locks[key]; ok && holder != x {
		return
	}
	m.locks[key] = x
	m.rows = append(m.rows, modelRow{xid: x, id: m.nextID, key: key})
	m.nextID++
}

func (m *deltaModel) finish(i int, commit bool) {
	if len(m.running) == 0 {
		return
	}
	k := i % len(m.running)
	x := m.running[k]
	m.running = slices.Delete(m.running, k, k+1)
	if commit {
		m.committed[x] = len(m.committed) + 1
	} else {
		m.aborted[x] = true
	}
	maps.DeleteFunc(m.locks, func(_ int, holder uint64) bool { return holder == x })
	m.latestDone = max(m.latestDone, x)
}

func (m *deltaModel) snapshot() position.Snapshot {
	s := position.Snapshot{Xmax: m.latestDone + 1}
	for _, x := range m.running {
		if x < s.Xmax {
			s.Xip = append(s.Xip, x)
		}
	}
	s.Xmin = s.Xmax
	if len(s.Xip) > 0 {
		s.Xmin = s.Xip[0]
	}
	return s
}

// delta returns the committed rows of from's delta (in the index ranges the watcher reads,
// visible in its end) with an id above after, in (txid, id) order.
func (m *deltaModel) delta(from Position, after int64) []modelRow {
	ranges := position.DeltaRanges(from.Span.Base, from.Span.End)
	var out []modelRow
	for _, r := range m.rows {
		if m.committed[r.xid] == 0 || from.Span.End.Running(r.xid) || r.id <= after {
			continue
		}
		if slices.ContainsFunc(ranges, func(kr position.KeyRange) bool { return inRange(r, kr) }) {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b modelRow) int { return cmp.Or(cmp.Compare(a.xid, b.xid), cmp.Compare(a.id, b.id)) })
	return out
}

func (r modelRow) changelogRow() changelogRow {
	return changelogRow{ID: r.id, Xid: r.xid, RecordID: strconv.Itoa(r.key)}
}

// deltaPage answers the first page of a delta as the SQL does: in (txid, id) order.
func (m *deltaModel) deltaPage(_ context.Context, from Position, buf []changelogRow) ([]changelogRow, error) {
	rows := m.delta(from, from.AfterID())
	for _, r := range rows[:min(len(rows), m.pageSize+1)] {
		buf = append(buf, r.changelogRow())
	}
	return buf, nil
}

func (m *deltaModel) deltaIDs(_ context.Context, from Position, after int64) ([]int64, error) {
	var ids []int64
	for _, r := range m.delta(from, after) {
		ids = append(ids, r.id)
	}
	slices.Sort(ids)
	return ids[:min(len(ids), m.maxIDs)], nil
}

func (m *deltaModel) rowsByID(_ context.Context, ids []int64, buf []changelogRow) ([]changelogRow, error) {
	for _, r := range m.rows {
		if slices.Contains(ids, r.id) {
			buf = append(buf, r.changelogRow())
		}
	}
	return buf, nil
}

// inRange reports whether r's (txid, id) key is in kr.
func inRange(r modelRow, kr position.KeyRange) bool {
	return keyAfter(r, kr.Lo, kr.LoID) && !keyAfter(r, kr.Hi, kr.HiID)
}

// keyAfter reports whether r's (txid, id) key is after (x, id).
func keyAfter(r modelRow, x uint64, id int64) bool {
	return r.xid > x || (r.xid == x && r.id > id)
}

// certifies reports whether delta position p certifies row r (see savedToken).
func certifies(p Position, r modelRow) bool {
	if !p.Span.Base.Running(r.xid) {
		return true
	}
	return p.InRows && !p.Span.End.Running(r.xid) && r.id <= p.ID
}

// deltaReader reads the model as the watcher's reader does: a delta start takes a snapshot,
// each page resumes after the last row read, and a page the delta does not follow ends it.
type deltaReader struct {
	cursor    Position
	pager     deltaPager
	delivered []Position
}

func (d *deltaReader) read(t *testing.T, m *deltaModel) {
	from := d.cursor
	if from.AtDeltaStart() {
		end := m.snapshot()
		if position.EmptyDelta(from.Span.Base, end) {
			return
		}
		from = from.WithEnd(end, "")
	}
	rows, more, err := d.pager.read(context.Background(), m, from, nil)
	require.NoError(t, err)
	for i := range rows {
		p := rowPosition(from, &rows[i])
		d.delivered = append(d.delivered, p)
		d.cursor = p
	}
	if !more {
		d.cursor = d.cursor.NextDelta(from.Span.End)
	}
}

// restart resumes from the saved token of the cursor, with a new pager. The token does not
// carry the delta's sequence number, which only orders one watcher's positions: it is kept, so
// that positions compare across the restart.
func (d *deltaReader) restart(t *testing.T) {
	p, err := position.DecodeToken(position.EncodeToken(d.cursor, "t"))
	require.NoError(t, err)
	s := *p.Span
	s.Seq = d.cursor.Seq()
	p.Span = &s
	d.cursor, d.pager = p, deltaPager{pageSize: d.pager.pageSize, maxIDs: d.pager.maxIDs}
}

// FuzzDeltas checks delta reading against the model: with transactions beginning, writing,
// committing and aborting in any order between reads, and restarts from the saved token, every
// committed row is read exactly once, no aborted row is read, positions increase in reading
// order, each key's changes are read in commit order, and a save between any two read
// positions finds, in its index ranges (or its id range), every row the later one certifies and
// the earlier does not, and marks no row the later one does not certify.
func FuzzDeltas(f *testing.F) {
	for _, seed := range []uint64{1, 2, 3, 42, 1 << 40} {
		f.Add(seed, uint8(3), uint8(2))
	}
	f.Fuzz(func(t *testing.T, seed uint64, limit, ids uint8) {
		rng := rand.New(rand.NewPCG(seed, seed>>7))
		m := newDeltaModel(int(limit%8)+1, int(ids%6)+1)
		d := &deltaReader{cursor: Position{Span: &position.Span{Seq: 1, Base: m.snapshot()}},
			pager: deltaPager{pageSize: m.pageSize, maxIDs: m.maxIDs}}
		for range 300 {
			switch op := rng.IntN(20); {
			case op < 4:
				m.begin()
			case op < 10:
				m.write(rng.IntN(8), rng.IntN(4))
			case op < 14:
				m.finish(rng.IntN(8), rng.IntN(4) > 0)
			case op < 15:
				d.restart(t)
			default:
				d.read(t, m)
			}
		}
		for len(m.running) > 0 {
			m.finish(0, true)
		}
		for range 1000 {
			d.read(t, m)
		}
		checkDeliveries(t, m, d.delivered)
		if len(d.delivered) < 2 {
			return
		}
		for range 20 {
			i, j := rng.IntN(len(d.delivered)), rng.IntN(len(d.delivered))
			prev, p := d.delivered[min(i, j)], d.delivered[max(i, j)]
			if rng.IntN(3) == 0 {
				prev = prev.Predecessor()
			}
			checkCertifyRanges(t, m, prev, p)
		}
	})
}

// checkDeliveries checks that every committed row was delivered once and no other, in
// increasing positions, and each key's rows in commit order (a transaction's own rows in id
// order).
func checkDeliveries(t *testing.T, m *deltaModel, delivered []Position) {
	byID := map[int64]modelRow{}
	for _, r := range m.rows {
		byID[r.id] = r
	}
	seen := map[int64]int{}
	last := map[int]modelRow{} // key -> its change delivered last
	for i, p := range delivered {
		seen[p.ID]++
		if i > 0 {
			require.True(t, delivered[i-1].Before(p), "positions increase: %v then %v", delivered[i-1], p)
		}
		r := byID[p.ID]
		if q, ok := last[r.key]; ok {
			order := cmp.Or(cmp.Compare(m.committed[q.xid], m.committed[r.xid]), cmp.Compare(q.id, r.id))
			require.Negative(t, order, "key %d: row %d (transaction %d, commit %d) delivered after row %d (transaction %d, commit %d)",
				r.key, r.id, r.xid, m.committed[r.xid], q.id, q.xid, m.committed[q.xid])
		}
		last[r.key] = r
	}
	for _, r := range m.rows {
		want := 0
		if m.committed[r.xid] > 0 {
			want = 1
		}
		require.Equal(t, want, seen[r.id], "row %d of transaction %d (commit %d)", r.id, r.xid, m.committed[r.xid])
	}
}

// checkCertifyRanges checks the marking of a save at p after one at prev: it finds every
// committed row p certifies and prev does not, and marks only rows p certifies.
func checkCertifyRanges(t *testing.T, m *deltaModel, prev, p Position) {
	byID := marker.CertifiedByID(prev, p)
	var ranges []position.KeyRange
	if !byID {
		ranges = marker.CertifyRanges(prev, p)
	}
	for _, r := range m.rows {
		if m.committed[r.xid] == 0 {
			continue
		}
		var marks bool
		if byID { // the marker's InDelta: ids above prev's up to p's that the delta's end sees
			marks = r.id > prev.ID && r.id <= p.ID && !p.Span.End.Running(r.xid)
		} else { // the marker's Delta: the ranges' rows p certifies
			marks = slices.ContainsFunc(ranges, func(kr position.KeyRange) bool { return inRange(r, kr) }) &&
				(!p.Span.Base.Running(r.xid) || (!p.Top().Running(r.xid) && r.id <= p.ID))
		}
		if marks {
			require.True(t, certifies(p, r), "row %d of transaction %d is marked, but %v does not certify it", r.id, r.xid, p)
		} else if certifies(p, r) && !certifies(prev, r) {
			t.Fatalf("row %d of transaction %d, certified by %v and not by %v, is not marked (ranges %v, by id %v)",
				r.id, r.xid, p, prev, ranges, byID)
		}
	}
}
