package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// loadWithRetry loads the saved token into the cursor. It never guesses a position: while the
// token cannot be read it retries with backoff until it succeeds or ctx ends.
func (w *Watcher) loadWithRetry(ctx context.Context) error {
	retry := backoff{min: loadRetryMin, max: loadRetryMax}
	for {
		err := w.load(ctx)
		if err == nil {
			w.health.ok(opLoad)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		w.health.fail(opLoad, err)
		wait := retry.next()
		w.log.Error("cannot load the start position; retrying", "error", err, "retry_in", wait)
		if !sleepCtx(ctx, wait) {
			return ctx.Err()
		}
	}
}

// load reads the saved token, or picks and saves the start position of a new client.
func (w *Watcher) load(ctx context.Context) error {
	w.ckMu.Lock()
	defer w.ckMu.Unlock()
	var raw string
	err := w.cfg.DB.QueryRowContext(ctx, w.q.loadToken, w.cfg.ClientName).Scan(&raw)
	var pos Position
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if pos, err = w.startPosition(ctx); err != nil {
			return err
		}
		if w.cfg.Ephemeral {
			w.log.Info("no saved token: starting without saving", "position", pos, "from_beginning", w.cfg.StartFromBeginning)
			break
		}
		// Save it now, so a restart before the first acknowledgement resumes here too.
		if _, err := w.cfg.DB.ExecContext(ctx, w.q.saveToken, w.cfg.ClientName, string(encodeToken(pos))); err != nil {
			return fmt.Errorf("save start position to token table %s: %w", w.cfg.TokenTable, err)
		}
		w.ckWrites.Add(1)
		w.log.Info("no saved token: starting", "position", pos, "from_beginning", w.cfg.StartFromBeginning)
	case err != nil:
		return fmt.Errorf("read token table %s: %w", w.cfg.TokenTable, err)
	default:
		pos, err = decodeToken([]byte(raw))
		if errors.Is(err, errTokenNeedsLookup) {
			pos, err = w.tokenRowPosition(ctx, pos.ID)
		}
		if err != nil {
			return fmt.Errorf("load saved token: %w", err)
		}
		w.log.Info("resuming after the saved token", "position", pos)
	}
	w.saved, w.hasSaved = pos, true
	w.mu.Lock()
	w.cursor = pos
	w.savedMirror = pos
	w.loaded = true
	w.mu.Unlock()
	return nil
}

// startPosition is where a client without a saved token starts: after the newest row of its
// table as the database sees it, or at the beginning.
func (w *Watcher) startPosition(ctx context.Context) (Position, error) {
	if w.cfg.StartFromBeginning {
		return Position{}, nil
	}
	var (
		ts time.Time
		id int64
	)
	err := w.cfg.DB.QueryRowContext(ctx, w.q.newest, w.cfg.TableName).Scan(&ts, &id)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Position{}, nil // nothing to skip
	case err != nil:
		return Position{}, fmt.Errorf("find newest position in changelog %s: %w", w.cfg.ChangelogTable, err)
	}
	return makePosition(ts, id), nil
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
	return makePosition(ts, id), nil
}

// checkpointLocked computes the position to save: min(cursor, floor, predecessor of every
// pending delivery). ok is false before the saved token is loaded. mu must be held.
func (w *Watcher) checkpointLocked() (p Position, ok bool) {
	if !w.loaded {
		return Position{}, false
	}
	p = w.cursor
	if m, ok := w.ring.minPredecessor(); ok {
		p = minPosition(p, m)
	}
	return p, true
}

// saveCheckpoint computes the checkpoint and persists it if it differs from the last one saved.
// Compute and write happen under ckMu, so saves are ordered; mu is held only to compute.
// idleOnly skips the save while deliveries are pending.
func (w *Watcher) saveCheckpoint(ctx context.Context, idleOnly bool) error {
	w.ckMu.Lock()
	defer w.ckMu.Unlock()
	w.mu.Lock()
	p, ok := w.checkpointLocked()
	busy := w.ring.len() > 0 || w.ring.hasFloor
	w.mu.Unlock()
	if !ok || (idleOnly && busy) || (w.hasSaved && p.Compare(w.saved) == 0) || w.cfg.Ephemeral {
		return nil
	}
	if err := w.excl.lostErr(); err != nil { // a standby may hold the lock now
		return fmt.Errorf("pgchangestream: save checkpoint %s: %w", p, err)
	}
	var err error
	if w.cfg.DisableProcessedFlag {
		_, err = w.cfg.DB.ExecContext(ctx, w.q.save, w.cfg.ClientName, string(encodeToken(p)))
	} else {
		_, err = w.cfg.DB.ExecContext(ctx, w.q.save, w.cfg.ClientName, string(encodeToken(p)), w.cfg.TableName, p.ChangedAt, p.ID)
	}
	if err != nil {
		w.ckErrors.Add(1)
		return fmt.Errorf("pgchangestream: save checkpoint %s: %w", p, err)
	}
	w.ckWrites.Add(1)
	w.saved, w.hasSaved = p, true
	w.mu.Lock()
	w.savedMirror = p
	w.mu.Unlock()
	return nil
}

// Flush saves the current checkpoint now if it changed. With a batched
// [Config.CheckpointInterval] it also returns (once) a background save failure not yet reported.
func (w *Watcher) Flush(ctx context.Context) error {
	if w.cfgErr != nil {
		return w.cfgErr
	}
	prev := w.takeBackgroundError()
	return joinErrors(prev, w.saveCheckpoint(ctx, false))
}

// takeBackgroundError returns and clears the last background save failure.
func (w *Watcher) takeBackgroundError() error {
	w.ckMu.Lock()
	defer w.ckMu.Unlock()
	err := w.bgErr
	w.bgErr = nil
	return err
}

// saveLoop is the saver goroutine. With a batched CheckpointInterval it saves the checkpoint at
// most once per interval when it changed; otherwise it saves only a checkpoint that moved with
// nothing pending (rows skipped by the filter), at most once per IdleCheckpointInterval.
func (w *Watcher) saveLoop(ctx context.Context) {
	defer w.wg.Done()
	batched := w.cfg.CheckpointInterval > 0
	interval := w.cfg.IdleCheckpointInterval
	if batched {
		interval = w.cfg.CheckpointInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil { // stopping: a tick that raced the stop starts no new save
			return
		}
		err := w.saveInBackground(ctx, !batched)
		if err == nil {
			continue
		}
		w.log.Error("background checkpoint save failed", "error", err)
		if batched {
			w.ckMu.Lock()
			w.bgErr = err
			w.ckMu.Unlock()
		}
	}
}

// backgroundSaveTimeout bounds a save the watcher starts by itself.
const backgroundSaveTimeout = 30 * time.Second

// saveInBackground is a save the watcher starts by itself (idle, batched, or behind a late
// row). Stopping the watcher does not cancel it mid-statement, so its outcome is known: either
// it committed and is recorded, or it failed. Only the timeout bounds it.
func (w *Watcher) saveInBackground(ctx context.Context, idleOnly bool) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), backgroundSaveTimeout)
	defer cancel()
	return w.saveCheckpoint(ctx, idleOnly)
}

// GetUnprocessedEventCount counts the changelog rows of the watched table after lastProcessedID
// (the cursor's id when empty) that are not marked processed. With DisableProcessedFlag it counts
// every row after that id.
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
		id, ok, err := parseToken([]byte(lastProcessedID))
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
