package pgchangestream

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// Reads on a changelog without statistics.
//
// PostgreSQL plans the watcher's reads from the changelog's statistics. A changelog that has
// none (never analyzed: just created and filled by a burst before autovacuum's first ANALYZE,
// or analyzed while empty) gets default selectivities, a handful of rows for table_name = $1
// and a range, and each read of a batch becomes a bitmap scan that fetches and sorts every
// remaining row of its range: a backlog drains in quadratic time. While the changelog has no
// statistics, the watcher therefore runs each read in a read-only transaction that first turns
// bitmap scans, sorts and sequential scans off for that transaction (set_config(..., true), as
// SET LOCAL), which leaves the index range scan as the only plan. These statements carry a
// comment of their own, so that a plan cached for one of them (pgx prepares statements, and
// PostgreSQL may keep a generic plan) is never shared with the plain reads. The watcher looks
// for statistics at every load and then, while there are none, at most once per
// statsCheckInterval; once they exist, reads are plain statements again (three round trips
// fewer each).

// statsCheckInterval is how often, at most, a watcher that found no statistics looks again.
const statsCheckInterval = time.Second

// indexPlansSQL turns off, for the rest of the transaction, every plan of a read but its index
// range scan, and JIT compilation: a plan that must sort anyway (a delta's id list) carries the
// cost the planner gives a disabled sort, far above jit_above_cost, and would be compiled.
const indexPlansSQL = `SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true),
	set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)`

// indexPlansTag prefixes the reads run after indexPlansSQL.
const indexPlansTag = `/* index plans */ `

// read runs the changelog read q of index ranges and hands its rows to scan, which closes them:
// as it is, or, while the changelog has no statistics, with index plans only. Reads by primary
// key (queryByKey) need no statistics and run as they are.
func (w *Watcher) read(ctx context.Context, q string, scan func(*sql.Rows) error, args ...any) error {
	if !w.noStats.Load() {
		rows, err := w.cfg.DB.QueryContext(ctx, q, args...)
		if err != nil {
			return err
		}
		return scan(rows)
	}
	tx, err := w.cfg.DB.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // read only: nothing to keep, and an error changes nothing
	if _, err := tx.ExecContext(ctx, indexPlansSQL); err != nil {
		return err
	}
	rows, err := tx.QueryContext(ctx, indexPlansTag+q, args...)
	if err != nil {
		return err
	}
	return scan(rows)
}

// noteStats records whether the changelog has statistics. Reader goroutine only (the load runs
// there).
func (w *Watcher) noteStats(has bool) {
	w.statsChecked = time.Now()
	if w.noStats.Swap(!has) == !has {
		return
	}
	if has {
		w.log.Info("the changelog has statistics now: reads are planned from them", "changelog", w.cfg.ChangelogTable)
	} else {
		w.log.Info("the changelog has no statistics (never analyzed): reads run with index plans only until it is",
			"changelog", w.cfg.ChangelogTable)
	}
}

// checkStats looks again for the changelog's statistics if it had none when last looked for,
// at most once per statsCheckInterval. Reader goroutine only.
func (w *Watcher) checkStats(ctx context.Context) error {
	if !w.noStats.Load() || time.Since(w.statsChecked) < statsCheckInterval {
		return nil
	}
	var has bool
	if err := w.cfg.DB.QueryRowContext(ctx, w.q.StatsExist, changelog.Quote(w.cfg.ChangelogTable)).Scan(&has); err != nil {
		return fmt.Errorf("look for the statistics of changelog %s: %w", w.cfg.ChangelogTable, err)
	}
	w.noteStats(has)
	return nil
}
