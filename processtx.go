package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

// TxHandler handles one event for [Watcher.ProcessTx] inside tx, a transaction ProcessTx began
// on Config.DB and commits after it returns nil. The handler writes its effects in tx and must
// neither commit nor roll it back. ctx is as for [Handler].
type TxHandler func(ctx context.Context, tx *sql.Tx, ev EventWithToken) error

// ackCompactInterval is how often, at most, ProcessTx deletes the acknowledgement rows the
// saved token certifies.
const ackCompactInterval = time.Second

// txSaveGap is the least time between two saves of ProcessTx's low-water mark with
// Config.CheckpointInterval 0. Each event's acknowledgement row commits with its effects, so the
// token only tells a restart where to start claiming again; a save per event would add a
// commit, and its WAL flush, to every event for nothing.
const txSaveGap = 100 * time.Millisecond

// readsLegacy reports whether the watcher reads a legacy changelog: its token is loaded and its
// read position is a legacy one. The reader switches it over only while nothing is pending, so
// it stays legacy while any event delivered on it is being handled.
func (w *Watcher) readsLegacy() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.loaded && w.cursor.Span == nil
}

// ProcessTx is [Watcher.Process] with a transaction of its own per event, so that each event's
// effects in the database commit exactly once, with parallel handlers: for each attempt it
// begins a transaction on Config.DB, claims the event in it (an acknowledgement row in
// "<changelog>_acks"), runs handle in it and commits. A claim that finds the event committed
// before (a replay after a stop, a crash or a hand-over) rolls back and finishes the event
// without calling handle (Stats.Process.AlreadyDone). An error or a panic of handle rolls back
// and is retried; a failed commit counts as a failed attempt, and the next attempt's claim finds
// out whether it committed after all. The rerun of a parked event deletes its dead-letter row in
// the same transaction; if an operator dropped it meanwhile, the rerun does nothing. The
// options, per-key order, failure policies, back-pressure, grace period and shutdown are those
// of Process; so is the low-water mark. Its saves are too, except that with CheckpointInterval
// 0 they are at least 100 ms apart: an event's acknowledgement row, committed with its effects,
// is what makes it done, and the saved token only bounds how far back a restart claims events
// again (each such claim finds its row and skips the event). About once a second the
// acknowledgement rows the saved token certifies are deleted.
//
// Each transaction runs with idle_in_transaction_session_timeout set to
// Config.LockSessionTimeout (SET LOCAL): the server ends the session of a transaction left idle
// (the handler waiting outside the database, the process paused) that long, and the attempt
// fails. The time a statement runs does not count. So a handler that waits longer than that
// between statements always fails; and an exclusive successor's takeover, which waits for the
// former owner's claims in flight, waits at most about that long for a paused one.
//
// An exclusive watcher's claims are fenced: once a later owner claimed the client, a claim fails
// with [ErrFenced] (or [ErrExclusiveLost], once the watcher noticed the loss of its lock) and
// ProcessTx stops with that error at once (the event is neither retried nor parked), so a
// former owner commits no effect after its successor started. A [Config.Shared] member's claims
// are fenced by the event's range: a claim inserts only while the member owns the range and
// holds the range row until the transaction ends; another member takes a range over only once
// its former owner's claims in flight have ended (committed, rolled back, or ended by the idle
// timeout above), and every later claim of the former owner fails with [ErrFenced]. An
// [Config.Ephemeral] watcher saves no token and refuses. So does a watcher of a legacy changelog,
// with [ErrLegacyChangelog] (at once when its token is loaded, else at the first event, which it
// leaves pending and unclaimed): exactly-once needs the upgraded changelog. The watcher's role needs SELECT, INSERT and DELETE on "<changelog>_acks" and SELECT on
// "<changelog>_parked".
func (w *Watcher) ProcessTx(ctx context.Context, opts ProcessOptions, handle TxHandler) error {
	var refuse error
	switch {
	case handle == nil:
		refuse = fmt.Errorf("%w: ProcessTx: the handler is nil", ErrInvalidConfig)
	case w.cfg.Ephemeral:
		refuse = errors.New("pgchangestream: ProcessTx: an ephemeral watcher saves no token, so a replay could not tell what committed; use Process")
	case w.readsLegacy():
		refuse = ErrLegacyChangelog
	}
	return w.runProcess(ctx, opts, refuse, processStep{
		run: func(ctx context.Context, j *procrun.Job[EventWithToken]) error {
			return w.runTx(ctx, handle, j)
		},
		background: w.startAckCompactor,
		saveGap:    txSaveGap,
	})
}

// runTx is one attempt of ProcessTx for j.
func (w *Watcher) runTx(ctx context.Context, handle TxHandler, j *procrun.Job[EventWithToken]) error {
	id, ok, err := position.ParseToken(j.Ev.ResumeToken)
	if err != nil || !ok {
		return fmt.Errorf("pgchangestream: ProcessTx: event without a changelog id (token %q): %v", j.Ev.ResumeToken, err)
	}
	if w.readsLegacy() { // loaded after ProcessTx began
		return procrun.Fatal(ErrLegacyChangelog)
	}
	tx, err := w.cfg.DB.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("pgchangestream: ProcessTx: begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	claimed, err := w.claimAck(ctx, tx, id, j.Parked > 0)
	switch {
	case errors.Is(err, ErrFenced) || errors.Is(err, ErrExclusiveLost): // never retried: a successor may own the client
		return procrun.Fatal(fmt.Errorf("pgchangestream: ProcessTx: %w", err))
	case err != nil:
		return fmt.Errorf("pgchangestream: ProcessTx: %w", err)
	case !claimed:
		return procrun.ErrDone
	}
	if j.Parked > 0 {
		found, err := w.cfg.deadLetterTable().FinishIn(ctx, tx, j.Parked)
		switch {
		case err != nil:
			return err
		case !found: // an operator dropped it
			return procrun.ErrDone
		}
	}
	if err := w.runHandler(ctx, func(ctx context.Context, ev EventWithToken) error { return handle(ctx, tx, ev) }, j.Ev); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("pgchangestream: ProcessTx: commit event %d: %w", id, err)
	}
	committed = true
	return nil
}

// startAckCompactor deletes the acknowledgement rows the saved token certifies: at once (rows a
// previous run left), then at most every ackCompactInterval when a save succeeded since the last
// compaction. One compaction runs at a time; a failed one is logged and tried again at the next
// tick. The returned function stops it and waits for it.
func (w *Watcher) startAckCompactor(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(ackCompactInterval)
		defer tick.Stop()
		compacted, first := uint64(0), true // ckWrites at the last compaction
		failed := newRepeatLog(w.log, slog.LevelWarn, "deleting certified acknowledgement rows failed; trying again later")
		for {
			if n := w.ckWrites.Load(); first || n != compacted {
				if _, err := w.compactAcks(ctx); err == nil {
					compacted, first = n, false
					failed.ok()
				} else if ctx.Err() == nil {
					failed.fail("error", err)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
