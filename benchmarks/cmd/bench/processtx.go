package main

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/pgchangestream/pgchangestream"
)

// processTxGoal is the lowest ratio of process_tx_w8_eps to process_tx_w1_eps: eight
// transactional handlers, each committing its event's effect and claim in a transaction of its
// own, share WAL flushes instead of waiting for one each.
const processTxGoal = 4

// processTxByHandGoal is the lowest ratio of process_tx_w8_eps to tx_by_hand_w8_eps: ProcessTx's
// engine costs at most a tenth of what its transactions allow.
const processTxByHandGoal = 0.9

// byHandKey is the figure of ProcessTx's transactions run by hand with workers goroutines.
func byHandKey(workers int) string {
	return "tx_by_hand_w" + strconv.Itoa(workers) + "_eps"
}

// consumeProcessTx drains n events with ProcessTx and workers handlers, each inserting the
// event's effect in the transaction ProcessTx owns. Once the n-th handler returned it stops
// ProcessTx, which lets the handlers' transactions commit and saves the checkpoint, then checks
// that each event was handled once and committed its effect.
func consumeProcessTx(ctx context.Context, w *pgchangestream.Watcher, d *database, n, workers int) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var handled atomic.Int64
	last := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- w.ProcessTx(runCtx, pgchangestream.ProcessOptions{Workers: workers},
			func(ctx context.Context, tx *sql.Tx, ev pgchangestream.EventWithToken) error {
				_, err := tx.ExecContext(ctx, effectInsert, string(ev.ResumeToken))
				if err == nil && handled.Add(1) == int64(n) {
					close(last)
				}
				return err
			})
	}()
	select {
	case err := <-errc:
		return fmt.Errorf("ProcessTx stopped after %d of %d events: %v", w.Stats().Process.Handled, n, err)
	case <-last:
	}
	cancel()
	if err := <-errc; err != nil {
		return err
	}
	if got := w.Stats().Process.Handled; got != uint64(n) {
		return fmt.Errorf("ProcessTx handled %d events, want %d", got, n)
	}
	return d.checkEffects(ctx, n)
}

// claimByHand is the statement with which ProcessTx claims an event on a watcher that is not
// exclusive ($1 the client, $2 the changelog id, $3 the idle timeout in ms), for the figures
// that run ProcessTx's transactions without it.
const claimByHand = `INSERT INTO "` + pgchangestream.DefaultChangelogTable + `_acks" (client_name, changelog_id) SELECT $1::varchar, $2::bigint
	FROM (SELECT set_config('idle_in_transaction_session_timeout', $3, true)) AS idle ON CONFLICT DO NOTHING`

// consumeByHand drains n events as ProcessTx with workers handlers does, but by hand: workers
// goroutines take the events from Events() and run, for each, the transaction ProcessTx runs
// (BEGIN, the claim, the effect insert, COMMIT), then acknowledge the contiguous prefix of
// committed events with MarkProcessed. What ProcessTx costs beyond that is its engine: per-key
// order, the low-water mark, retries, fencing.
func consumeByHand(ctx context.Context, w *pgchangestream.Watcher, d *database, n, workers int) error {
	idle := strconv.FormatInt(pgchangestream.DefaultLockSessionTimeout.Milliseconds(), 10)
	err := consumeConcurrently(ctx, w, n, workers, func(token []byte) error {
		tx, err := d.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }() // after Commit it does nothing
		if res, err := tx.ExecContext(ctx, claimByHand, drainClient, string(token), idle); err != nil {
			return err
		} else if claimed, err := res.RowsAffected(); err != nil || claimed != 1 {
			return fmt.Errorf("event %s: claim affected %d rows (%v)", token, claimed, err)
		}
		if _, err := tx.ExecContext(ctx, effectInsert, string(token)); err != nil {
			return err
		}
		return tx.Commit()
	})
	if err != nil {
		return err
	}
	return d.checkEffects(ctx, n)
}
