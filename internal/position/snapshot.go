package position

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Snapshot deltas. A pg_snapshot "xmin:xmax:xip,..." says which transactions a statement sees:
// an id below xmax that is not in xip has finished (a committed one's rows are visible); xmax
// and above, and the ids in xip, are still running. Every committed row becomes visible in
// exactly one step from one snapshot to the next, so reading the rows visible in a snapshot E
// and not in the previous one B, for one snapshot after another, reads every committed row once,
// whenever its transaction commits. A transaction left open only keeps its own rows back.
//
// The rows of delta B→E are those of the transactions in B's xip that finished by E, and those
// of transactions from B's xmax up to E's xmax that are not in E's xip. Each part is an index
// range on (table_name, txid, id): the point ranges of the finished ids, then one range, all
// checked against E explicitly, because later statements see later commits. A delta is
// delivered in changelog id order, not in (txid, id) order: for one row, id order is commit
// order (the trigger row of a change is written only after the row's previous change committed,
// and the id sequence hands out increasing values), while a transaction that holds a lower txid
// can commit its change of a row after another transaction's.

// FirstNormalXid is PostgreSQL's first ordinary transaction id; lower ids never write rows.
const FirstNormalXid = 3

// Snapshot is a parsed pg_snapshot.
type Snapshot struct {
	Xmin, Xmax uint64
	Xip        []uint64 // ascending
}

// EmptySnapshot sees no transaction: reading from it delivers every row.
var EmptySnapshot = Snapshot{Xmin: FirstNormalXid, Xmax: FirstNormalXid}

// ParseSnapshot parses the text form of a pg_snapshot ("xmin:xmax:xip,xip,..."), refusing one
// PostgreSQL cannot write: xmin below FirstNormalXid, xmin above xmax, an xip outside [xmin, xmax).
func ParseSnapshot(s string) (Snapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return Snapshot{}, fmt.Errorf("snapshot %q: want xmin:xmax:xip", s)
	}
	var (
		snap Snapshot
		err  error
	)
	if snap.Xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %q: xmin: %w", s, err)
	}
	if snap.Xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %q: xmax: %w", s, err)
	}
	if snap.Xmin < FirstNormalXid {
		// PostgreSQL never writes one; reading from it would compute ranges below id 0.
		return Snapshot{}, fmt.Errorf("snapshot %q: xmin %d is below %d, the first transaction id", s, snap.Xmin, FirstNormalXid)
	}
	if snap.Xmin > snap.Xmax {
		return Snapshot{}, fmt.Errorf("snapshot %q: xmin is above xmax", s)
	}
	if parts[2] != "" {
		for _, f := range strings.Split(parts[2], ",") {
			x, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return Snapshot{}, fmt.Errorf("snapshot %q: xip: %w", s, err)
			}
			if x < snap.Xmin || x >= snap.Xmax {
				return Snapshot{}, fmt.Errorf("snapshot %q: xip %d is outside [xmin, xmax)", s, x)
			}
			snap.Xip = append(snap.Xip, x)
		}
		slices.Sort(snap.Xip)
		snap.Xip = slices.Compact(snap.Xip)
	}
	return snap, nil
}

// String returns the text form PostgreSQL reads back as a pg_snapshot.
func (s Snapshot) String() string {
	b := make([]byte, 0, 24+12*len(s.Xip))
	b = strconv.AppendUint(b, s.Xmin, 10)
	b = append(b, ':')
	b = strconv.AppendUint(b, s.Xmax, 10)
	b = append(b, ':')
	for i, x := range s.Xip {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, x, 10)
	}
	return string(b)
}

// Running reports whether transaction x is still running in s (its rows are not visible).
func (s Snapshot) Running(x uint64) bool {
	if x >= s.Xmax {
		return true
	}
	_, found := slices.BinarySearch(s.Xip, x)
	return found
}

// Equal reports whether s and t see the same transactions.
func (s Snapshot) Equal(t Snapshot) bool {
	return s.Xmin == t.Xmin && s.Xmax == t.Xmax && slices.Equal(s.Xip, t.Xip)
}

// FinishedBy returns, ascending, the transactions running in b that have finished in e.
func FinishedBy(b, e Snapshot) []uint64 {
	var out []uint64
	for _, x := range b.Xip {
		if !e.Running(x) {
			out = append(out, x)
		}
	}
	return out
}

// EmptyDelta reports whether nothing can have become visible from b to e: no transaction of
// b's xip finished and xmax did not move. Such a delta needs no read.
func EmptyDelta(b, e Snapshot) bool {
	return e.Xmax <= b.Xmax && len(FinishedBy(b, e)) == 0
}

// KeyRange is a range of the (txid, id) index: the keys above (lo, loID) and up to (hi, hiID).
type KeyRange struct {
	Lo   uint64
	LoID int64
	Hi   uint64
	HiID int64
}

const (
	MinID = -1 << 63
	MaxID = 1<<63 - 1
)

// DeltaRanges returns the index ranges that hold the rows of delta b→e: one point range for
// each transaction of b's xip that finished by e, then the range from b's xmax to e's xmax.
// Rows in them that e does not see must still be filtered out by the read.
func DeltaRanges(b, e Snapshot) []KeyRange {
	var out []KeyRange
	for _, x := range FinishedBy(b, e) {
		out = append(out, KeyRange{Lo: x, LoID: MinID, Hi: x, HiID: MaxID})
	}
	if e.Xmax > b.Xmax {
		out = append(out, KeyRange{Lo: b.Xmax - 1, LoID: MaxID, Hi: e.Xmax - 1, HiID: MaxID})
	}
	return out
}

// Within reports whether every transaction s sees as finished, t sees as finished too.
func (s Snapshot) Within(t Snapshot) bool {
	if s.Xmax > t.Xmax && (s.Xmax-t.Xmax > uint64(len(s.Xip)) || slices.ContainsFunc(rangeOf(t.Xmax, s.Xmax), func(x uint64) bool { return !s.Running(x) })) {
		return false
	}
	for _, x := range t.Xip {
		if x < s.Xmax && !s.Running(x) {
			return false
		}
	}
	return true
}

// rangeOf returns the integers from lo up to hi, excluded.
func rangeOf(lo, hi uint64) []uint64 {
	out := make([]uint64, 0, hi-lo)
	for x := lo; x < hi; x++ {
		out = append(out, x)
	}
	return out
}

// Intersect returns the snapshot that sees as finished exactly the transactions both s and t
// see as finished.
func Intersect(s, t Snapshot) Snapshot {
	m := min(s.Xmax, t.Xmax)
	var xip []uint64
	for _, x := range append(slices.Clone(s.Xip), t.Xip...) {
		if x < m {
			xip = append(xip, x)
		}
	}
	slices.Sort(xip)
	xip = slices.Compact(xip)
	xmin := m
	if len(xip) > 0 {
		xmin = xip[0]
	}
	return Snapshot{Xmin: xmin, Xmax: m, Xip: xip}
}
