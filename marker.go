package pgchangestream

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// The legacy processed flag (rule 12) is set by a marker, not by the saves. A save writes the
// token alone and wakes the marker, which sets the flag of the rows certified since the rows it
// last marked, in one statement however many saves came in between. So an acknowledgement
// never waits for the flag's row rewrites, and many saves share one statement. The marker only
// marks up to a position that was saved, so the flag never leads the saved token; it may lag
// it, and after a crash the rows certified by the last saves stay unmarked.

// Marker timing: at most one pass per markInterval, so the saves of a busy consumer share a
// statement (and a commit) instead of doubling them, and each statement marks thousands of rows
// rather than hundreds (about three times cheaper per row: every marked row is rewritten with
// an entry in each index); backoff after a failed statement. The flag lags the token by about
// markInterval, which its one reader, the old cleanup_changelog(days), does not notice.
const (
	markInterval = 100 * time.Millisecond
	markRetryMin = 100 * time.Millisecond
	markRetryMax = 10 * time.Second
)

// marker is the state of the processed-flag marker.
type marker struct {
	mu     sync.Mutex // serializes marking; guards marked and ok. Held across the marking statement; taken after ckMu (by the load), before mu.
	marked Position   // the rows this position certifies are marked
	ok     bool       // marked is set (by the load)

	// switched is the span of an in-place switch-over (seq 0, its snapshot as base), set by the
	// reader when it switches; guarded by the watcher's mu, not by mu here, so that the reader
	// never waits for a marking statement (one held up by a row lock, say).
	switched *span

	wake    chan struct{} // capacity 1: a save happened; created by newWatcher
	running atomic.Bool   // the marker goroutine runs; saves wake it instead of marking
}

// markLoop is the marker goroutine: after each wake-up it marks what the saves certified, at
// most once per markInterval, retrying with backoff while that fails.
func (w *Watcher) markLoop(ctx context.Context) {
	defer w.wg.Done()
	defer w.mark.running.Store(false) // set by start
	retry := backoff{min: markRetryMin, max: markRetryMax}
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.mark.wake:
		}
		err := w.markPass(ctx)
		if err == nil {
			retry.reset()
			if !sleepCtx(ctx, markInterval) { // saves meanwhile wake the next pass
				return
			}
			continue
		}
		if ctx.Err() != nil {
			return
		}
		wait := retry.next()
		w.log.Warn("cannot set the processed flag; retrying", "error", err, "retry_in", wait)
		if !sleepCtx(ctx, wait) {
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
// yet.
func (w *Watcher) markSaved(ctx context.Context) error {
	if !w.cfg.marksProcessed() {
		return nil
	}
	w.mark.mu.Lock()
	defer w.mark.mu.Unlock()
	w.mu.Lock()
	target, loaded, switched := w.savedMirror, w.loaded, w.mark.switched
	w.mu.Unlock()
	if !loaded || !w.mark.ok {
		return nil
	}
	prev := w.mark.marked
	if prev.span == nil && target.span != nil && switched != nil {
		// The watcher switched over in place since this pass last ran. In the switch-over's form
		// the rows marked certify no more than before, and marking goes on from its snapshot.
		prev.span = switched
	}
	if !prev.Before(target) {
		// Equal, or the token moved back behind a late row: mark from there on next time.
		w.mark.marked = target
		return nil
	}
	q, args := w.markStatement(prev, target)
	if _, err := w.cfg.DB.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("set the processed flag in changelog %s: %w", w.cfg.ChangelogTable, err)
	}
	w.mark.marked = target
	return nil
}

// setMarked records that the rows certified by p, the loaded token, need no marking. mu must not
// be held.
func (w *Watcher) setMarked(p Position) {
	w.mark.mu.Lock()
	w.mark.marked, w.mark.ok = p, true
	w.mark.mu.Unlock()
}

// markStatement returns the statement, and its arguments, that marks the rows p certifies and
// prev, an earlier saved position of the same watcher, does not.
func (w *Watcher) markStatement(prev, p Position) (string, []any) {
	table := w.cfg.TableName
	switch {
	case p.span == nil:
		return w.q.markLegacy, []any{table, prev.ChangedAt, prev.ID, p.ChangedAt, p.ID}
	case !p.inDelta():
		return w.q.markPhase, []any{table, prev.ChangedAt, prev.ID, p.ChangedAt, p.ID, p.span.base.String()}
	case certifiedByID(prev, p):
		return w.q.markInDelta, []any{table, prev.ID, p.ID, p.span.end.String()}
	}
	q, from := w.q.markDelta, prev
	if !prev.inDelta() { // the legacy part of the switch-over ended since
		// A legacy prev has no switch-over snapshot (markSaved gives it one): p's base, which
		// sees no less, marks only rows p certifies, and may leave some of the rest unmarked.
		base := p.span.base
		if prev.span != nil {
			base = prev.span.base
		}
		q, from = w.q.markSwitch, Position{span: &span{seq: 1, base: base}}
	}
	lo, loID, hi, hiID := rangeArgs(certifyRanges(from, p))
	args := []any{table, lo, loID, hi, hiID, p.span.base.String(), p.top().String(), p.ID}
	if q == w.q.markSwitch {
		args = append(args, prev.ChangedAt, prev.ID)
	}
	return q, args
}
