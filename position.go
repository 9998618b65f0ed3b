package pgchangestream

import (
	"fmt"
	"time"
)

// Position is a place in the change stream. Reading resumes strictly after a position.
//
// On a legacy changelog (no txid column) a position is (changed_at, id), ordered by changed_at,
// then id, with changed_at compared at PostgreSQL's microsecond precision. On an upgraded
// changelog the stream is read in snapshot deltas, each in changelog id order, and a position is
// (delta, id): of the delta's rows, those with an id up to ID are passed (at the start of a
// delta, none). Positions are ordered as the rows are delivered in both cases. ChangedAt and ID
// always name the row at (or, between deltas, last read before) the position, for logs and tools.
type Position struct {
	ChangedAt time.Time
	ID        int64
	// Xid is the id of the transaction that wrote the row, for logs, in snapshot deltas; 0 on a
	// legacy changelog, in the legacy part of a switch-over, at the start of a delta and in a
	// position loaded from a saved token. It plays no part in the order.
	Xid uint64

	span   *span // nil on a legacy changelog
	inRows bool  // in a delta: past its rows up to ID (false: at its start)
}

// span is the part of the stream a position belongs to on an upgraded changelog. Spans are
// shared by the positions of their rows and never change once made.
type span struct {
	// seq orders spans: 0 is the switch-over from a legacy token (rows after the legacy
	// position that base sees, in legacy order); 1, 2, ... are deltas in reading order.
	seq uint64
	// base: every row it sees is behind the span (for seq 0, the snapshot of the switch-over).
	base pgSnapshot
	// end is the delta's end snapshot, once the reader has taken it (hasEnd).
	end    pgSnapshot
	hasEnd bool
	// inc is the server incarnation the snapshots were taken in (see rewind.go); "" when the
	// changelog has no incarnation table. It is not saved: a loaded token takes the current one.
	inc string
}

// makePosition returns a legacy position with the time cut to microseconds, in UTC and without
// a monotonic clock reading, so that equal database values are equal positions.
func makePosition(changedAt time.Time, id int64) Position {
	return Position{ChangedAt: changedAt.Round(0).Truncate(time.Microsecond).UTC(), ID: id}
}

// inDelta reports whether p is a position of a snapshot delta (not a legacy one).
func (p Position) inDelta() bool { return p.span != nil && p.span.seq > 0 }

// seq returns the span order of p: 0 for legacy positions.
func (p Position) seq() uint64 {
	if p.span == nil {
		return 0
	}
	return p.span.seq
}

// Compare returns -1, 0 or +1 as p is before, equal to or after q.
func (p Position) Compare(q Position) int {
	if ps, qs := p.seq(), q.seq(); ps != qs {
		return cmpOrdered(ps, qs)
	}
	if !p.inDelta() {
		if c := p.ChangedAt.Compare(q.ChangedAt); c != 0 {
			return c
		}
		return cmpOrdered(p.ID, q.ID)
	}
	switch {
	case p.inRows != q.inRows: // the start of a delta is before its rows
		if p.inRows {
			return 1
		}
		return -1
	case !p.inRows: // both at the start
		return 0
	}
	return cmpOrdered(p.ID, q.ID)
}

func cmpOrdered[T int64 | uint64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Before reports whether p is before q.
func (p Position) Before(q Position) bool { return p.Compare(q) < 0 }

// predecessor returns the position just before p's row: resuming after it reads p's row again.
func (p Position) predecessor() Position {
	p.ID--
	return p
}

// nextDelta returns the start of the delta after p's, whose base is b. ChangedAt and ID stay
// those of the last row read.
func (p Position) nextDelta(b pgSnapshot) Position {
	next := &span{seq: p.seq() + 1, base: b}
	if p.span != nil {
		next.inc = p.span.inc
	}
	return Position{ChangedAt: p.ChangedAt, ID: p.ID, span: next}
}

// withEnd returns p, a delta start, in the delta that ends at e, taken in incarnation inc.
func (p Position) withEnd(e pgSnapshot, inc string) Position {
	s := *p.span
	s.end, s.hasEnd, s.inc = e, true, inc
	p.span = &s
	return p
}

// atDeltaStart reports whether p is the start of a delta whose end has not been taken yet.
func (p Position) atDeltaStart() bool { return p.inDelta() && !p.inRows && !p.span.hasEnd }

// afterID returns the id after which p's delta is read: p's ID once past some of its rows,
// else below every id.
func (p Position) afterID() int64 {
	if p.inRows {
		return p.ID
	}
	return minID
}

// String formats the position for logs.
func (p Position) String() string {
	ts := p.ChangedAt.UTC().Format(time.RFC3339Nano)
	switch {
	case p.span == nil:
		return fmt.Sprintf("(%s, %d)", ts, p.ID)
	case p.span.seq == 0:
		return fmt.Sprintf("(%s, %d; switch-over at snapshot %s)", ts, p.ID, p.span.base)
	case !p.inRows:
		return fmt.Sprintf("(after snapshot %s; last row %d at %s)", p.span.base, p.ID, ts)
	}
	return fmt.Sprintf("(delta %s to %s, up to id %d at %s, txid %d)", p.span.base, p.span.end, p.ID, ts, p.Xid)
}

// minPosition returns the earlier of a and b.
func minPosition(a, b Position) Position {
	if b.Before(a) {
		return b
	}
	return a
}

// top returns the snapshot whose rows a delta position p passes: its delta's end once it is
// past some of the delta's rows, else its base.
func (p Position) top() pgSnapshot {
	if p.inRows {
		return p.span.end
	}
	return p.span.base
}
