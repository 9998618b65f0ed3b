package pgchangestream

import (
	"context"
	"fmt"
)

// A late row is one whose transaction started before, but committed after, rows with later
// positions were read: it sits below the cursor, where reads never look. Only its NOTIFY names
// it. The reader recovers such rows after each read that reached the end of the visible rows;
// Close holds back for those the reader did not get to.

// lateRow returns the row with this id if it is a late row: not read recently, visible, of this
// table and below the cursor. Otherwise it returns nil (the next read gets a row at or above
// the cursor).
func (w *Watcher) lateRow(ctx context.Context, id int64) (*changelogRow, error) {
	if w.recent.contains(id) {
		return nil, nil
	}
	var err error
	if w.batch, err = w.query(ctx, w.q.byID, w.batch[:0], false, w.cfg.TableName, id); err != nil {
		return nil, fmt.Errorf("fetch changelog row %d: %w", id, err)
	}
	if len(w.batch) == 0 {
		return nil, nil // another table's row, or gone
	}
	row := &w.batch[0]
	w.mu.Lock()
	below := makePosition(row.ChangedAt, row.ID).Before(w.cursor)
	w.mu.Unlock()
	if !below {
		return nil, nil
	}
	return row, nil
}

// recoverLateRow delivers the row with this id if it is a late row.
func (w *Watcher) recoverLateRow(ctx context.Context, id int64) error {
	row, err := w.lateRow(ctx, id)
	if err != nil || row == nil {
		return err
	}
	w.log.Info("recovering a row that committed behind the cursor", "id", id)
	return w.deliver(ctx, row, makePosition(row.ChangedAt, row.ID), true)
}

// holdUnhandledLateRows runs in Close once the reader has stopped. Late rows named by
// notifications the reader did not get to are recorded as pending deliveries that were never
// handed out, like abandoned sends, so the final save stays behind them and a restart delivers
// them.
func (w *Watcher) holdUnhandledLateRows(ctx context.Context) error {
	hints := w.takeHints()
	if w.skipFree.Load() { // snapshot deltas have no late rows; ids noted before the load mean nothing
		return nil
	}
	for i, id := range hints {
		row, err := w.lateRow(ctx, id)
		if err != nil {
			w.returnHints(hints[i:])
			return err
		}
		if row != nil {
			w.log.Info("holding the checkpoint behind a late row not handed out before Close", "id", id)
			w.register(row, makePosition(row.ChangedAt, row.ID), true)
		}
	}
	return nil
}
