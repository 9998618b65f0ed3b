package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/lock"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// Saves of the checkpoint. Every write of the client's saved position lives in this file: the
// watcher's own saves (writeToken and the statements it picks: plain, fenced, marked, a Shared
// member's ranges, the first row of a fenced new client) and MarkProcessedTx's write in the
// caller's transaction (writeInTx). Loading the token and claiming an owner epoch are in
// load.go.

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

// writeToken saves p as the client's token; seq is the last delivery acknowledged in memory
// when p was computed (the marker of a watcher that acknowledged in a transaction, txack.go).
// It is fenced to the watcher's owner epoch when it claimed one (the first save of a fenced new
// client creates the token row with epoch 1, on the lock session), and a position read in a
// server incarnation is written only while the server is still in it (see load.go). A fenced
// save that matches no row stops the watcher and returns an error wrapping ErrFenced; a save
// whose incarnation ended writes nothing and returns ErrServerRecovered. ckMu must be held.
func (w *Watcher) writeToken(ctx context.Context, p Position, seq uint64) error {
	tok := position.EncodeToken(p, w.cfg.TableName)
	var inc string
	if p.Span != nil {
		inc = p.Span.Inc
	}
	switch {
	case w.sh != nil:
		return w.writeShared(ctx, p, string(tok), inc)
	case w.fenced && w.epoch == 0: // the lock session ends with a crash: it cannot outlive the incarnation
		return w.claimNew(ctx, string(tok))
	case w.txAcked:
		return w.writeMarked(ctx, tok, seq, inc)
	}
	return w.writePlain(ctx, string(tok), inc)
}

// writePlain is writeToken's statement without a marker. ckMu must be held.
func (w *Watcher) writePlain(ctx context.Context, tok, inc string) error {
	var (
		res sql.Result
		err error
	)
	switch {
	case !w.fenced && inc == "":
		_, err = w.cfg.DB.ExecContext(ctx, w.q.SaveToken, w.cfg.ClientName, tok)
		return err
	case !w.fenced:
		res, err = w.cfg.DB.ExecContext(ctx, w.q.SaveTokenInc, w.cfg.ClientName, tok, inc)
	case inc == "":
		res, err = w.cfg.DB.ExecContext(ctx, w.q.SaveFenced, w.cfg.ClientName, tok, w.epoch)
	default:
		res, err = w.cfg.DB.ExecContext(ctx, w.q.SaveFencedInc, w.cfg.ClientName, tok, w.epoch, inc)
	}
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	return w.noWriteErr(ctx, w.cfg.DB, w.fenced, w.epoch, inc)
}

// noWriteErr explains a save that matched no row: the incarnation ended (ErrServerRecovered),
// or, fenced to epoch, a later owner claimed the client (ErrFenced: the watcher stops). q is
// where the save ran.
func (w *Watcher) noWriteErr(ctx context.Context, q queryer, fenced bool, epoch int64, inc string) error {
	if !fenced { // only the incarnation can have stopped an upsert
		return ErrServerRecovered
	}
	if inc != "" {
		var same bool
		if err := q.QueryRowContext(ctx, w.q.IncarnationIs, inc).Scan(&same); err != nil {
			return fmt.Errorf("the save wrote nothing; checking why: %w", err)
		}
		if !same {
			return ErrServerRecovered
		}
	}
	err := fmt.Errorf("%w: the token row no longer holds owner epoch %d", ErrFenced, epoch)
	w.stopOwning(err, "fenced off: a later watcher owns this client; stopping")
	return err
}

// claimNew creates the token row of a new client with epoch 1, on the lock session while it
// holds the lock. It fails when a row appeared meanwhile (a watcher without Config.Exclusive
// saved one): the load is retried, and claims that row.
func (w *Watcher) claimNew(ctx context.Context, token string) error {
	s := w.excl.current()
	if s == nil {
		return w.lockLostErr()
	}
	c, o := lock.Halves(lock.Key(w.cfg.TokenTable, w.cfg.ClientName))
	row, err := s.Query(ctx, w.q.ClaimNew, w.cfg.ClientName, token, string(itoa(c)), string(itoa(o)))
	switch {
	case err != nil:
		return err
	case len(row) == 0:
		return errors.New("the token row was created meanwhile, or the lock was lost: claiming again")
	}
	w.epoch = 1
	w.log.Info("claimed the client", "owner_epoch", w.epoch)
	return nil
}

// writeMarked is writeToken once the watcher acknowledged in a transaction: the token carries
// the marker of seq, and the save neither waits for the row lock nor writes over a later
// marker of this watcher (errAckAhead, after applying it). ckMu must be held.
func (w *Watcher) writeMarked(ctx context.Context, tok []byte, seq uint64, inc string) error {
	t := string(appendAck(tok, w.instance, seq))
	res, err := w.cfg.DB.ExecContext(ctx, w.q.AckSave[changelog.AckIndex(w.fenced, inc)], saveArgs(w.cfg.ClientName, t, w.fenced, w.epoch, inc)...)
	if err != nil {
		if changelog.HasCode(err, changelog.LockNotAvailable) {
			return fmt.Errorf("%w: %w", errTokenLocked, err)
		}
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	stored, mine, found, err := w.readAck(ctx, w.cfg.DB)
	switch {
	case err != nil:
		return fmt.Errorf("the save wrote nothing; checking why: %w", err)
	case mine && stored > seq:
		w.applyTxAck(stored)
		return errAckAhead
	case !found && !w.fenced: // the row was deleted: create it again, as an unmarked save does
		return w.writePlain(ctx, t, inc)
	}
	return w.noWriteErr(ctx, w.cfg.DB, w.fenced, w.epoch, inc)
}

// writeShared saves p (as tok, read in incarnation inc) to the ranges the member owns, except
// those whose floor p does not cover yet; once saved, it drops the floors p covers (until
// then those ranges still hold their own positions, which reads and compaction respect). A range the member no
// longer owns (another member claimed it after this one's lease ran out) fences the save off:
// the watcher stops. ckMu must be held.
func (w *Watcher) writeShared(ctx context.Context, p Position, tok, inc string) error {
	v := w.sh.view.Load()
	ranges := v.owned
	var next *sharedView // the view without the floors p covers, once p is saved
	if len(v.floors) > 0 {
		ranges = nil
		floors := make(map[int]Position)
		for _, r := range v.owned {
			if f, ok := v.floors[r]; ok && !covers(p, f) {
				floors[r] = f
				continue
			}
			ranges = append(ranges, r)
		}
		if len(floors) < len(v.floors) {
			if len(floors) == 0 {
				floors = nil
			}
			next = newSharedView(v.owned, floors)
		}
	}
	if len(ranges) == 0 {
		return nil
	}
	id := w.sh.id.Load()
	var (
		res sql.Result
		err error
	)
	if inc == "" {
		res, err = w.cfg.DB.ExecContext(ctx, w.sh.q.save, w.cfg.ClientName, id, tok, changelog.Array(int64s(ranges)))
	} else {
		res, err = w.cfg.DB.ExecContext(ctx, w.sh.q.saveInc, w.cfg.ClientName, id, tok, changelog.Array(int64s(ranges)), inc)
	}
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	switch {
	case err != nil:
		return err
	case n == int64(len(ranges)):
		if next != nil {
			w.sh.view.Store(next)
		}
		return nil
	}
	if inc != "" {
		var same bool
		if err := w.cfg.DB.QueryRowContext(ctx, w.q.IncarnationIs, inc).Scan(&same); err != nil {
			return fmt.Errorf("the save wrote nothing; checking why: %w", err)
		}
		if !same {
			return ErrServerRecovered
		}
	}
	err = fmt.Errorf("%w: member %d no longer owns %d of its %d ranges", ErrFenced, id, len(ranges)-int(n), len(ranges))
	w.stopOwning(err, "fenced off: another member took over ranges of this one; stopping")
	return err
}

// writeInTx is MarkProcessedTx's write of the marked token tok (seq, fencing and incarnation as
// writeToken's) in the caller's transaction tx.
func (w *Watcher) writeInTx(ctx context.Context, tx *sql.Tx, tok string, seq uint64, fenced bool, epoch int64, inc string) error {
	res, err := tx.ExecContext(ctx, w.q.AckTx[changelog.AckIndex(fenced, inc)], saveArgs(w.cfg.ClientName, tok, fenced, epoch, inc)...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	return w.whyNoTxWrite(ctx, tx, seq, fenced, epoch, inc)
}

// whyNoTxWrite explains a MarkProcessedTx write that affected no row: nil when a later
// acknowledgement of this watcher was committed first (it certifies this one too).
func (w *Watcher) whyNoTxWrite(ctx context.Context, tx *sql.Tx, seq uint64, fenced bool, epoch int64, inc string) error {
	stored, mine, found, err := w.readAck(ctx, tx)
	switch {
	case err != nil:
		return fmt.Errorf("the save wrote nothing; checking why: %w", err)
	case mine && stored >= seq:
		return nil
	case !found && !fenced:
		return errors.New("the client has no token row (it was deleted): the watcher's next save creates it again")
	}
	err = w.noWriteErr(ctx, tx, fenced, epoch, inc)
	if errors.Is(err, ErrServerRecovered) {
		w.askRewind()
	}
	return err
}
