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
func (r *reader) readPage(ctx context.Context, from Position, buf []changelogRow) (rows []changelogRow, more bool, err error) {
	if o := r.cfg.Observer; o != nil {
		start := time.Now()
		defer func() {
			o.ObserveRead(ctx, ReadObservation{Start: start, Duration: time.Since(start), From: from, Rows: len(rows), Err: err})
		}()
	}
	switch {
	case from.Span == nil:
		rows, err = r.query(ctx, r.rq.Read, buf, rowColumns{}, r.cfg.TableName, from.ChangedAt, from.ID)
	case from.Span.Seq == 0:
		rows, err = r.query(ctx, r.rq.SwitchRead, buf, columnsOf(r.rq, false), r.cfg.TableName, from.ChangedAt, from.ID, from.Span.Base.String())
	default:
		return r.pager.read(ctx, r, from, buf)
	}
	return rows, len(rows) == r.cfg.BatchSize, err
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
func (r *reader) deltaPage(ctx context.Context, from Position, buf []changelogRow) ([]changelogRow, error) {
	ranges := position.DeltaRanges(from.Span.Base, from.Span.End)
	if len(ranges) == 1 {
		kr := ranges[0]
		return r.query(ctx, r.rq.DeltaRange, buf, columnsOf(r.rq, true), r.cfg.TableName, strconv.FormatUint(kr.Lo, 10), kr.LoID,
			strconv.FormatUint(kr.Hi, 10), kr.HiID, from.Span.End.String(), from.AfterID())
	}
	lo, loID, hi, hiID := changelog.RangeArrays(ranges)
	return r.query(ctx, r.rq.DeltaRead, buf, columnsOf(r.rq, true), r.cfg.TableName, lo, loID, hi, hiID, from.Span.End.String(), from.AfterID())
}

// deltaIDs lists the ids of from's delta after after (deltaReads).
func (r *reader) deltaIDs(ctx context.Context, from Position, after int64) ([]int64, error) {
	lo, loID, hi, hiID := changelog.RangeArrays(position.DeltaRanges(from.Span.Base, from.Span.End))
	var ids []int64
	err := r.read(ctx, r.rq.DeltaIDs, func(rows *sql.Rows) error {
		defer rows.Close()
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return rows.Err()
	}, r.cfg.TableName, lo, loID, hi, hiID, from.Span.End.String(), after)
	return ids, err
}

// rowsByID reads rows of a listed delta by primary key (deltaReads).
func (r *reader) rowsByID(ctx context.Context, ids []int64, buf []changelogRow) ([]changelogRow, error) {
	q, args := r.rowsByIDQuery(ids)
	rows, err := r.queryByKey(ctx, q, buf, columnsOf(r.rq, true), args...)
	if err != nil || q != r.rq.DeltaSpan {
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
func (r *reader) rowsByIDQuery(ids []int64) (string, []any) {
	n := len(ids)
	switch {
	case n > 0 && ids[n-1]-ids[0] == int64(n-1):
		return r.rq.DeltaKeyRange, []any{ids[0], ids[n-1]}
	case n > 0 && r.rq.DeltaSpan != "" && ids[n-1]-ids[0] < int64(n)*sharedSpanFactor:
		return r.rq.DeltaSpan, []any{ids[0], ids[n-1]}
	}
	return r.rq.DeltaRows, []any{changelog.Array(ids)}
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
func (r *reader) endSpan(from Position) {
	next := from.Span.Base
	if from.Span.Seq > 0 {
		next = from.Span.End
	}
	r.mu.Lock()
	r.advanceLocked(r.cursor.NextDelta(next))
	r.mu.Unlock()
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
func (r *reader) switchSnapshot(ctx context.Context, lo, hi Position, now position.Snapshot) (position.Snapshot, error) {
	var cut sql.NullString
	err := r.cfg.DB.QueryRowContext(ctx, r.q.SwitchCut, r.cfg.TableName, lo.ChangedAt, lo.ID, hi.ChangedAt, hi.ID,
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

// Reads on a changelog without statistics.
//
// PostgreSQL plans the watcher's reads from the changelog's statistics. A changelog that has
// none (never analyzed: just created and filled by a burst before autovacuum's first ANALYZE,
// or analyzed while empty) gets default selectivities, a handful of rows for table_name = $1
// and a range, and each read of a batch becomes a bitmap scan that fetches and sorts every
// remaining row of its range: a backlog drains in quadratic time. While the changelog has no
// statistics, the watcher therefore runs each read in a read-only transaction that first turns
// bitmap scans, sorts and sequential scans off for that transaction (set_config(..., true), as
// SET LOCAL), which leaves the index range scan as the only plan. These statements carry a
// comment of their own, so that a plan cached for one of them (pgx prepares statements, and
// PostgreSQL may keep a generic plan) is never shared with the plain reads. The watcher looks
// for statistics at every load and then, while there are none, at most once per
// statsCheckInterval; once they exist, reads are plain statements again (three round trips
// fewer each).

// statsCheckInterval is how often, at most, a watcher that found no statistics looks again.
const statsCheckInterval = time.Second

// indexPlansSQL turns off, for the rest of the transaction, every plan of a read but its index
// range scan, and JIT compilation: a plan that must sort anyway (a delta's id list) carries the
// cost the planner gives a disabled sort, far above jit_above_cost, and would be compiled.
const indexPlansSQL = `SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true),
	set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)`

// indexPlansTag prefixes the reads run after indexPlansSQL.
const indexPlansTag = `/* index plans */ `

// read runs the changelog read q of index ranges and hands its rows to scan, which closes them:
// as it is, or, while the changelog has no statistics, with index plans only. Reads by primary
// key (queryByKey) need no statistics and run as they are.
func (r *reader) read(ctx context.Context, q string, scan func(*sql.Rows) error, args ...any) error {
	if !r.noStats.Load() {
		rows, err := r.cfg.DB.QueryContext(ctx, q, args...)
		if err != nil {
			return err
		}
		return scan(rows)
	}
	tx, err := r.cfg.DB.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // read only: nothing to keep, and an error changes nothing
	if _, err := tx.ExecContext(ctx, indexPlansSQL); err != nil {
		return err
	}
	rows, err := tx.QueryContext(ctx, indexPlansTag+q, args...)
	if err != nil {
		return err
	}
	return scan(rows)
}

// noteStats records whether the changelog has statistics. Reader goroutine only (the load runs
// there).
func (r *reader) noteStats(has bool) {
	r.statsChecked = time.Now()
	if r.noStats.Swap(!has) == !has {
		return
	}
	if has {
		r.log.Info("the changelog has statistics now: reads are planned from them", "changelog", r.cfg.ChangelogTable)
	} else {
		r.log.Info("the changelog has no statistics (never analyzed): reads run with index plans only until it is",
			"changelog", r.cfg.ChangelogTable)
	}
}

// checkStats looks again for the changelog's statistics if it had none when last looked for,
// at most once per statsCheckInterval. Reader goroutine only.
func (r *reader) checkStats(ctx context.Context) error {
	if !r.noStats.Load() || time.Since(r.statsChecked) < statsCheckInterval {
		return nil
	}
	var has bool
	if err := r.cfg.DB.QueryRowContext(ctx, r.q.StatsExist, changelog.Quote(r.cfg.ChangelogTable)).Scan(&has); err != nil {
		return fmt.Errorf("look for the statistics of changelog %s: %w", r.cfg.ChangelogTable, err)
	}
	r.noteStats(has)
	return nil
}

// statements returns the watcher's statements for cfg (defaults filled in).
func statements(cfg Config) changelog.Statements {
	return changelog.NewStatements(changelog.StatementParams{ChangelogTable: cfg.ChangelogTable,
		TokenTable: cfg.TokenTable, BatchSize: cfg.BatchSize, MarksProcessed: cfg.marksProcessed()})
}

// rowColumns says which columns a read returns after the changelog columns: the txid column
// (delta reads) and the unit (the reads of Shared members), in that order.
type rowColumns struct{ xid, unit bool }

// columnsOf returns the columns of the reads rq: with the txid column or not.
func columnsOf(rq *changelog.Reads, xid bool) rowColumns { return rowColumns{xid: xid, unit: rq.Unit} }

// scanRows reads changelog rows, with the columns cols, into buf and closes rows.
func scanRows(rows *sql.Rows, buf []changelogRow, cols rowColumns) ([]changelogRow, error) {
	defer rows.Close()
	dest := make([]any, 0, 8)
	for rows.Next() {
		var (
			r        changelogRow
			old, new sql.RawBytes
		)
		dest = append(dest[:0], &r.ID, &r.RecordID, &r.Operation, &old, &new, &r.ChangedAt)
		if cols.xid {
			dest = append(dest, &r.Xid)
		}
		if cols.unit {
			dest = append(dest, &r.Unit)
		}
		if err := rows.Scan(dest...); err != nil {
			return buf, err
		}
		r.OldValues = cloneOrNil(old)
		r.NewValues = cloneOrNil(new)
		buf = append(buf, r)
	}
	return buf, rows.Err()
}

// cloneOrNil copies a column's bytes (RawBytes is only valid until the next row); NULL stays nil.
func cloneOrNil(b sql.RawBytes) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}
