package pgchangestream

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseSnapshot(t *testing.T) {
	s, err := parseSnapshot("100:110:107,101,104")
	require.NoError(t, err)
	require.Equal(t, pgSnapshot{xmin: 100, xmax: 110, xip: []uint64{101, 104, 107}}, s)
	require.Equal(t, "100:110:101,104,107", s.String())
	require.True(t, s.running(104))
	require.True(t, s.running(110), "xmax and above are running")
	require.False(t, s.running(103))
	require.False(t, s.running(99))

	s, err = parseSnapshot("3:3:")
	require.NoError(t, err)
	require.True(t, s.equal(emptySnapshot))

	for _, bad := range []string{"", "1:2", "a:2:", "5:4:", "1:5:7", "1:5:0", "1:5:x", "1:2:3:4"} {
		_, err := parseSnapshot(bad)
		require.Error(t, err, bad)
	}
}

func TestDeltaRanges(t *testing.T) {
	b := pgSnapshot{xmin: 100, xmax: 110, xip: []uint64{100, 104, 107}}
	e := pgSnapshot{xmin: 107, xmax: 120, xip: []uint64{107, 115}}
	require.Equal(t, []uint64{100, 104}, finishedBy(b, e))
	require.Equal(t, []keyRange{
		{lo: 100, loID: minID, hi: 100, hiID: maxID},
		{lo: 104, loID: minID, hi: 104, hiID: maxID},
		{lo: 109, loID: maxID, hi: 119, hiID: maxID},
	}, deltaRanges(b, e, 0, 0))
	require.Equal(t, []keyRange{
		{lo: 104, loID: 42, hi: 104, hiID: maxID},
		{lo: 109, loID: maxID, hi: 119, hiID: maxID},
	}, deltaRanges(b, e, 104, 42), "a page resumes inside a finished transaction")
	require.Equal(t, []keyRange{{lo: 112, loID: 7, hi: 119, hiID: maxID}}, deltaRanges(b, e, 112, 7),
		"a page resumes inside the range")
	require.True(t, emptyDelta(b, pgSnapshot{xmin: 100, xmax: 110, xip: []uint64{100, 104, 107}}))
	require.False(t, emptyDelta(b, pgSnapshot{xmin: 100, xmax: 110, xip: []uint64{100, 107}}))
}

// The model of the database for the delta tests: transactions get increasing ids when they
// begin, rows get increasing ids when they are written, and snapshots are taken as PostgreSQL
// takes them (xmax is one past the latest finished transaction; xip lists the running ones
// below it).
type deltaModel struct {
	nextXid, latestDone uint64
	nextID              int64
	running             []uint64 // ascending
	committed           map[uint64]bool
	aborted             map[uint64]bool
	rows                []modelRow // ascending id
}

type modelRow struct {
	xid uint64
	id  int64
}

func newDeltaModel() *deltaModel {
	return &deltaModel{nextXid: firstNormalXid, latestDone: firstNormalXid - 1, nextID: 1,
		committed: map[uint64]bool{}, aborted: map[uint64]bool{}}
}

func (m *deltaModel) begin() {
	m.running = append(m.running, m.nextXid)
	m.nextXid++
}

func (m *deltaModel) write(i int) {
	if len(m.running) > 0 {
		m.rows = append(m.rows, modelRow{xid: m.running[i%len(m.running)], id: m.nextID})
		m.nextID++
	}
}

func (m *deltaModel) finish(i int, commit bool) {
	if len(m.running) == 0 {
		return
	}
	k := i % len(m.running)
	x := m.running[k]
	m.running = slices.Delete(m.running, k, k+1)
	if commit {
		m.committed[x] = true
	} else {
		m.aborted[x] = true
	}
	m.latestDone = max(m.latestDone, x)
}

func (m *deltaModel) snapshot() pgSnapshot {
	s := pgSnapshot{xmax: m.latestDone + 1}
	for _, x := range m.running {
		if x < s.xmax {
			s.xip = append(s.xip, x)
		}
	}
	s.xmin = s.xmax
	if len(s.xip) > 0 {
		s.xmin = s.xip[0]
	}
	return s
}

// page answers the delta read: the committed rows that e sees in the ranges, in (txid, id)
// order, at most limit of them.
func (m *deltaModel) page(ranges []keyRange, e pgSnapshot, limit int) []modelRow {
	var out []modelRow
	for _, r := range m.rows {
		if !m.committed[r.xid] || e.running(r.xid) {
			continue
		}
		for _, kr := range ranges {
			if keyAfter(r, kr.lo, kr.loID) && !keyAfter(r, kr.hi, kr.hiID) {
				out = append(out, r)
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b modelRow) int { return cmp.Or(cmp.Compare(a.xid, b.xid), cmp.Compare(a.id, b.id)) })
	return out[:min(len(out), limit)]
}

// keyAfter reports whether r's (txid, id) key is after (x, id).
func keyAfter(r modelRow, x uint64, id int64) bool {
	return r.xid > x || (r.xid == x && r.id > id)
}

// certifies reports whether delta position p certifies row r, as the save statement decides.
func certifies(p Position, r modelRow) bool {
	if !p.span.base.running(r.xid) {
		return true
	}
	return p.Xid != 0 && !p.span.end.running(r.xid) && !keyAfter(r, p.Xid, p.ID)
}

// deltaReader reads the model as the watcher does: a delta start takes a snapshot, pages of a
// delta resume after the last key read, and a short page ends the delta.
type deltaReader struct {
	cursor    Position
	delivered []Position
}

func (d *deltaReader) read(m *deltaModel, limit int) {
	from := d.cursor
	if from.atDeltaStart() {
		end := m.snapshot()
		if emptyDelta(from.span.base, end) {
			return
		}
		from = from.withEnd(end, "")
	}
	rows := m.page(deltaRanges(from.span.base, from.span.end, from.Xid, from.ID), from.span.end, limit)
	for _, r := range rows {
		p := Position{ID: r.id, Xid: r.xid, span: from.span}
		d.delivered = append(d.delivered, p)
		d.cursor = p
	}
	if len(rows) < limit {
		d.cursor = d.cursor.nextDelta(from.span.end)
	}
}

// FuzzDeltas checks delta reading against the model: with transactions beginning, writing,
// committing and aborting in any order between reads, every committed row is read exactly once,
// no aborted row is read, positions increase in reading order, and a save between any two read
// positions finds, in its index ranges, every row the later one certifies and the earlier does
// not.
func FuzzDeltas(f *testing.F) {
	for _, seed := range []uint64{1, 2, 3, 42, 1 << 40} {
		f.Add(seed, uint8(3))
	}
	f.Fuzz(func(t *testing.T, seed uint64, limit uint8) {
		rng := rand.New(rand.NewPCG(seed, seed>>7))
		pageSize := int(limit%8) + 1
		m := newDeltaModel()
		d := &deltaReader{cursor: Position{span: &span{seq: 1, base: m.snapshot()}}}
		for range 300 {
			switch op := rng.IntN(10); {
			case op < 2:
				m.begin()
			case op < 5:
				m.write(rng.IntN(8))
			case op < 7:
				m.finish(rng.IntN(8), rng.IntN(4) > 0)
			default:
				d.read(m, pageSize)
			}
		}
		for len(m.running) > 0 {
			m.finish(0, true)
		}
		for range 1000 {
			d.read(m, pageSize)
		}
		seen := map[int64]int{}
		for i, p := range d.delivered {
			seen[p.ID]++
			if i > 0 {
				require.True(t, d.delivered[i-1].Before(p), "positions increase: %v then %v", d.delivered[i-1], p)
			}
		}
		for _, r := range m.rows {
			want := 0
			if m.committed[r.xid] {
				want = 1
			}
			require.Equal(t, want, seen[r.id], "row %d of transaction %d (committed %v)", r.id, r.xid, m.committed[r.xid])
		}
		if len(d.delivered) < 2 {
			return
		}
		for range 20 {
			i, j := rng.IntN(len(d.delivered)), rng.IntN(len(d.delivered))
			prev, p := d.delivered[min(i, j)], d.delivered[max(i, j)]
			if rng.IntN(3) == 0 {
				prev = prev.predecessor()
			}
			checkCertifyRanges(t, m, prev, p)
		}
	})
}

// checkCertifyRanges checks that the ranges of a save from prev to p hold every committed row p
// certifies and prev does not.
func checkCertifyRanges(t *testing.T, m *deltaModel, prev, p Position) {
	ranges := certifyRanges(prev, p)
	for _, r := range m.rows {
		if !m.committed[r.xid] || !certifies(p, r) || certifies(prev, r) {
			continue
		}
		found := slices.ContainsFunc(ranges, func(kr keyRange) bool {
			return keyAfter(r, kr.lo, kr.loID) && !keyAfter(r, kr.hi, kr.hiID)
		})
		require.True(t, found, "row %d of transaction %d, certified by %v and not by %v, is in none of %v", r.id, r.xid, p, prev, ranges)
	}
}
