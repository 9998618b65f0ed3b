package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/document"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// run is the reader goroutine: the only sender on events, which it closes when it exits.
func (w *Watcher) run(ctx context.Context) {
	defer w.wg.Done()
	defer close(w.events)
	defer w.primed.fire() // stopped before the first read
	defer func() {
		w.lifeMu.Lock()
		if w.stopErr == nil {
			w.stopErr = context.Cause(ctx)
		}
		w.lifeMu.Unlock()
	}()
	defer w.recoverPanic(opPanic, "reader", w.stopWith)
	if !w.becomeActive(ctx) { // Config.Exclusive: wait as a standby for the lock
		return
	}
	if err := w.loadWithRetry(ctx); err != nil {
		if ctx.Err() == nil {
			w.lifeMu.Lock()
			w.stopErr = err
			w.lifeMu.Unlock()
		}
		return
	}
	w.checkTableName(ctx)
	if w.listen != nil {
		select { // LISTEN before the first read, so nothing committed in between goes unnoticed
		case <-w.listen.Ready():
		case <-ctx.Done():
			return
		}
	}
	retry := backoff.Backoff{Min: readRetryMin, Max: readRetryMax}
	failed := newRepeatLog(w.log, slog.LevelWarn, "changelog read failed; retrying from the same position")
	for {
		full, err := w.readOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			w.primed.fire()
			failed.ok()
		}
		var wait time.Duration
		switch {
		case errors.Is(err, ErrRestoredDatabase): // found by a rewind: an operator must act
			w.health.fail(opRead, err)
			w.log.Error("stopping", "error", err)
			w.lifeMu.Lock()
			w.stopErr = err
			w.lifeMu.Unlock()
			return
		case err != nil:
			w.health.fail(opRead, err)
			wait = retry.Next()
			failed.fail("error", err, "retry_in", wait)
		case full:
			w.health.readOK(true)
			retry.Reset()
			continue
		default:
			w.health.readOK(false)
			retry.Reset()
			wait = w.pollWait()
		}
		if !w.sleep(ctx, wait) {
			return
		}
	}
}

// readOnce reads one batch after the cursor and delivers it. On a legacy changelog, when the
// read reached the end of the visible rows, it then recovers late rows named by NOTIFY. full
// reports that more rows follow at once (the next batch is being read).
func (w *Watcher) readOnce(ctx context.Context) (full bool, err error) {
	if w.skipFree.Load() {
		_, err := w.readBatch(ctx)
		again := w.readNow
		w.readNow = false
		if errors.Is(err, errRewound) {
			return true, nil
		}
		return err == nil && (w.next != nil || again), err
	}
	hints := w.hints.Take()
	_, err = w.readBatch(ctx)
	if err != nil || w.next != nil {
		w.hints.Return(hints)
		return err == nil, err
	}
	if err := w.recoverLateRows(ctx, hints); err != nil {
		return false, err
	}
	return false, w.noticeUpgrade(ctx)
}

// pollWait is how long to wait for a NOTIFY after a short read; 0 means no timer.
func (w *Watcher) pollWait() time.Duration {
	switch {
	case w.listen == nil:
		return w.cfg.PollInterval
	case w.cfg.Mode == ModeHybrid:
		return backoff.Jitter(w.cfg.FallbackPollInterval)
	default:
		return 0
	}
}

// sleep waits for d (forever when d is 0), a wake-up or the end of ctx. It returns false when
// ctx ended.
func (w *Watcher) sleep(ctx context.Context, d time.Duration) bool {
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-w.wake:
	case <-timeout:
	}
	return true
}

// readBatch reads the rows after the cursor and delivers them in order. When more rows may
// follow (a full batch) it starts reading the next batch before delivering this one, so the
// query and the decoding of events overlap; the prefetched batch is used only if the cursor ends
// exactly where it starts. On an upgraded changelog a read at the start of a delta first takes
// the delta's end snapshot, and a batch that the delta (or the legacy part of a switch-over)
// does not follow ends it.
func (w *Watcher) readBatch(ctx context.Context) (int, error) {
	if w.rewindAsked.Load() { // a save found that the server recovered
		if err := w.rewind(ctx, "a save found the server's incarnation changed"); err != nil {
			return 0, err
		}
	}
	if err := w.checkStats(ctx); err != nil {
		return 0, err
	}
	if w.sh != nil {
		if w.sh.changeAsked.Load() {
			if err := w.handOver(ctx); err != nil {
				return 0, fmt.Errorf("shared hand-over: %w", err)
			}
		}
		if len(w.sh.view.Load().owned) == 0 { // nothing to read until a range is claimed
			w.noteEmptyRead()
			return 0, nil
		}
	}
	w.mu.Lock()
	from := w.cursor
	w.mu.Unlock()
	tookEnd := false // this read took the end snapshot of from's span
	if from.AtDeltaStart() {
		tookEnd = true
		end, inc, err := w.currentSnapshot(ctx)
		if err != nil {
			return 0, fmt.Errorf("read changelog: take snapshot: %w", err)
		}
		if why := serverRecovered(from.Span, end, inc); why != "" {
			if err := w.rewind(ctx, why); err != nil {
				return 0, err
			}
			return 0, errRewound
		}
		if position.EmptyDelta(from.Span.Base, end) {
			w.noteEmptyRead()
			return 0, nil
		}
		from = from.WithEnd(end, inc)
	}
	fresh, more := true, false
	if p := w.takePrefetch(); p != nil {
		if p.err == nil && p.from.Compare(from) == 0 {
			w.batch, w.spare, fresh, more = p.rows, w.batch, false, p.more
		} else {
			w.spare = p.rows
		}
	}
	if fresh {
		var err error
		if w.batch, more, err = w.readPage(ctx, from, w.batch[:0]); err != nil {
			return 0, fmt.Errorf("read changelog: %w", err)
		}
	}
	n := len(w.batch)
	// A span that ends at a snapshot taken earlier (by an earlier read, or loaded with the token,
	// or the switch-over's) is followed by a read at once: an empty read of it has not caught up.
	readOn := !more && from.Span != nil && !tookEnd
	if n == 0 && !readOn {
		w.noteEmptyRead()
	}
	if more {
		w.next = w.prefetch(ctx, rowPosition(from, &w.batch[n-1]))
	}
	for i := range w.batch {
		row := &w.batch[i]
		if err := w.deliver(ctx, row, rowPosition(from, row), false); err != nil {
			return i, err
		}
	}
	if !more && from.Span != nil {
		w.endSpan(from)
		// Rows committed since a snapshot taken earlier may have notified before: the next
		// delta is then read at once rather than at the next NOTIFY.
		if readOn {
			w.readNow = true
		}
	}
	return n, nil
}

// nextBatch is a read of the next batch running while the current one is delivered.
type nextBatch struct {
	from Position
	done chan struct{} // closed when rows, more and err are set
	rows []changelogRow
	more bool
	err  error
}

// takePrefetch waits for the prefetch of the next batch, if one was started, and returns it.
func (r *reader) takePrefetch() *nextBatch {
	p := r.next
	if p != nil {
		r.next = nil
		<-p.done
	}
	return p
}

// errRewound is returned by readBatch after it went back to the saved token: read again at once.
var errRewound = errors.New("rewound to the saved token")

// prefetch starts reading the batch after from into the spare buffer.
func (w *Watcher) prefetch(ctx context.Context, from Position) *nextBatch {
	p := &nextBatch{from: from, done: make(chan struct{})}
	buf := w.spare[:0]
	w.spare = nil // owned by the prefetch until it is done
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer close(p.done)
		defer w.recoverPanic(opRead, "prefetched read", func(err error) { p.err = err }) // the reader reads again
		p.rows, p.more, p.err = w.readPage(ctx, from, buf)
	}()
	return p
}

// queryByKey runs a changelog query by primary key, whose plan needs no statistics, and reads
// its rows, with the columns cols, into buf.
func (r *reader) queryByKey(ctx context.Context, q string, buf []changelogRow, cols rowColumns, args ...any) ([]changelogRow, error) {
	rows, err := r.cfg.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return buf, err
	}
	return scanRows(rows, buf, cols)
}

// query runs a changelog read of index ranges (read, delta.go) and reads its rows, with the columns
// cols, into buf.
func (r *reader) query(ctx context.Context, q string, buf []changelogRow, cols rowColumns, args ...any) ([]changelogRow, error) {
	err := r.read(ctx, q, func(rows *sql.Rows) (err error) {
		buf, err = scanRows(rows, buf, cols)
		return err
	}, args...)
	return buf, err
}

// deliver is the one path every row takes: filter, then (one locked step) register the delivery
// as pending and advance the cursor, then send. A send abandoned because ctx ended stays pending.
// A late row can sit behind the token already saved (saved while its transaction was still
// open): the token is then saved again, backward, before the send, so that a crash replays it.
func (w *Watcher) deliver(ctx context.Context, row *changelogRow, pos Position, late bool) error {
	ev, raw, pending, behindSaved := w.register(row, pos, late)
	if !pending {
		return nil
	}
	if w.sh != nil {
		if err := w.sh.waitLease(ctx); err != nil { // registered: a save cannot pass it
			return err
		}
	}
	if behindSaved {
		if err := w.saveInBackground(ctx, saveChanged); err != nil {
			w.log.Warn("cannot move the saved token back behind a late row; the next save retries", "id", row.ID, "error", err)
		}
	}
	if err := w.send(ctx, EventWithToken{Event: ev, ResumeToken: position.FormatToken(row.ID), raw: raw}); err != nil {
		return err
	}
	w.delivered.Add(1)
	return nil
}

// send hands ev to the consumer, or gives up when ctx ends. A Shared member's Events channel has
// no buffer (eventsCapacity): the send completes when the consumer takes the event, and the
// event is offered only while the lease holds; at the lease's deadline the offer is withdrawn
// until a renewal, so a member paused past its lease hands out, when it wakes, at most the one
// event it was offering when it stopped.
func (w *Watcher) send(ctx context.Context, ev EventWithToken) error {
	if w.sh == nil {
		select {
		case w.events <- ev:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for {
		if err := w.sh.waitLease(ctx); err != nil {
			return err
		}
		select {
		case w.events <- ev: // the consumer is waiting
			return nil
		default:
		}
		t := time.NewTimer(w.sh.leaseLeft())
		select {
		case w.events <- ev:
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C: // the lease may have run out: offer it again once renewed
		}
	}
}

// register builds the row's event and runs the filter, then, in one locked step, records the
// delivery at pos as pending and advances the cursor (a filtered row only advances the cursor).
// pending is false for a filtered row; behindSaved reports a late row that sits behind the
// token already saved. raw is what the delivery keeps of the row (see [Watcher.event]).
func (w *Watcher) register(row *changelogRow, pos Position, late bool) (ev Event, raw *document.Raw, pending, behindSaved bool) {
	if w.sh != nil && w.sh.skipShared(row, pos) { // another member's row, or one its range's floor passed: not decoded
		w.mu.Lock()
		w.advanceLocked(pos)
		w.mu.Unlock()
		return Event{}, nil, false, false
	}
	ev, raw, err := w.event(row)
	if err != nil { // the event still has its id, operation, time and key: deliver it, don't stall
		w.log.Error("cannot decode changelog row; delivering it without documents", "id", row.ID, "error", err)
	}
	if pos.Span == nil {
		w.recent.Add(row.ID)
	}
	if w.cfg.Filter != nil && !w.cfg.Filter(ev) {
		w.mu.Lock()
		w.advanceLocked(pos)
		w.filtered++
		w.mu.Unlock()
		return ev, raw, false, false
	}
	evicted, behindSaved := w.track(row, pos, late)
	if evicted {
		w.noteFloor()
	}
	return ev, raw, true, behindSaved
}

// changelogRow is one row of the changelog as read by the watcher (see [document.Row]).
type changelogRow = document.Row

// event builds the event document of a row read by the watcher and what is kept to decode its
// fullDocument from the JSON text (see [document.Decode]), and warns about a row whose value has
// no object under [Config.DocumentField]. With [Config.RawDocuments] the documents are not
// decoded when the row's text can be vouched for.
func (r *reader) event(row *changelogRow) (Event, *document.Raw, error) {
	ev, raw, unwrapMissed, err := document.Decode(row, r.cfg.TableName, r.cfg.documents())
	if unwrapMissed {
		r.log.Warn("changelog row has no object under Config.DocumentField; its whole value is the document",
			"id", row.ID, "document_field", r.cfg.DocumentField)
	}
	return ev, raw, err
}

// legacyDocumentField is the [Config.DocumentField] of [NewPostgreSQLChangeStreamWatcher]: the
// replaced watcher published the "document" object of health_events rows, and whole rows of
// every other table.
func legacyDocumentField(table string) string {
	if table == "health_events" {
		return "document"
	}
	return ""
}
