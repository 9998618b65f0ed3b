package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/lock"
	"github.com/pgchangestream/pgchangestream/internal/marker"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// Saves of the checkpoint. Every write of the client's saved position lives in this file: the
// watcher's own saves (writeToken and the statements it picks: plain, fenced, marked, a Shared
// member's ranges, the first row of a fenced new client) and MarkProcessedTx's write in the
// caller's transaction (writeInTx). Loading the token and claiming an owner epoch are in
// load.go.

// saver computes and writes the checkpoint, and reads the saved token back for a load (with the
// owner-epoch claim and the start positions of load.go): it owns the save state, guarded by
// ckMu, and reads the delivery state through the reader's methods. The Watcher embeds it; its
// dependencies are set by newWatcher and immutable after.
type saver struct {
	rd       *reader               // the delivery state the checkpoint is computed from
	cfg      *Config               // the watcher's configuration
	q        *changelog.Statements // the watcher's statements
	log      *slog.Logger          // the watcher's logger
	health   *health               // the watcher's health record
	excl     *exclusive            // the exclusive lock's state
	sh       *sharedMember         // nil unless Config.Shared
	mark     *marker.Marker        // nil unless the watcher sets the processed flag
	instance string                // names this watcher's acknowledgement markers (txack.go)
	// fence stops the watcher after a save found a later owner (stopOwning); recovered asks the
	// reader to rewind after a save found the server recovered (askRewind); leaveIfDrained is a
	// Shared member's leave once drained.
	fence          func(err error, msg string)
	recovered      func()
	leaveIfDrained func(ctx context.Context) error
	// loseLock stops an exclusive watcher whose lock session no longer holds the lock.
	loseLock func(cause error)

	// Save state, guarded by ckMu, which serializes compute-and-save.
	ckMu     sync.Mutex
	saved    Position
	hasSaved bool
	savedAt  time.Time // when saved was loaded or last written
	// fenced: saves match the owner epoch (Config.Exclusive on a token table with the
	// owner_epoch column); epoch: the epoch claimed by the load, 0 until the token row of a new
	// client is created (load.go). Set by each load.
	fenced        bool
	epoch         int64
	unfencedNoted bool // the unfenced token table was reported
	// txAcked: MarkProcessedTx was called, so saves carry the acknowledgement marker and
	// never write over a later one (txack.go). Set once, under ckMu.
	txAcked bool
	// txSeq: the highest delivery seq a MarkProcessedTx wrote, committed or not (atomic; read
	// by saves, which look for its marker while it is above the seq acknowledged in memory).
	txSeq atomic.Uint64

	// The last background save failure, returned once, guarded by errMu: not ckMu, so that an
	// acknowledgement in batched mode never waits for a save it did not ask for.
	errMu sync.Mutex
	bgErr error

	// Counters, atomic: added by the saves, read by Stats from any goroutine.
	ckWrites atomic.Uint64 // added under ckMu (and by load) after each successful save
	ckErrors atomic.Uint64 // added under ckMu after each failed save
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
func (s *saver) saveCheckpoint(ctx context.Context, rule saveRule) error {
	var write SaveObservation
	saved, err := s.writeCheckpoint(ctx, rule, &write)
	if o := s.cfg.Observer; o != nil && !write.Start.IsZero() {
		o.ObserveSave(ctx, write)
	}
	if saved {
		s.afterSave(ctx) // outside ckMu: marking must not hold up the next save
	}
	if err == nil && s.sh != nil && s.sh.leaveWhenDrained.Load() {
		return s.leaveIfDrained(ctx)
	}
	return err
}

// writeCheckpoint is saveCheckpoint's compute-and-save under ckMu. saved reports a successful
// write; write is set when a write was tried.
func (s *saver) writeCheckpoint(ctx context.Context, rule saveRule, write *SaveObservation) (saved bool, _ error) {
	s.ckMu.Lock()
	defer s.ckMu.Unlock()
	for try := 1; ; try++ {
		saved, err := s.writeCheckpointOnce(ctx, rule, write)
		if !errors.Is(err, errAckAhead) || try == ackAheadTries {
			return saved, err
		}
	}
}

// writeCheckpointOnce is one compute-and-save of writeCheckpoint, after applying an
// acknowledgement committed in a transaction. ckMu must be held.
func (s *saver) writeCheckpointOnce(ctx context.Context, rule saveRule, write *SaveObservation) (saved bool, _ error) {
	if err := s.catchUpTxAcks(ctx); err != nil {
		return false, fmt.Errorf("pgchangestream: %s: %w", opSave, err)
	}
	p, seq, ok, busy := s.rd.checkpoint()
	// With nothing pending the checkpoint is the cursor: a refresh saves the newest snapshot
	// read (or the same position again), and passes no delivery.
	refresh := rule != saveChanged && !busy && time.Since(s.savedAt) >= s.cfg.CheckpointRefreshInterval
	if !ok || (rule == saveIdle && busy) || s.cfg.Ephemeral {
		return false, nil
	}
	if err := s.excl.lostErr(); err != nil { // a standby may hold the lock now
		return false, fmt.Errorf("pgchangestream: save checkpoint %s: %w", p, err)
	}
	if s.hasSaved && unchanged(p, s.saved) && !refresh {
		return false, nil
	}
	start := time.Now()
	err := s.writeToken(ctx, p, seq)
	*write = SaveObservation{Start: start, Duration: time.Since(start), Checkpoint: p}
	if errors.Is(err, errAckAhead) { // computed again at once
		return false, err
	}
	if err != nil {
		s.ckErrors.Add(1)
		if errors.Is(err, ErrServerRecovered) {
			s.recovered()
		}
		err = fmt.Errorf("pgchangestream: %s %s to token table %s: %w", opSave, p, s.cfg.TokenTable, err)
		// The caller gave up, or a caller's transaction holds the row: no fault of the database's.
		if !errors.Is(ctx.Err(), context.Canceled) && !errors.Is(err, errTokenLocked) {
			s.health.fail(opSave, err)
		}
		write.Err = err
		return false, err
	}
	s.ckWrites.Add(1)
	s.health.ok(opSave)
	s.saved, s.hasSaved, s.savedAt = p, true, time.Now()
	s.rd.noteSaved(p)
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
func (s *saver) takeBackgroundError() error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	err := s.bgErr
	s.bgErr = nil
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
func (s *saver) saveInBackground(ctx context.Context, rule saveRule) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), backgroundSaveTimeout)
	defer cancel()
	return s.saveCheckpoint(ctx, rule)
}

// writeToken saves p as the client's token; seq is the last delivery acknowledged in memory
// when p was computed (the marker of a watcher that acknowledged in a transaction, txack.go).
// It is fenced to the watcher's owner epoch when it claimed one (the first save of a fenced new
// client creates the token row with epoch 1, on the lock session), and a position read in a
// server incarnation is written only while the server is still in it (see load.go). A fenced
// save that matches no row stops the watcher and returns an error wrapping ErrFenced; a save
// whose incarnation ended writes nothing and returns ErrServerRecovered. ckMu must be held.
func (s *saver) writeToken(ctx context.Context, p Position, seq uint64) error {
	tok := position.EncodeToken(p, s.cfg.TableName)
	var inc string
	if p.Span != nil {
		inc = p.Span.Inc
	}
	switch {
	case s.sh != nil:
		return s.writeShared(ctx, p, string(tok), inc)
	case s.fenced && s.epoch == 0: // the lock session ends with a crash: it cannot outlive the incarnation
		return s.claimNew(ctx, string(tok))
	case s.txAcked:
		return s.writeMarked(ctx, tok, seq, inc)
	}
	return s.writePlain(ctx, string(tok), inc)
}

// writePlain is writeToken's statement without a marker. ckMu must be held.
func (s *saver) writePlain(ctx context.Context, tok, inc string) error {
	var (
		res sql.Result
		err error
	)
	switch {
	case !s.fenced && inc == "":
		_, err = s.cfg.DB.ExecContext(ctx, s.q.SaveToken, s.cfg.ClientName, tok)
		return err
	case !s.fenced:
		res, err = s.cfg.DB.ExecContext(ctx, s.q.SaveTokenInc, s.cfg.ClientName, tok, inc)
	case inc == "":
		res, err = s.cfg.DB.ExecContext(ctx, s.q.SaveFenced, s.cfg.ClientName, tok, s.epoch)
	default:
		res, err = s.cfg.DB.ExecContext(ctx, s.q.SaveFencedInc, s.cfg.ClientName, tok, s.epoch, inc)
	}
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	return s.noWriteErr(ctx, s.cfg.DB, s.fenced, s.epoch, inc)
}

// noWriteErr explains a save that matched no row: the incarnation ended (ErrServerRecovered),
// or, fenced to epoch, a later owner claimed the client (ErrFenced: the watcher stops). q is
// where the save ran.
func (s *saver) noWriteErr(ctx context.Context, q queryer, fenced bool, epoch int64, inc string) error {
	if !fenced { // only the incarnation can have stopped an upsert
		return ErrServerRecovered
	}
	if inc != "" {
		var same bool
		if err := q.QueryRowContext(ctx, s.q.IncarnationIs, inc).Scan(&same); err != nil {
			return fmt.Errorf("the save wrote nothing; checking why: %w", err)
		}
		if !same {
			return ErrServerRecovered
		}
	}
	err := fmt.Errorf("%w: the token row no longer holds owner epoch %d", ErrFenced, epoch)
	s.fence(err, "fenced off: a later watcher owns this client; stopping")
	return err
}

// claimNew creates the token row of a new client with epoch 1, on the lock session while it
// holds the lock. It fails when a row appeared meanwhile (a watcher without Config.Exclusive
// saved one): the load is retried, and claims that row.
func (s *saver) claimNew(ctx context.Context, token string) error {
	sess := s.excl.current()
	if sess == nil {
		return s.excl.lockLostErr()
	}
	c, o := lock.Halves(lock.Key(s.cfg.TokenTable, s.cfg.ClientName))
	row, err := sess.Query(ctx, s.q.ClaimNew, s.cfg.ClientName, token, string(itoa(c)), string(itoa(o)))
	switch {
	case err != nil:
		return err
	case len(row) == 0:
		return errors.New("the token row was created meanwhile, or the lock was lost: claiming again")
	}
	s.epoch = 1
	s.log.Info("claimed the client", "owner_epoch", s.epoch)
	return nil
}

// writeMarked is writeToken once the watcher acknowledged in a transaction: the token carries
// the marker of seq, and the save neither waits for the row lock nor writes over a later
// marker of this watcher (errAckAhead, after applying it). ckMu must be held.
func (s *saver) writeMarked(ctx context.Context, tok []byte, seq uint64, inc string) error {
	t := string(appendAck(tok, s.instance, seq))
	res, err := s.cfg.DB.ExecContext(ctx, s.q.AckSave[changelog.AckIndex(s.fenced, inc)], saveArgs(s.cfg.ClientName, t, s.fenced, s.epoch, inc)...)
	if err != nil {
		if changelog.HasCode(err, changelog.LockNotAvailable) {
			return fmt.Errorf("%w: %w", errTokenLocked, err)
		}
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	stored, mine, found, err := s.readAck(ctx, s.cfg.DB)
	switch {
	case err != nil:
		return fmt.Errorf("the save wrote nothing; checking why: %w", err)
	case mine && stored > seq:
		s.rd.applyTxAck(stored)
		return errAckAhead
	case !found && !s.fenced: // the row was deleted: create it again, as an unmarked save does
		return s.writePlain(ctx, t, inc)
	}
	return s.noWriteErr(ctx, s.cfg.DB, s.fenced, s.epoch, inc)
}

// writeShared saves p (as tok, read in incarnation inc) to the ranges the member owns, except
// those whose floor p does not cover yet; once saved, it drops the floors p covers (until
// then those ranges still hold their own positions, which reads and compaction respect). A range the member no
// longer owns (another member claimed it after this one's lease ran out) fences the save off:
// the watcher stops. ckMu must be held.
func (s *saver) writeShared(ctx context.Context, p Position, tok, inc string) error {
	v := s.sh.view.Load()
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
	id := s.sh.id.Load()
	var (
		res sql.Result
		err error
	)
	if inc == "" {
		res, err = s.cfg.DB.ExecContext(ctx, s.sh.q.save, s.cfg.ClientName, id, tok, changelog.Array(int64s(ranges)))
	} else {
		res, err = s.cfg.DB.ExecContext(ctx, s.sh.q.saveInc, s.cfg.ClientName, id, tok, changelog.Array(int64s(ranges)), inc)
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
			s.sh.view.Store(next)
		}
		return nil
	}
	if inc != "" {
		var same bool
		if err := s.cfg.DB.QueryRowContext(ctx, s.q.IncarnationIs, inc).Scan(&same); err != nil {
			return fmt.Errorf("the save wrote nothing; checking why: %w", err)
		}
		if !same {
			return ErrServerRecovered
		}
	}
	err = fmt.Errorf("%w: member %d no longer owns %d of its %d ranges", ErrFenced, id, len(ranges)-int(n), len(ranges))
	s.fence(err, "fenced off: another member took over ranges of this one; stopping")
	return err
}

// writeInTx is MarkProcessedTx's write of the marked token tok (seq, fencing and incarnation as
// writeToken's) in the caller's transaction tx.
func (s *saver) writeInTx(ctx context.Context, tx *sql.Tx, tok string, seq uint64, fenced bool, epoch int64, inc string) error {
	res, err := tx.ExecContext(ctx, s.q.AckTx[changelog.AckIndex(fenced, inc)], saveArgs(s.cfg.ClientName, tok, fenced, epoch, inc)...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	return s.whyNoTxWrite(ctx, tx, seq, fenced, epoch, inc)
}

// whyNoTxWrite explains a MarkProcessedTx write that affected no row: nil when a later
// acknowledgement of this watcher was committed first (it certifies this one too).
func (s *saver) whyNoTxWrite(ctx context.Context, tx *sql.Tx, seq uint64, fenced bool, epoch int64, inc string) error {
	stored, mine, found, err := s.readAck(ctx, tx)
	switch {
	case err != nil:
		return fmt.Errorf("the save wrote nothing; checking why: %w", err)
	case mine && stored >= seq:
		return nil
	case !found && !fenced:
		return errors.New("the client has no token row (it was deleted): the watcher's next save creates it again")
	}
	err = s.noWriteErr(ctx, tx, fenced, epoch, inc)
	if errors.Is(err, ErrServerRecovered) {
		s.recovered()
	}
	return err
}

// The legacy processed flag (rule 12) is set by a marker (internal/marker), not by the saves. A
// save writes the token alone and wakes the marker, which sets the flag of the rows certified
// since the rows it last marked, in one pass however many saves came in between, never past the
// saved token; after each load (and rewind) its first pass catches up on the rows the loaded
// token certifies. The watcher holds the marker (nil unless it sets the flag) and hands it the
// saved position, its health and its logs.

// newMarker returns the processed-flag marker of w.
func (w *Watcher) newMarker() *marker.Marker {
	failed := newRepeatLog(w.log, slog.LevelWarn, "cannot set the processed flag; retrying")
	return marker.New(marker.Config{
		DB:             w.cfg.DB,
		ChangelogTable: w.cfg.ChangelogTable,
		TableName:      w.cfg.TableName,
		Logger:         w.log,
		Saved:          w.markTarget,
		Report: marker.Report{
			Passed: func() { w.health.ok(opMark) },
			Panicked: func(r any) error {
				err := w.panicError("processed-flag marker", r)
				w.health.fail(opMark, err)
				return err
			},
			Retrying: func(err error, wait time.Duration) { failed.fail("error", err, "retry_in", wait) },
			Resumed:  failed.ok,
		},
	})
}

// afterSave has the rows certified by a save marked (see marker.Marker.AfterSave).
func (s *saver) afterSave(ctx context.Context) {
	if s.mark != nil {
		s.mark.AfterSave(ctx)
	}
}

// markPass runs a marking pass now, if the watcher sets the processed flag.
func (s *saver) markPass(ctx context.Context) error {
	if s.mark == nil {
		return nil
	}
	return s.mark.Pass(ctx)
}

// setMarked records p, the loaded token, as where marking goes on from (see
// marker.Marker.SetMarked). mu must not be held.
func (s *saver) setMarked(p Position) {
	if s.mark != nil {
		s.mark.SetMarked(p)
	}
}
