package pgchangestream

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// readPage reads the batch after from into buf: a legacy read, a read of the legacy part of a
// switch-over, or a read of from's delta, whose end snapshot is taken. more reports that rows
// may follow in the same span (a full batch, in legacy order); when it is false after a delta
// read, the delta is done. The read is told to Config.Observer.
func (w *Watcher) readPage(ctx context.Context, from Position, buf []changelogRow) (rows []changelogRow, more bool, err error) {
	if o := w.cfg.Observer; o != nil {
		start := time.Now()
		defer func() {
			o.ObserveRead(ctx, ReadObservation{Start: start, Duration: time.Since(start), From: from, Rows: len(rows), Err: err})
		}()
	}
	switch {
	case from.Span == nil:
		rows, err = w.query(ctx, w.rq.Read, buf, rowColumns{}, w.cfg.TableName, from.ChangedAt, from.ID)
	case from.Span.Seq == 0:
		rows, err = w.query(ctx, w.rq.SwitchRead, buf, columnsOf(w.rq, false), w.cfg.TableName, from.ChangedAt, from.ID, from.Span.Base.String())
	default:
		return w.pager.read(ctx, w, from, buf)
	}
	return rows, len(rows) == w.cfg.BatchSize, err
}

// deltaReads are the reads a deltaPager makes: SQL for the watcher, a model in tests.
type deltaReads interface {
	// deltaPage returns, in any order, the rows of from's delta after from.AfterID(), at most
	// one more than a page.
	deltaPage(ctx context.Context, from Position, buf []changelogRow) ([]changelogRow, error)
	// deltaIDs returns, ascending, the ids of from's delta rows after the id after, at most the
	// pager's maxIDs of them (changelog.MaxDeltaIDs for the watcher).
	deltaIDs(ctx context.Context, from Position, after int64) ([]int64, error)
	// rowsByID returns the rows with the ids, ascending.
	rowsByID(ctx context.Context, ids []int64, buf []changelogRow) ([]changelogRow, error)
}

// deltaPager reads snapshot deltas in changelog id order. A delta that fits one page is read
// with one query, through its index ranges, and sorted. A larger one is listed (the first page,
// which only said so, is dropped): its ids, read once in id order (one pass over its index
// ranges) and kept, are then read a page at a time by primary key. Owned by the reader goroutine, or by its prefetch while one runs (the reader
// waits for the prefetch before it reads again).
type deltaPager struct {
	pageSize, maxIDs int

	// The list of the large delta being read: its ids after the id after, ascending; cut
	// reports that the list stopped at maxIDs ids, so more may follow its last.
	span  *position.Span
	after int64
	ids   []int64
	cut   bool
}

// read returns the page of from's delta after from, in id order; more reports that the delta
// has rows after it.
func (d *deltaPager) read(ctx context.Context, src deltaReads, from Position, buf []changelogRow) (rows []changelogRow, more bool, err error) {
	after := from.AfterID()
	if d.span != from.Span || after < d.after {
		rows, err := src.deltaPage(ctx, from, buf)
		if err != nil || len(rows) <= d.pageSize { // the rest of the delta
			slices.SortFunc(rows, func(a, b changelogRow) int { return cmp.Compare(a.ID, b.ID) })
			d.drop()
			return rows, false, err
		}
		d.span, d.after, d.ids, d.cut = from.Span, after, nil, true
		buf = rows[:0]
	}
	i, _ := slices.BinarySearch(d.ids, after+1)
	if i == len(d.ids) && d.cut {
		ids, err := src.deltaIDs(ctx, from, after)
		if err != nil {
			return buf, false, err
		}
		d.after, d.ids, d.cut, i = after, ids, len(ids) >= d.maxIDs, 0
	}
	page := d.ids[i:min(i+d.pageSize, len(d.ids))]
	more = i+len(page) < len(d.ids) || d.cut
	rows = buf
	if len(page) > 0 {
		if rows, err = src.rowsByID(ctx, page, buf); err != nil {
			return rows, false, err
		}
	}
	if !more {
		d.drop()
	}
	return rows, more, nil
}

// drop forgets the list of a large delta.
func (d *deltaPager) drop() { *d = deltaPager{pageSize: d.pageSize, maxIDs: d.maxIDs} }

// deltaPage reads the first page of from's delta after from (deltaReads).
func (w *Watcher) deltaPage(ctx context.Context, from Position, buf []changelogRow) ([]changelogRow, error) {
	ranges := position.DeltaRanges(from.Span.Base, from.Span.End)
	if len(ranges) == 1 {
		r := ranges[0]
		return w.query(ctx, w.rq.DeltaRange, buf, columnsOf(w.rq, true), w.cfg.TableName, strconv.FormatUint(r.Lo, 10), r.LoID,
			strconv.FormatUint(r.Hi, 10), r.HiID, from.Span.End.String(), from.AfterID())
	}
	lo, loID, hi, hiID := changelog.RangeArrays(ranges)
	return w.query(ctx, w.rq.DeltaRead, buf, columnsOf(w.rq, true), w.cfg.TableName, lo, loID, hi, hiID, from.Span.End.String(), from.AfterID())
}

// deltaIDs lists the ids of from's delta after after (deltaReads).
func (w *Watcher) deltaIDs(ctx context.Context, from Position, after int64) ([]int64, error) {
	lo, loID, hi, hiID := changelog.RangeArrays(position.DeltaRanges(from.Span.Base, from.Span.End))
	var ids []int64
	err := w.read(ctx, w.rq.DeltaIDs, func(rows *sql.Rows) error {
		defer rows.Close()
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return rows.Err()
	}, w.cfg.TableName, lo, loID, hi, hiID, from.Span.End.String(), after)
	return ids, err
}

// rowsByID reads rows of a listed delta by primary key (deltaReads).
func (w *Watcher) rowsByID(ctx context.Context, ids []int64, buf []changelogRow) ([]changelogRow, error) {
	q, args := w.rowsByIDQuery(ids)
	rows, err := w.queryByKey(ctx, q, buf, columnsOf(w.rq, true), args...)
	if err != nil || q != w.rq.DeltaSpan {
		return rows, err
	}
	return keepIDs(rows, ids), nil
}

// sharedSpanFactor bounds, for a Shared member, how sparse a page of listed ids may be and
// still be read as one primary-key range (keepIDs then drops the rows of the range that are not
// on the page): up to this many ids in the range per id on the page. A member's ids interleave
// with the other members', and one index descent per id costs more than a range read of the
// pages they share.
const sharedSpanFactor = 32

// rowsByIDQuery is the query of rowsByID and its arguments. Ids that are consecutive (every id
// from the first to the last is on the page, as in a backlog of one captured table) are read as
// one primary-key range, which visits the index and heap pages once, as a legacy page does; so
// are the ids of a Shared member's page that are dense enough (deltaSpan, which asks for the
// member's units only); others by one index descent per id.
func (w *Watcher) rowsByIDQuery(ids []int64) (string, []any) {
	n := len(ids)
	switch {
	case n > 0 && ids[n-1]-ids[0] == int64(n-1):
		return w.rq.DeltaKeyRange, []any{ids[0], ids[n-1]}
	case n > 0 && w.rq.DeltaSpan != "" && ids[n-1]-ids[0] < int64(n)*sharedSpanFactor:
		return w.rq.DeltaSpan, []any{ids[0], ids[n-1]}
	}
	return w.rq.DeltaRows, []any{changelog.Array(ids)}
}

// keepIDs keeps the rows (ascending by id) whose id is in ids (ascending), in place.
func keepIDs(rows []changelogRow, ids []int64) []changelogRow {
	kept := rows[:0]
	for _, r := range rows {
		if _, found := slices.BinarySearch(ids, r.ID); found {
			kept = append(kept, r)
		}
	}
	return kept
}

// rowPosition is the position of a row read after from.
func rowPosition(from Position, row *changelogRow) Position {
	p := position.Make(row.ChangedAt, row.ID)
	p.Span = from.Span
	if from.InDelta() {
		p.Xid, p.InRows = row.Xid, true
	}
	return p
}

// endSpan moves the cursor to the start of the delta after from's span, whose rows have all
// been read: the delta that starts at from's end snapshot, or, after the legacy part of a
// switch-over, at its snapshot.
func (w *Watcher) endSpan(from Position) {
	next := from.Span.Base
	if from.Span.Seq > 0 {
		next = from.Span.End
	}
	w.mu.Lock()
	w.advanceLocked(w.cursor.NextDelta(next))
	w.mu.Unlock()
}

// switchSnapshot returns the snapshot of a switch-over from the legacy positions lo to hi (one
// position, or, for a Shared client's ranges, the lowest and the highest of theirs) whose latest
// snapshot is now. The legacy part of a switch-over reads, in (changed_at, id) order, the rows
// after its position that have no txid or that its snapshot sees; deltas from its snapshot then
// read the rest in id order. changed_at is a transaction's start, not its commit: a transaction
// that began first and changed a row last comes first in legacy order, while for one row the
// changelog id follows commit order. So the snapshot is now cut (intersect) below the lowest
// txid, among the rows after lo that now sees, that is above every txid now sees of a row at or
// before hi: the rows with a txid at or above the cut go to the deltas, and every row at or
// before hi that now sees stays seen (nothing the position passed is read again, nothing after
// it is skipped). From the beginning, every row with a txid is read in the deltas.
func (w *Watcher) switchSnapshot(ctx context.Context, lo, hi Position, now position.Snapshot) (position.Snapshot, error) {
	var cut sql.NullString
	err := w.cfg.DB.QueryRowContext(ctx, w.q.SwitchCut, w.cfg.TableName, lo.ChangedAt, lo.ID, hi.ChangedAt, hi.ID,
		now.String(), !hi.ChangedAt.IsZero()).Scan(&cut)
	if err != nil {
		return position.Snapshot{}, changelogReadError{fmt.Errorf("read changelog: find the switch-over's snapshot: %w", err)}
	}
	if !cut.Valid { // no row after lo is left to the deltas but those now does not see
		return now, nil
	}
	x, err := strconv.ParseUint(cut.String, 10, 64)
	if err != nil {
		return position.Snapshot{}, fmt.Errorf("read changelog: txid %q: %w", cut.String, err)
	}
	return position.Intersect(now, position.Snapshot{Xmin: x, Xmax: x}), nil
}
