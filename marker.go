package pgchangestream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// The legacy processed flag (rule 12) is set by a marker, not by the saves. A save writes the
// token alone and wakes the marker, which sets the flag of the rows certified since the rows it
// last marked, in one pass however many saves came in between: one query selects their ids,
// and one statement (two at once for thousands of rows) updates them. So an acknowledgement
// never waits for the flag's row rewrites, and many saves share one pass. The marker only
// marks up to a position that was saved, so the flag never leads the saved token; it may lag
// it. A crash between a save and its marking pass leaves rows the saved token certifies
// unmarked: so after each load (and rewind) the first pass catches up, marking the rows of the
// table that the loaded token certifies and that are not marked (see catchUp).

// Marker timing: at most one pass per markInterval, so the saves of a busy consumer share a
// pass (and a commit) instead of doubling them, and each pass marks thousands of rows
// rather than hundreds (about three times cheaper per row: every marked row is rewritten with
// an entry in each index); backoff after a failed pass. The flag lags the token by about
// markInterval, which its one reader, the old cleanup_changelog(days), does not notice.
const (
	markInterval = 100 * time.Millisecond
	markRetryMin = 100 * time.Millisecond
	markRetryMax = 10 * time.Second

	// markStatements bounds the statements of a pass that run at once (each on a connection
	// of Config.DB), markChunk is the fewest rows each one marks.
	markStatements = 2
	markChunk      = 1000

	// catchUpPage is how many rows a page of the catch-up after a load marks at most.
	catchUpPage = 5 * markStatements * markChunk
)

// marker is the state of the processed-flag marker.
type marker struct {
	mu     sync.Mutex // serializes marking; guards marked and ok. Held across a marking pass (its query and statements); taken after ckMu (by the load), before mu.
	marked Position   // the rows this position certifies are marked
	ok     bool       // marked is set (by the load)

	// loaded is the position the load (or a rewind) set marked to, while the rows it certifies
	// have not all been checked for the flag (catchUp); nil once they have. caughtUp is the
	// legacy key (changed_at, id) of the last row checked so far. Both guarded by mu.
	loaded   *Position
	caughtUp Position

	// switched is the span of an in-place switch-over (seq 0, its snapshot as base), set by the
	// reader when it switches; guarded by the watcher's mu, not by mu here, so that the reader
	// never waits for a marking statement (one held up by a row lock, say).
	switched *position.Span

	wake    chan struct{} // capacity 1: a save happened; created by newWatcher
	running atomic.Bool   // the marker goroutine runs; saves wake it instead of marking
}

// markLoop is the marker goroutine: after each wake-up it marks what the saves certified, at
// most once per markInterval, retrying with backoff while that fails.
func (w *Watcher) markLoop(ctx context.Context) {
	defer w.wg.Done()
	defer w.mark.running.Store(false) // set by start
	retry := backoff.Backoff{Min: markRetryMin, Max: markRetryMax}
	failed := newRepeatLog(w.log, slog.LevelWarn, "cannot set the processed flag; retrying")
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.mark.wake:
		}
		err := w.markPass(ctx)
		if err == nil {
			retry.Reset()
			failed.ok()
			if !backoff.Sleep(ctx, markInterval) { // saves meanwhile wake the next pass
				return
			}
			continue
		}
		if ctx.Err() != nil {
			return
		}
		wait := retry.Next()
		failed.fail("error", err, "retry_in", wait)
		if !backoff.Sleep(ctx, wait) {
			return
		}
		w.wakeMarker()
	}
}

// wakeMarker asks the marker for a pass, coalescing with one already asked for.
func (w *Watcher) wakeMarker() {
	select {
	case w.mark.wake <- struct{}{}:
	default:
	}
}

// afterSave has the rows certified by a save marked: by the marker goroutine when it runs,
// otherwise (before Start, after Close or after Start's context ended) at once.
func (w *Watcher) afterSave(ctx context.Context) {
	if !w.cfg.marksProcessed() {
		return
	}
	if w.mark.running.Load() {
		w.wakeMarker()
		return
	}
	if err := w.markPass(ctx); err != nil {
		w.log.Warn("cannot set the processed flag; the next save retries", "error", err)
	}
}

// markPass runs markSaved, turning a panic in it into a failed pass (reported by Health until a
// pass succeeds): the flag may lag, so marking goes on.
func (w *Watcher) markPass(ctx context.Context) (err error) {
	defer w.recoverPanic(opMark, "processed-flag marker", func(e error) { err = e })
	if err = w.markSaved(ctx); err == nil {
		w.health.ok(opMark)
	}
	return err
}

// markSaved sets the processed flag of the rows the saved token certifies that are not marked
// yet: after a load, first those of the loaded token (catchUp).
func (w *Watcher) markSaved(ctx context.Context) error {
	if !w.cfg.marksProcessed() {
		return nil
	}
	w.mark.mu.Lock()
	defer w.mark.mu.Unlock()
	if err := w.catchUp(ctx); err != nil {
		return fmt.Errorf("set the processed flag in changelog %s of the rows the loaded token certifies: %w", w.cfg.ChangelogTable, err)
	}
	w.mu.Lock()
	target, loaded, switched := w.savedMirror, w.loaded, w.mark.switched
	w.mu.Unlock()
	if !loaded || !w.mark.ok {
		return nil
	}
	prev := w.mark.marked
	if prev.Span == nil && target.Span != nil && switched != nil {
		// The watcher switched over in place since this pass last ran. In the switch-over's form
		// the rows marked certify no more than before, and marking goes on from its snapshot.
		prev.Span = switched
	}
	if !prev.Before(target) {
		// Equal, or the token moved back behind a late row: mark from there on next time.
		w.mark.marked = target
		return nil
	}
	q, args := w.markStatement(prev, target)
	ids, err := w.certifiedIDs(ctx, q, args)
	if err == nil {
		err = w.markIDs(ctx, ids)
	}
	if err != nil {
		return fmt.Errorf("set the processed flag in changelog %s: %w", w.cfg.ChangelogTable, err)
	}
	w.mark.marked = target
	return nil
}

// certifiedIDs runs the selection q of the rows a pass marks, returning their ids in ascending
// order, each once (markSwitch's two parts can both select a row).
func (w *Watcher) certifiedIDs(ctx context.Context, q string, args []any) ([]int64, error) {
	rows, err := w.cfg.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// markIDs sets the processed flag of the rows ids (ascending). From 2 × markChunk rows on, it
// splits them into markStatements statements of contiguous ids that run at once, on goroutines
// of their own: a marked row is rewritten with an entry in each index, so one statement keeps a
// single server core busy, and rows apart are rewritten without waiting for each other. If a
// statement fails, the others keep what they marked: the flag may lag, and the next pass marks
// the rest.
func (w *Watcher) markIDs(ctx context.Context, ids []int64) error {
	mark := func(ids []int64) error {
		_, err := w.cfg.DB.ExecContext(ctx, w.q.markIDs, pgArray(ids))
		return err
	}
	n := min(markStatements, len(ids)/markChunk)
	if n <= 1 {
		if len(ids) == 0 {
			return nil
		}
		return mark(ids)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			defer w.recoverPanic(opMark, "processed-flag marker", func(e error) { errs[i] = e })
			errs[i] = mark(ids[len(ids)*i/n : len(ids)*(i+1)/n])
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// setMarked records p, the loaded token, as where marking goes on from, and has the marker catch
// up on the rows p certifies. The load calls it once the watcher's saved position is p. mu must
// not be held.
func (w *Watcher) setMarked(p Position) {
	w.mark.mu.Lock()
	w.mark.marked, w.mark.ok = p, true
	w.mark.loaded, w.mark.caughtUp = &p, Position{}
	w.mark.mu.Unlock()
	if w.cfg.marksProcessed() {
		w.wakeMarker()
	}
}

// catchUp marks the rows of the table that the loaded token certifies and that are not marked:
// those a crash left unmarked after the saves before it, or all of them the first time a client
// marks. Only rows the saved token certifies too are marked, should it have moved back behind a
// late row since. Each page selects, through the partial index of the rows not marked, the next
// rows in (changed_at, id) order that both certify, and marks them; a failed page is selected
// again by the next pass. So the catch-up reads the table's rows not marked, once: on a changelog
// whose rows are marked it costs about what it marks. mark.mu must be held.
func (w *Watcher) catchUp(ctx context.Context) error {
	if w.mark.loaded == nil {
		return nil
	}
	w.mu.Lock()
	saved := w.savedMirror // the load set it before the loaded position: see setMarked
	w.mu.Unlock()
	for w.mark.loaded != nil {
		q, args := w.catchUpStatement(*w.mark.loaded, saved, w.mark.caughtUp)
		ids, last, err := w.catchUpPage(ctx, q, args)
		if err == nil {
			err = w.markIDs(ctx, ids)
		}
		if err != nil {
			return err
		}
		if len(ids) < catchUpPage {
			w.mark.loaded = nil
		}
		w.mark.caughtUp = last
	}
	return nil
}

// catchUpStatement returns the statement, and its arguments, that selects the next page of the
// catch-up after the legacy key of after: rows that loaded and saved both certify.
func (w *Watcher) catchUpStatement(loaded, saved, after Position) (string, changelog.Params) {
	args := changelog.Params{w.cfg.TableName, after.ChangedAt, after.ID}
	return w.q.catchUp + changelog.CertifiedBy(loaded, args.Add) + "\n\tAND " + changelog.CertifiedBy(saved, args.Add) +
		"\n\tORDER BY c.changed_at, c.id LIMIT " + strconv.Itoa(catchUpPage), args
}

// catchUpPage runs the selection q of a page of the catch-up, returning the ids in ascending
// order and the legacy key (changed_at, id) of the last row.
func (w *Watcher) catchUpPage(ctx context.Context, q string, args []any) (ids []int64, last Position, err error) {
	rows, err := w.cfg.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, Position{}, err
	}
	defer rows.Close()
	for rows.Next() {
		if err := rows.Scan(&last.ID, &last.ChangedAt); err != nil {
			return nil, Position{}, err
		}
		ids = append(ids, last.ID)
	}
	if err := rows.Err(); err != nil {
		return nil, Position{}, err
	}
	slices.Sort(ids)
	return ids, last, nil
}

// markStatement returns the statement, and its arguments, that marks the rows p certifies and
// prev, an earlier saved position of the same watcher, does not.
func (w *Watcher) markStatement(prev, p Position) (string, []any) {
	table := w.cfg.TableName
	switch {
	case p.Span == nil:
		return w.q.markLegacy, []any{table, prev.ChangedAt, prev.ID, p.ChangedAt, p.ID}
	case !p.InDelta():
		return w.q.markPhase, []any{table, prev.ChangedAt, prev.ID, p.ChangedAt, p.ID, p.Span.Base.String()}
	case certifiedByID(prev, p):
		return w.q.markInDelta, []any{table, prev.ID, p.ID, p.Span.End.String()}
	}
	q, from := w.q.markDelta, prev
	if !prev.InDelta() { // the legacy part of the switch-over ended since
		// A legacy prev has no switch-over snapshot (markSaved gives it one): p's base, which
		// sees no less, marks only rows p certifies, and may leave some of the rest unmarked.
		base := p.Span.Base
		if prev.Span != nil {
			base = prev.Span.Base
		}
		q, from = w.q.markSwitch, Position{Span: &position.Span{Seq: 1, Base: base}}
	}
	lo, loID, hi, hiID := rangeArgs(certifyRanges(from, p))
	args := []any{table, lo, loID, hi, hiID, p.Span.Base.String(), p.Top().String(), p.ID}
	if q == w.q.markSwitch {
		args = append(args, prev.ChangedAt, prev.ID)
	}
	return q, args
}
