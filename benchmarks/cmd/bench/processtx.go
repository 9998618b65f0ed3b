package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// processTxGoal is the lowest ratio of process_tx_w8_eps to process_tx_w1_eps: eight
// transactional handlers, each committing its event's effect and claim in a transaction of its
// own, share WAL flushes instead of waiting for one each.
const processTxGoal = 4

// consumeProcessTx drains n events with ProcessTx and workers handlers, each inserting the
// event's effect in the transaction ProcessTx owns, then stops it (its final save) and checks
// the effects.
func consumeProcessTx(ctx context.Context, w *pgchangestream.Watcher, d *database, n, workers int) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- w.ProcessTx(runCtx, pgchangestream.ProcessOptions{Workers: workers},
			func(ctx context.Context, tx *sql.Tx, ev pgchangestream.EventWithToken) error {
				_, err := tx.ExecContext(ctx, effectInsert, string(ev.ResumeToken))
				return err
			})
	}()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for w.Stats().Process.Handled < uint64(n) {
		select {
		case err := <-errc:
			return fmt.Errorf("ProcessTx stopped after %d of %d events: %v", w.Stats().Process.Handled, n, err)
		case <-tick.C:
		}
	}
	cancel()
	if err := <-errc; err != nil {
		return err
	}
	return d.checkEffects(ctx, n)
}
