package pgchangestream

import (
	"context"
	"fmt"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// A late row is one whose transaction started before, but committed after, rows with later
// positions were read: it sits below the cursor, where reads never look. Only its NOTIFY names
// it. The reader recovers such rows after each read that reached the end of the visible rows;
// Close holds back for those the reader did not get to.

// lateRow returns the row with this id if it is a late row: not read recently, visible, of this
// table and below the cursor. Otherwise it returns nil (the next read gets a row at or above
// the cursor).
func (r *reader) lateRow(ctx context.Context, id int64) (*changelogRow, error) {
	if r.recent.Contains(id) {
		return nil, nil
	}
	var err error
	if r.batch, err = r.queryByKey(ctx, r.q.ByID, r.batch[:0], rowColumns{}, r.cfg.TableName, id); err != nil {
		return nil, fmt.Errorf("fetch changelog row %d: %w", id, err)
	}
	if len(r.batch) == 0 {
		return nil, nil // another table's row, or gone
	}
	row := &r.batch[0]
	r.mu.Lock()
	below := position.Make(row.ChangedAt, row.ID).Before(r.cursor)
	r.mu.Unlock()
	if !below {
		return nil, nil
	}
	return row, nil
}

// recoverLateRows delivers the rows with these ids that are late rows; the ids it could not look
// at are put back for the next read.
func (w *Watcher) recoverLateRows(ctx context.Context, ids []int64) error {
	for i, id := range ids {
		if err := w.recoverLateRow(ctx, id); err != nil {
			w.hints.Return(ids[i:])
			return err
		}
	}
	return nil
}

// recoverLateRow delivers the row with this id if it is a late row.
func (w *Watcher) recoverLateRow(ctx context.Context, id int64) error {
	row, err := w.lateRow(ctx, id)
	if err != nil || row == nil {
		return err
	}
	w.log.Info("recovering a row that committed behind the cursor", "id", id)
	return w.deliver(ctx, row, position.Make(row.ChangedAt, row.ID), true)
}

// holdUnhandledLateRows runs in Close once the reader has stopped. Late rows named by
// notifications the reader did not get to are recorded as pending deliveries that were never
// handed out, like abandoned sends, so the final save stays behind them and a restart delivers
// them.
func (w *Watcher) holdUnhandledLateRows(ctx context.Context) error {
	hints := w.hints.Take()
	if w.skipFree.Load() { // snapshot deltas have no late rows; ids noted before the load mean nothing
		return nil
	}
	for i, id := range hints {
		row, err := w.lateRow(ctx, id)
		if err != nil {
			w.hints.Return(hints[i:])
			return err
		}
		if row != nil {
			w.log.Info("holding the checkpoint behind a late row not handed out before Close", "id", id)
			w.register(row, position.Make(row.ChangedAt, row.ID), true)
		}
	}
	return nil
}

// upgradeCheckInterval is how often, at most, a watcher reading a legacy changelog looks for the
// txid column that schema.Install adds.
const upgradeCheckInterval = 5 * time.Second

// noticeUpgrade runs on a legacy changelog after a read that caught up. At most once per
// upgradeCheckInterval it looks for the txid column; once the changelog is upgraded, and when
// nothing is pending, the watcher switches over to snapshot deltas in place, as a restart would:
// the rows after its cursor that the switch-over's snapshot (switchSnapshot) sees, then deltas.
// It saves the switch-over at once, so a restart keeps its snapshot. NOTIFY ids are no longer
// noted from the switch on; those noted before it are recovered first (late rows then become
// pending, and the switch waits for a later check). Reader goroutine only.
func (w *Watcher) noticeUpgrade(ctx context.Context) error {
	if w.upgradeChecked.IsZero() || time.Since(w.upgradeChecked) < upgradeCheckInterval { // zero: set by the load
		return nil
	}
	w.upgradeChecked = time.Now()
	var skipFree, stats bool
	if err := w.cfg.DB.QueryRowContext(ctx, w.q.Detect, changelog.Quote(w.cfg.ChangelogTable),
		changelog.Quote(changelog.IncarnationTable(w.cfg.ChangelogTable))).Scan(&skipFree, &w.hasInc, &stats); err != nil {
		return fmt.Errorf("inspect changelog %s: %w", w.cfg.ChangelogTable, err)
	}
	w.noteStats(stats)
	if !skipFree {
		return nil
	}
	w.skipFree.Store(true) // from here on NOTIFY only wakes the reader
	if err := w.recoverLateRows(ctx, w.hints.Take()); err != nil {
		w.skipFree.Store(false)
		return err
	}
	now, inc, err := w.transactionCounter(ctx)
	if err != nil {
		w.skipFree.Store(false)
		return err
	}
	w.mu.Lock()
	idle := w.ring.Len() == 0 && !w.ring.HasFloor() // only this goroutine adds to the ring
	cursor := w.cursor                              // and moves the cursor
	w.mu.Unlock()
	if !idle { // pending legacy positions cannot mix with the switch-over's: try again later
		w.skipFree.Store(false)
		return nil
	}
	s, err := w.switchSnapshot(ctx, cursor, cursor, now)
	if err != nil {
		w.skipFree.Store(false)
		return err
	}
	w.mu.Lock()
	w.cursor.Span = &position.Span{Base: s, Inc: inc}
	w.switched = w.cursor.Span
	w.mu.Unlock()
	w.log.Info("the changelog was upgraded: switching over to snapshot deltas", "snapshot", s)
	return w.saveInBackground(ctx, saveChanged)
}
