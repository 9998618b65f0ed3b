package position

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

	// Span and InRows place the position on an upgraded changelog. They are set by the watcher
	// and by decoding a saved token, never by hand. Span is nil on a legacy changelog.
	Span   *Span
	InRows bool // in a delta: past its rows up to ID (false: at its start)
}

// Span is the part of the stream a position belongs to on an upgraded changelog. Spans are
// shared by the positions of their rows and never change once made.
type Span struct {
	// Seq orders spans: 0 is the switch-over from a legacy token (rows after the legacy
	// position that Base sees, in legacy order); 1, 2, ... are deltas in reading order.
	Seq uint64
	// Base: every row it sees is behind the span (for Seq 0, the snapshot of the switch-over).
	Base Snapshot
	// End is the delta's end snapshot, once the reader has taken it (HasEnd).
	End    Snapshot
	HasEnd bool
	// Inc is the server incarnation the snapshots were taken in (see the root's load.go); "" when the
	// changelog has no incarnation table. It is not saved: a loaded token takes the current one.
	Inc string
}

// Make returns a legacy position with the time cut to microseconds, in UTC and without
// a monotonic clock reading, so that equal database values are equal positions.
func Make(changedAt time.Time, id int64) Position {
	return Position{ChangedAt: changedAt.Round(0).Truncate(time.Microsecond).UTC(), ID: id}
}

// InDelta reports whether p is a position of a snapshot delta (not a legacy one).
func (p Position) InDelta() bool { return p.Span != nil && p.Span.Seq > 0 }

// Seq returns the span order of p: 0 for legacy positions.
func (p Position) Seq() uint64 {
	if p.Span == nil {
		return 0
	}
	return p.Span.Seq
}

// Compare returns -1, 0 or +1 as p is before, equal to or after q.
func (p Position) Compare(q Position) int {
	if ps, qs := p.Seq(), q.Seq(); ps != qs {
		return cmpOrdered(ps, qs)
	}
	if !p.InDelta() {
		if c := p.ChangedAt.Compare(q.ChangedAt); c != 0 {
			return c
		}
		return cmpOrdered(p.ID, q.ID)
	}
	switch {
	case p.InRows != q.InRows: // the start of a delta is before its rows
		if p.InRows {
			return 1
		}
		return -1
	case !p.InRows: // both at the start
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

// Predecessor returns the position just before p's row: resuming after it reads p's row again.
func (p Position) Predecessor() Position {
	p.ID--
	return p
}

// NextDelta returns the start of the delta after p's, whose base is b. ChangedAt and ID stay
// those of the last row read.
func (p Position) NextDelta(b Snapshot) Position {
	next := &Span{Seq: p.Seq() + 1, Base: b}
	if p.Span != nil {
		next.Inc = p.Span.Inc
	}
	return Position{ChangedAt: p.ChangedAt, ID: p.ID, Span: next}
}

// WithEnd returns p, a delta start, in the delta that ends at e, taken in incarnation inc.
func (p Position) WithEnd(e Snapshot, inc string) Position {
	s := *p.Span
	s.End, s.HasEnd, s.Inc = e, true, inc
	p.Span = &s
	return p
}

// AtDeltaStart reports whether p is the start of a delta whose end has not been taken yet.
func (p Position) AtDeltaStart() bool { return p.InDelta() && !p.InRows && !p.Span.HasEnd }

// AfterID returns the id after which p's delta is read: p's ID once past some of its rows,
// else below every id.
func (p Position) AfterID() int64 {
	if p.InRows {
		return p.ID
	}
	return MinID
}

// String formats the position for logs.
func (p Position) String() string {
	ts := p.ChangedAt.UTC().Format(time.RFC3339Nano)
	switch {
	case p.Span == nil:
		return fmt.Sprintf("(%s, %d)", ts, p.ID)
	case p.Span.Seq == 0:
		return fmt.Sprintf("(%s, %d; switch-over at snapshot %s)", ts, p.ID, p.Span.Base)
	case !p.InRows:
		return fmt.Sprintf("(after snapshot %s; last row %d at %s)", p.Span.Base, p.ID, ts)
	}
	return fmt.Sprintf("(delta %s to %s, up to id %d at %s, txid %d)", p.Span.Base, p.Span.End, p.ID, ts, p.Xid)
}

// Min returns the earlier of a and b.
func Min(a, b Position) Position {
	if b.Before(a) {
		return b
	}
	return a
}

// Top returns the snapshot whose rows a delta position p passes: its delta's end once it is
// past some of the delta's rows, else its base.
func (p Position) Top() Snapshot {
	if p.InRows {
		return p.Span.End
	}
	return p.Span.Base
}
