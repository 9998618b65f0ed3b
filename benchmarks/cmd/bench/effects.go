package main

import (
	"context"
	"fmt"

	"github.com/pgchangestream/pgchangestream"
)

// effectMode says whether a drain's consumer writes an effect per event, and how it
// acknowledges it.
type effectMode int

const (
	// noEffects: the consumer only acknowledges.
	noEffects effectMode = iota
	// effectsInTx: BEGIN; INSERT effect; MarkProcessedTx; COMMIT per event.
	effectsInTx
	// effectsThenAck: INSERT effect (autocommit), then MarkProcessed.
	effectsThenAck
	// effectsProcessTx: ProcessTx with drainSpec.workers handlers, INSERT effect in each
	// event's transaction (processtx.go).
	effectsProcessTx
	// effectsByHand: drainSpec.workers goroutines take Events() and run each event's
	// transaction by hand (processtx.go).
	effectsByHand
)

// txAckGoal is the lowest ratio of drain_txack_eps to drain_effect_sync_eps: acknowledging in
// the effect's own transaction costs at most a fifth of the throughput of acknowledging after
// it.
const txAckGoal = 0.8

// effectsTable receives one row per event of an effects drain; effectInsert writes one.
const (
	effectsTable = "bench_effects"
	effectInsert = `INSERT INTO ` + effectsTable + ` (changelog_id) VALUES ($1)`
)

// createEffects creates the effects table of a drain.
func (d *database) createEffects(ctx context.Context) error {
	_, err := d.ExecContext(ctx, `CREATE TABLE `+effectsTable+` (changelog_id bigint NOT NULL)`)
	return err
}

// consumeWithEffects writes one effect row per event and acknowledges it as mode says.
func consumeWithEffects(ctx context.Context, w *pgchangestream.Watcher, d *database, n int, mode effectMode) error {
	const insert = effectInsert
	for range n {
		ev, err := receive(ctx, w)
		if err != nil {
			return err
		}
		id := string(ev.ResumeToken)
		if mode == effectsThenAck {
			if _, err := d.ExecContext(ctx, insert, id); err != nil {
				return err
			}
			if err := w.MarkProcessed(ctx, ev.ResumeToken); err != nil {
				return err
			}
			continue
		}
		if err := effectInTx(ctx, w, d, insert, ev); err != nil {
			return err
		}
	}
	return d.checkEffects(ctx, n)
}

// effectInTx writes the effect of ev and acknowledges it in one transaction.
func effectInTx(ctx context.Context, w *pgchangestream.Watcher, d *database, insert string, ev pgchangestream.EventWithToken) error {
	tx, err := d.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // after Commit it does nothing
	if _, err := tx.ExecContext(ctx, insert, string(ev.ResumeToken)); err != nil {
		return err
	}
	if err := w.MarkProcessedTx(ctx, tx, ev.ResumeToken); err != nil {
		return err
	}
	return tx.Commit()
}

// checkEffects checks that the effects table holds n distinct events.
func (d *database) checkEffects(ctx context.Context, n int) error {
	var rows, distinct int
	err := d.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT changelog_id) FROM `+effectsTable).Scan(&rows, &distinct)
	if err == nil && (rows != n || distinct != n) {
		err = fmt.Errorf("%d effect rows of %d distinct events, want %d", rows, distinct, n)
	}
	return err
}
