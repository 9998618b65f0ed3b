package pgchangestream

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

// firstNormalXid is PostgreSQL's first ordinary transaction id; lower ids never write rows.
const firstNormalXid = 3

// pgSnapshot is a parsed pg_snapshot.
type pgSnapshot struct {
	xmin, xmax uint64
	xip        []uint64 // ascending
}

// emptySnapshot sees no transaction: reading from it delivers every row.
var emptySnapshot = pgSnapshot{xmin: firstNormalXid, xmax: firstNormalXid}

// parseSnapshot parses the text form of a pg_snapshot ("xmin:xmax:xip,xip,..."), refusing one
// PostgreSQL cannot write: xmin below firstNormalXid, xmin above xmax, an xip outside [xmin, xmax).
func parseSnapshot(s string) (pgSnapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return pgSnapshot{}, fmt.Errorf("snapshot %q: want xmin:xmax:xip", s)
	}
	var (
		snap pgSnapshot
		err  error
	)
	if snap.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return pgSnapshot{}, fmt.Errorf("snapshot %q: xmin: %w", s, err)
	}
	if snap.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return pgSnapshot{}, fmt.Errorf("snapshot %q: xmax: %w", s, err)
	}
	if snap.xmin < firstNormalXid {
		// PostgreSQL never writes one; reading from it would compute ranges below id 0.
		return pgSnapshot{}, fmt.Errorf("snapshot %q: xmin %d is below %d, the first transaction id", s, snap.xmin, firstNormalXid)
	}
	if snap.xmin > snap.xmax {
		return pgSnapshot{}, fmt.Errorf("snapshot %q: xmin is above xmax", s)
	}
	if parts[2] != "" {
		for _, f := range strings.Split(parts[2], ",") {
			x, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return pgSnapshot{}, fmt.Errorf("snapshot %q: xip: %w", s, err)
			}
			if x < snap.xmin || x >= snap.xmax {
				return pgSnapshot{}, fmt.Errorf("snapshot %q: xip %d is outside [xmin, xmax)", s, x)
			}
			snap.xip = append(snap.xip, x)
		}
		slices.Sort(snap.xip)
		snap.xip = slices.Compact(snap.xip)
	}
	return snap, nil
}

// String returns the text form PostgreSQL reads back as a pg_snapshot.
func (s pgSnapshot) String() string {
	b := make([]byte, 0, 24+12*len(s.xip))
	b = strconv.AppendUint(b, s.xmin, 10)
	b = append(b, ':')
	b = strconv.AppendUint(b, s.xmax, 10)
	b = append(b, ':')
	for i, x := range s.xip {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, x, 10)
	}
	return string(b)
}

// running reports whether transaction x is still running in s (its rows are not visible).
func (s pgSnapshot) running(x uint64) bool {
	if x >= s.xmax {
		return true
	}
	_, found := slices.BinarySearch(s.xip, x)
	return found
}

// equal reports whether s and t see the same transactions.
func (s pgSnapshot) equal(t pgSnapshot) bool {
	return s.xmin == t.xmin && s.xmax == t.xmax && slices.Equal(s.xip, t.xip)
}

// finishedBy returns, ascending, the transactions running in b that have finished in e.
func finishedBy(b, e pgSnapshot) []uint64 {
	var out []uint64
	for _, x := range b.xip {
		if !e.running(x) {
			out = append(out, x)
		}
	}
	return out
}

// emptyDelta reports whether nothing can have become visible from b to e: no transaction of
// b's xip finished and xmax did not move. Such a delta needs no read.
func emptyDelta(b, e pgSnapshot) bool {
	return e.xmax <= b.xmax && len(finishedBy(b, e)) == 0
}

// keyRange is a range of the (txid, id) index: the keys above (lo, loID) and up to (hi, hiID).
type keyRange struct {
	lo   uint64
	loID int64
	hi   uint64
	hiID int64
}

const (
	minID = -1 << 63
	maxID = 1<<63 - 1
)

// deltaRanges returns the index ranges that hold the rows of delta b→e: one point range for
// each transaction of b's xip that finished by e, then the range from b's xmax to e's xmax.
// Rows in them that e does not see must still be filtered out by the read.
func deltaRanges(b, e pgSnapshot) []keyRange {
	var out []keyRange
	for _, x := range finishedBy(b, e) {
		out = append(out, keyRange{lo: x, loID: minID, hi: x, hiID: maxID})
	}
	if e.xmax > b.xmax {
		out = append(out, keyRange{lo: b.xmax - 1, loID: maxID, hi: e.xmax - 1, hiID: maxID})
	}
	return out
}
