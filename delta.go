package pgchangestream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
)

// readPage reads the batch after from into buf: a legacy read, a read of the legacy part of a
// switch-over, or a read of from's delta, whose end snapshot is taken.
func (w *Watcher) readPage(ctx context.Context, from Position, buf []changelogRow) ([]changelogRow, error) {
	switch {
	case from.span == nil:
		return w.query(ctx, w.q.read, buf, false, w.cfg.TableName, from.ChangedAt, from.ID)
	case from.span.seq == 0:
		return w.query(ctx, w.q.switchRead, buf, false, w.cfg.TableName, from.ChangedAt, from.ID, from.span.base.String())
	}
	ranges := deltaRanges(from.span.base, from.span.end, from.Xid, from.ID)
	if len(ranges) == 1 {
		r := ranges[0]
		return w.query(ctx, w.q.deltaRange, buf, true, w.cfg.TableName, strconv.FormatUint(r.lo, 10), r.loID,
			strconv.FormatUint(r.hi, 10), r.hiID, from.span.end.String())
	}
	lo, loID, hi, hiID := rangeArgs(ranges)
	return w.query(ctx, w.q.deltaRead, buf, true, w.cfg.TableName, lo, loID, hi, hiID, from.span.end.String())
}

// rowPosition is the position of a row read after from.
func rowPosition(from Position, row *changelogRow) Position {
	p := makePosition(row.ChangedAt, row.ID)
	p.span = from.span
	if from.inDelta() {
		p.Xid = row.Xid
	}
	return p
}

// endSpan moves the cursor to the start of the delta after from's span, whose rows have all
// been read: the delta that starts at from's end snapshot, or, after the legacy part of a
// switch-over, at its snapshot.
func (w *Watcher) endSpan(from Position) {
	next := from.span.base
	if from.span.seq > 0 {
		next = from.span.end
	}
	w.mu.Lock()
	w.advanceLocked(w.cursor.nextDelta(next))
	w.mu.Unlock()
}

// ErrRestoredDatabase is returned through [Watcher.Err] when transaction ids stored in the
// changelog or in the saved token are ahead of the database's transaction counter, as after a
// logical dump and restore. The watcher refuses to start rather than skip or replay rows;
// docs/operations.md ("Restoring a database") gives the fix.
var ErrRestoredDatabase = errors.New("pgchangestream: stored transaction ids are ahead of the database's transaction counter " +
	"(restored from a dump?): clear the changelog's txid column and the snapshot fields of the saved tokens " +
	"as docs/operations.md describes under \"Restoring a database\"")

// checkNotRestored fails with ErrRestoredDatabase if a stored transaction id is at or beyond the
// current snapshot's xmax.
func checkNotRestored(now pgSnapshot, what string, xid uint64) error {
	if xid >= now.xmax {
		return fmt.Errorf("%w: %s is %d, the current snapshot is %s", ErrRestoredDatabase, what, xid, now)
	}
	return nil
}

// certifyRanges returns the (txid, id) index ranges holding the rows that delta position p
// certifies and prev, an earlier delta position, does not: point ranges for the transactions
// prev had not seen finish, then the range from prev up to p. The ranges may hold rows p does not
// certify (the save filters them out); they leave out what prev certified and what lies beyond
// p, so a save reads about as many index entries as it certifies.
func certifyRanges(prev, p Position) []keyRange {
	base := prev.span.base
	// Transactions below the range part that prev has not passed: those running in its base
	// and, when prev is inside its delta's range, those its end snapshot still saw running.
	pending := base.xip
	lo, loID := base.xmax-1, int64(maxID)
	if prev.Xid >= base.xmax {
		lo, loID = prev.Xid, prev.ID
		for _, x := range prev.span.end.xip {
			if x >= base.xmax && x < prev.Xid {
				pending = append(slices.Clip(pending), x)
			}
		}
	}
	top, pBase := p.span.base, p.span.base
	if p.Xid != 0 {
		top = p.span.end
	}
	var out []keyRange
	for _, x := range pending {
		if top.running(x) {
			continue
		}
		r := keyRange{lo: x, loID: minID, hi: x, hiID: maxID}
		if prev.Xid != 0 && x < base.xmax && !prev.span.end.running(x) { // read in prev's delta
			if x < prev.Xid {
				continue
			}
			if x == prev.Xid {
				r.loID = prev.ID
			}
		}
		if p.Xid != 0 && pBase.running(x) { // read in p's delta
			if x > p.Xid {
				continue
			}
			if x == p.Xid {
				r.hiID = p.ID
			}
		}
		out = append(out, r)
	}
	r := keyRange{lo: lo, loID: loID, hi: pBase.xmax - 1, hiID: maxID}
	if p.Xid >= pBase.xmax {
		r.hi, r.hiID = p.Xid, p.ID
	}
	if r.lo < r.hi || (r.lo == r.hi && r.loID < r.hiID) {
		out = append(out, r)
	}
	return out
}
