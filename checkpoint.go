package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// loadWithRetry loads the saved token into the cursor. It never guesses a position: while the
// token cannot be read it retries with backoff until it succeeds or ctx ends. A restored
// database is refused at once.
func (w *Watcher) loadWithRetry(ctx context.Context) error {
	retry := backoff.Backoff{Min: loadRetryMin, Max: loadRetryMax}
	failed := newRepeatLog(w.log, slog.LevelError, "cannot load the start position; retrying")
	for {
		err := w.load(ctx)
		if err == nil {
			failed.ok()
			w.health.ok(opLoad)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		op := opLoad
		if errors.As(err, new(changelogReadError)) {
			op = opRead
		}
		w.health.fail(op, err)
		if errors.Is(err, ErrRestoredDatabase) || errors.Is(err, ErrSharedSchema) { // retrying cannot help: an operator must act
			w.log.Error("refusing to start", "error", err)
			return err
		}
		wait := retry.Next()
		failed.fail("error", err, "retry_in", wait)
		if !backoff.Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// load reads the saved token, or picks and saves the start position of a new client, and
// starts reading there.
func (w *Watcher) load(ctx context.Context) error {
	w.ckMu.Lock()
	defer w.ckMu.Unlock()
	pos, err := w.loadPosition(ctx, false)
	if err != nil {
		return err
	}
	w.saved, w.hasSaved, w.savedAt = pos, true, time.Now()
	w.mu.Lock()
	w.cursor = pos
	w.savedMirror = pos
	w.loaded = true
	w.mu.Unlock()
	w.setMarked(pos)
	return nil
}

// loadPosition reads the saved token, or picks and saves the start position of a new client.
// It first finds out whether the changelog is upgraded (reads follow snapshot deltas) and, if
// so, checks the stored transaction ids against the database's counter. rewinding is set when
// the watcher goes back to the saved token after a server recovery: a client without one then
// starts from the beginning, since no start position taken before the recovery can be trusted.
// ckMu must be held; reader goroutine only.
func (w *Watcher) loadPosition(ctx context.Context, rewinding bool) (Position, error) {
	var skipFree, stats bool
	if err := w.cfg.DB.QueryRowContext(ctx, w.q.detect, changelog.Quote(w.cfg.ChangelogTable),
		changelog.Quote(changelog.IncarnationTable(w.cfg.ChangelogTable))).Scan(&skipFree, &w.hasInc, &stats); err != nil {
		return Position{}, fmt.Errorf("inspect changelog %s: %w", w.cfg.ChangelogTable, err)
	}
	w.noteStats(stats)
	var (
		now position.Snapshot
		inc string
	)
	if skipFree {
		var err error
		if now, inc, err = w.transactionCounter(ctx); err != nil {
			return Position{}, err
		}
	} else {
		w.upgradeChecked = time.Now() // noticeUpgrade looks again upgradeCheckInterval later
	}
	if !skipFree && !w.legacyNoted {
		w.legacyNoted = true
		w.log.Warn("the changelog has no txid column: reads are not skip-free (a row whose transaction commits "+
			"behind the read position is found only through its NOTIFY); upgrade it with schema.Install, "+
			"or the statements it lists with DryRun; a running watcher then switches over by itself", "changelog", w.cfg.ChangelogTable)
	}
	if skipFree && !w.hasInc && !w.incNoted {
		w.incNoted = true
		w.log.Warn("the changelog has no incarnation table: after a server crash the watcher notices the "+
			"transaction counter going back only while it has not passed the ids seen before; run schema.Install to add it",
			"table", changelog.IncarnationTable(w.cfg.ChangelogTable))
	}
	if w.sh != nil {
		return w.loadShared(ctx, rewinding, skipFree, now, inc)
	}
	raw, found, err := w.claimToken(ctx, !rewinding)
	if err != nil {
		return Position{}, err
	}
	var (
		pos  Position
		save bool
	)
	switch {
	case !found && rewinding:
		if pos, err = w.beginning(ctx, skipFree, now); err != nil {
			return Position{}, err
		}
		save = true
	case !found:
		if pos, err = w.startPosition(ctx, skipFree, now); err != nil {
			return Position{}, err
		}
		save = true // so a restart before the first acknowledgement resumes here too
		w.log.Info("no saved token: starting", "position", pos, "from_beginning", w.cfg.StartFromBeginning)
	default:
		var table string
		pos, table, err = position.DecodeTableToken([]byte(raw))
		if table != "" && table != w.cfg.TableName && !rewinding {
			w.log.Warn("the saved token was written by a watcher of another table; Prune keeps this table's rows "+
				"for it only once it saves its own", "token_table", table)
		}
		if errors.Is(err, position.ErrTokenNeedsLookup) {
			pos, err = w.tokenRowPosition(ctx, pos.ID)
		}
		if err != nil {
			return Position{}, fmt.Errorf("load saved token of client %q: %w", w.cfg.ClientName, err)
		}
		if pos, save, err = w.resumePosition(ctx, pos, skipFree, now); err != nil {
			return Position{}, err
		}
		if !rewinding {
			w.log.Info("resuming after the saved token", "position", pos)
		}
	}
	if pos.Span != nil { // the snapshots were read in (or, for a saved token, survived into) inc
		s := *pos.Span
		s.Inc = inc
		pos.Span = &s
	}
	if save && !w.cfg.Ephemeral {
		if err := w.writeToken(ctx, pos, w.ackedSeq()); err != nil {
			return Position{}, fmt.Errorf("save start position to token table %s: %w", w.cfg.TokenTable, err)
		}
		w.ckWrites.Add(1)
	}
	w.skipFree.Store(skipFree)
	if skipFree {
		w.hints.Take() // noted before the load: snapshot deltas need no ids
	}
	return pos, nil
}

// changelogReadError is a failure to read the changelog while loading: health counts it as a
// read failure, not as one of the token table.
type changelogReadError struct{ error }

func (e changelogReadError) Unwrap() error { return e.error }

// transactionCounter returns the current snapshot of an upgraded changelog and the server's
// incarnation ("" without an incarnation table), after checking that no transaction id stored
// for the table is at or beyond it (a restored database).
func (w *Watcher) transactionCounter(ctx context.Context) (position.Snapshot, string, error) {
	var (
		text, inc string
		newest    sql.NullString
		err       error
	)
	if w.hasInc {
		err = w.queryIncarnation(ctx, w.q.deltaStartInc, []any{w.cfg.TableName}, &text, &newest, &inc)
	} else {
		err = w.cfg.DB.QueryRowContext(ctx, w.q.deltaStart, w.cfg.TableName).Scan(&text, &newest)
	}
	if err != nil {
		return position.Snapshot{}, "", changelogReadError{fmt.Errorf("read changelog: take snapshot: %w", err)}
	}
	now, err := position.ParseSnapshot(text)
	if err != nil {
		return position.Snapshot{}, "", err
	}
	if newest.Valid {
		x, err := strconv.ParseUint(newest.String, 10, 64)
		if err != nil {
			return position.Snapshot{}, "", fmt.Errorf("read changelog: newest txid %q: %w", newest.String, err)
		}
		if x >= now.Xmax {
			return position.Snapshot{}, "", fmt.Errorf("%w: the changelog holds txid %d, the current snapshot is %s",
				ErrRestoredDatabase, x, now)
		}
	}
	return now, inc, nil
}

// resumePosition adapts a saved token to the changelog: a legacy token on an upgraded changelog
// starts a switch-over at the current snapshot, cut by switchSnapshot (save reports that the new
// form must be saved at once, so a restart keeps the same switch-over snapshot); a token of an
// upgraded changelog on a legacy one resumes after its legacy position. now is a snapshot taken
// before the token was read (see notAhead).
func (w *Watcher) resumePosition(ctx context.Context, pos Position, skipFree bool, now position.Snapshot) (_ Position, save bool, err error) {
	switch {
	case skipFree && pos.Span == nil:
		s, err := w.switchSnapshot(ctx, pos, pos, now)
		if err != nil {
			return Position{}, false, err
		}
		pos.Span = &position.Span{Base: s}
		w.log.Info("switching a legacy token over to snapshot deltas", "snapshot", s)
		return pos, true, nil
	case skipFree:
		top := pos.Span.Base
		if pos.Span.HasEnd {
			top = pos.Span.End
		}
		return pos, false, w.notAhead(ctx, top, now)
	case pos.Span != nil:
		w.log.Warn("the saved token was written for a changelog with a txid column, which this one lacks; "+
			"resuming after its timestamp and eventID", "position", pos)
		return position.Make(pos.ChangedAt, pos.ID), false, nil
	}
	return pos, false, nil
}

// notAhead fails with ErrRestoredDatabase if top, the newest snapshot of a saved token, is ahead
// of the database's transaction counter. now was taken before the token was read, so a save that
// committed in between (another instance of the client, the previous owner of an exclusive
// client or of a Shared range, a transaction acknowledging with MarkProcessedTx) can hold a
// snapshot taken after now. Only a token still ahead of a snapshot taken after it was read is
// ahead of the counter: its snapshot was taken before its save committed, and on a running
// server a later snapshot's xmax is never below an earlier one's.
func (w *Watcher) notAhead(ctx context.Context, top, now position.Snapshot) error {
	if top.Xmax <= now.Xmax {
		return nil
	}
	after, _, err := w.currentSnapshot(ctx)
	if err != nil {
		return changelogReadError{fmt.Errorf("read changelog: take snapshot: %w", err)}
	}
	if top.Xmax > after.Xmax {
		return fmt.Errorf("%w: the saved token's snapshot is %s, the current snapshot is %s",
			ErrRestoredDatabase, top, after)
	}
	return nil
}

// startPosition is where a client without a saved token starts: after the newest row of its
// table as the database sees it (on an upgraded changelog: after the current snapshot, so rows
// of transactions still open are ahead of it), or at the beginning.
func (w *Watcher) startPosition(ctx context.Context, skipFree bool, now position.Snapshot) (Position, error) {
	if w.cfg.StartFromBeginning {
		return w.beginning(ctx, skipFree, now)
	}
	var (
		ts  time.Time
		id  int64
		pos Position
	)
	err := w.cfg.DB.QueryRowContext(ctx, w.q.newest, w.cfg.TableName).Scan(&ts, &id)
	switch {
	case errors.Is(err, sql.ErrNoRows): // nothing to skip
	case err != nil:
		return Position{}, changelogReadError{fmt.Errorf("read changelog: find newest position in %s: %w", w.cfg.ChangelogTable, err)}
	default:
		pos = position.Make(ts, id)
	}
	if skipFree {
		pos.Span = &position.Span{Seq: 1, Base: now}
	}
	return pos, nil
}

// beginning is the position before every row of the table: on an upgraded changelog, a
// switch-over from it (switchSnapshot): the rows without a txid in legacy order, then the rows
// with one in deltas.
func (w *Watcher) beginning(ctx context.Context, skipFree bool, now position.Snapshot) (Position, error) {
	if !skipFree {
		return Position{}, nil
	}
	s, err := w.switchSnapshot(ctx, Position{}, Position{}, now)
	if err != nil {
		return Position{}, err
	}
	return Position{Span: &position.Span{Base: s}}, nil
}

// tokenRowPosition converts an id-only saved token by looking up its row's changed_at. If the
// row is gone, the position is placed before every row (replaying rather than skipping).
func (w *Watcher) tokenRowPosition(ctx context.Context, id int64) (Position, error) {
	var ts time.Time
	err := w.cfg.DB.QueryRowContext(ctx, w.q.rowTime, id).Scan(&ts)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		w.log.Warn("the saved token's changelog row no longer exists; replaying the table from the beginning", "id", id)
		return Position{ID: id}, nil
	case err != nil:
		return Position{}, fmt.Errorf("look up changelog %s row %d of an id-only token: %w", w.cfg.ChangelogTable, id, err)
	}
	return position.Make(ts, id), nil
}

// saveRule says when a save writes.
type saveRule uint8

const (
	// saveChanged writes a checkpoint that differs from the last one saved (MarkProcessed,
	// Flush, late rows, the switch-over).
	saveChanged saveRule = iota
	// saveBatched is the batched saver's: saveChanged, and also a checkpoint that no read
	// moved once CheckpointRefreshInterval passed since the last save, with nothing pending.
	saveBatched
	// saveIdle is the idle saver's: saveBatched, but only with nothing pending.
	saveIdle
)

// saveCheckpoint computes the checkpoint and persists it if rule says so. Compute and write
// happen under ckMu, so saves are ordered; mu is held only to compute. A write is told to
// Config.Observer after ckMu is released.
func (w *Watcher) saveCheckpoint(ctx context.Context, rule saveRule) error {
	var write SaveObservation
	saved, err := w.writeCheckpoint(ctx, rule, &write)
	if o := w.cfg.Observer; o != nil && !write.Start.IsZero() {
		o.ObserveSave(ctx, write)
	}
	if saved {
		w.afterSave(ctx) // outside ckMu: marking must not hold up the next save
	}
	if err == nil && w.sh != nil && w.sh.leaveWhenDrained.Load() {
		return w.leaveIfDrained(ctx)
	}
	return err
}

// writeCheckpoint is saveCheckpoint's compute-and-save under ckMu. saved reports a successful
// write; write is set when a write was tried.
func (w *Watcher) writeCheckpoint(ctx context.Context, rule saveRule, write *SaveObservation) (saved bool, _ error) {
	w.ckMu.Lock()
	defer w.ckMu.Unlock()
	for try := 1; ; try++ {
		saved, err := w.writeCheckpointOnce(ctx, rule, write)
		if !errors.Is(err, errAckAhead) || try == ackAheadTries {
			return saved, err
		}
	}
}

// writeCheckpointOnce is one compute-and-save of writeCheckpoint, after applying an
// acknowledgement committed in a transaction. ckMu must be held.
func (w *Watcher) writeCheckpointOnce(ctx context.Context, rule saveRule, write *SaveObservation) (saved bool, _ error) {
	if err := w.catchUpTxAcks(ctx); err != nil {
		return false, fmt.Errorf("pgchangestream: %s: %w", opSave, err)
	}
	p, seq, ok, busy := w.checkpoint()
	// With nothing pending the checkpoint is the cursor: a refresh saves the newest snapshot
	// read (or the same position again), and passes no delivery.
	refresh := rule != saveChanged && !busy && time.Since(w.savedAt) >= w.cfg.CheckpointRefreshInterval
	if !ok || (rule == saveIdle && busy) || w.cfg.Ephemeral {
		return false, nil
	}
	if err := w.excl.lostErr(); err != nil { // a standby may hold the lock now
		return false, fmt.Errorf("pgchangestream: save checkpoint %s: %w", p, err)
	}
	if w.hasSaved && unchanged(p, w.saved) && !refresh {
		return false, nil
	}
	start := time.Now()
	err := w.writeToken(ctx, p, seq)
	*write = SaveObservation{Start: start, Duration: time.Since(start), Checkpoint: p}
	if errors.Is(err, errAckAhead) { // computed again at once
		return false, err
	}
	if err != nil {
		w.ckErrors.Add(1)
		if errors.Is(err, ErrServerRecovered) {
			w.askRewind()
		}
		err = fmt.Errorf("pgchangestream: %s %s to token table %s: %w", opSave, p, w.cfg.TokenTable, err)
		// The caller gave up, or a caller's transaction holds the row: no fault of the database's.
		if !errors.Is(ctx.Err(), context.Canceled) && !errors.Is(err, errTokenLocked) {
			w.health.fail(opSave, err)
		}
		write.Err = err
		return false, err
	}
	w.ckWrites.Add(1)
	w.health.ok(opSave)
	w.saved, w.hasSaved, w.savedAt = p, true, time.Now()
	w.mu.Lock()
	w.savedMirror = p
	w.mu.Unlock()
	return true, nil
}

// unchanged reports whether saving p instead of saved would change nothing: the same position
// in the same form, or two delta starts with no row read in between (only snapshots moved on).
func unchanged(p, saved Position) bool {
	if (p.Span == nil) != (saved.Span == nil) { // a legacy position switched over in place
		return false
	}
	if p.Compare(saved) == 0 {
		return true
	}
	return p.InDelta() && saved.InDelta() && !p.InRows && !saved.InRows &&
		p.ID == saved.ID && p.ChangedAt.Equal(saved.ChangedAt)
}

// Flush saves the current checkpoint now if it changed. With a batched
// [Config.CheckpointInterval] it also returns (once) a background save failure not yet reported.
func (w *Watcher) Flush(ctx context.Context) error {
	if w.cfgErr != nil {
		return w.cfgErr
	}
	prev := w.takeBackgroundError()
	return joinErrors(prev, w.saveCheckpoint(ctx, saveChanged))
}

// takeBackgroundError returns and clears the last background save failure.
func (w *Watcher) takeBackgroundError() error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	err := w.bgErr
	w.bgErr = nil
	return err
}

// saveLoop is the saver goroutine. With a batched CheckpointInterval it saves the checkpoint at
// most once per interval when it changed; otherwise it saves only a checkpoint that moved with
// nothing pending (rows skipped by the filter), at most once per IdleCheckpointInterval. Either
// way, with nothing pending, it saves a checkpoint no read moved once CheckpointRefreshInterval
// passed since the last save.
func (w *Watcher) saveLoop(ctx context.Context) {
	defer w.wg.Done()
	defer w.recoverPanic(opPanic, "saver", w.stopWith)
	batched := w.cfg.CheckpointInterval > 0
	interval, rule := w.cfg.IdleCheckpointInterval, saveIdle
	if batched {
		interval, rule = w.cfg.CheckpointInterval, saveBatched
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	failed := newRepeatLog(w.log, slog.LevelError, "background checkpoint save failed")
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil { // stopping: a tick that raced the stop starts no new save
			return
		}
		err := w.saveInBackground(ctx, rule)
		if errors.Is(err, errTokenLocked) { // a caller's transaction is acknowledging: the next tick saves
			w.log.Debug("checkpoint save deferred", "error", err)
			continue
		}
		if err == nil {
			failed.ok()
			continue
		}
		failed.fail("error", err)
		if batched {
			w.errMu.Lock()
			w.bgErr = err
			w.errMu.Unlock()
		}
	}
}

// backgroundSaveTimeout bounds a save the watcher starts by itself.
const backgroundSaveTimeout = 30 * time.Second

// saveInBackground is a save the watcher starts by itself (idle, batched, or behind a late
// row). Stopping the watcher does not cancel it mid-statement, so its outcome is known: either
// it committed and is recorded, or it failed. Only the timeout bounds it.
func (w *Watcher) saveInBackground(ctx context.Context, rule saveRule) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), backgroundSaveTimeout)
	defer cancel()
	return w.saveCheckpoint(ctx, rule)
}

// GetUnprocessedEventCount counts the changelog rows of the watched table after lastProcessedID
// (the cursor's id when empty) that are not marked processed, as the watcher it replaces did.
// Without [Config.ProcessedFlag] it counts every row after that id. The processed flag is shared by
// every client of the table and set in the background, so the count is approximate: for this
// client's exact backlog use [Watcher.Backlog].
func (w *Watcher) GetUnprocessedEventCount(ctx context.Context, lastProcessedID string) (int64, error) {
	if w.cfgErr != nil {
		return 0, w.cfgErr
	}
	var after int64
	if lastProcessedID == "" {
		w.mu.Lock()
		after = w.cursor.ID
		w.mu.Unlock()
	} else {
		id, ok, err := position.ParseToken([]byte(lastProcessedID))
		if err != nil || !ok {
			return 0, fmt.Errorf("pgchangestream: lastProcessedID: %w", err)
		}
		after = id
	}
	var n int64
	if err := w.cfg.DB.QueryRowContext(ctx, w.q.unprocessed, w.cfg.TableName, after).Scan(&n); err != nil {
		return 0, fmt.Errorf("pgchangestream: count unprocessed events: %w", err)
	}
	return n, nil
}

// Backlog counts the rows of the watched table, visible now, that this client's saved token
// does not certify: what a restart would deliver. Unlike GetUnprocessedEventCount it does not
// read the shared processed flag, so it is exact for this client. It counts rows still in the
// Events channel or not acknowledged, and is 0 only when everything was acknowledged and saved.
func (w *Watcher) Backlog(ctx context.Context) (int64, error) {
	if w.cfgErr != nil {
		return 0, w.cfgErr
	}
	w.mu.Lock()
	saved, loaded := w.savedMirror, w.loaded
	w.mu.Unlock()
	if !loaded {
		return 0, errors.New("pgchangestream: backlog: the saved token is not loaded yet")
	}
	var args changelog.Params
	conds := []string{"c.table_name = " + args.Add(w.cfg.TableName)}
	n, _, _, err := changelog.CountNotCertified(ctx, w.cfg.DB, changelog.Quote(w.cfg.ChangelogTable), saved, conds, args)
	if err != nil {
		return 0, fmt.Errorf("pgchangestream: count backlog in changelog %s: %w", w.cfg.ChangelogTable, err)
	}
	return n, nil
}
