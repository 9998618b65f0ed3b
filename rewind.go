package pgchangestream

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// Server recoveries. PostgreSQL restarts its transaction counter after the last id found in
// flushed WAL. A rollback's record, and an asynchronous commit's, are not flushed before the
// transaction leaves the running set, so after a crash (or a failover to a standby that had not
// received them, or a point-in-time restore) their ids are handed out again. A snapshot taken
// before can then see an id as finished whose new transaction is still to commit: a delta from
// it would skip that transaction's rows.
//
// The watcher tags the snapshots it reads with the value of the one row of an unlogged table
// (the incarnation): crash recovery empties it, and a promoted standby or a restored backup does
// not have it. When a new snapshot's incarnation differs from the one its delta starts at, or
// the snapshot went back, positions read since the saved token can no longer be trusted: the
// watcher goes back to the saved token as the database has it now (rewind), and delivers again
// from there. A saved token that survived is safe: the commit that saved it was flushed, and so
// was all WAL before it, including every record its snapshots relied on. Saves of positions of an
// older incarnation write nothing (saveTokenInc), so a position read before the crash is never
// saved after it.

// currentSnapshot returns the database's current snapshot and, where the changelog has an
// incarnation table, the server's incarnation, inserting its row after a crash emptied it.
func (w *Watcher) currentSnapshot(ctx context.Context) (position.Snapshot, string, error) {
	var text, inc string
	if !w.hasInc {
		if err := w.cfg.DB.QueryRowContext(ctx, w.q.snapshot).Scan(&text); err != nil {
			return position.Snapshot{}, "", err
		}
	} else if err := w.queryIncarnation(ctx, w.q.snapshotInc, nil, &text, &inc); err != nil {
		return position.Snapshot{}, "", err
	}
	snap, err := position.ParseSnapshot(text)
	return snap, inc, err
}

// queryIncarnation runs q, whose last column is the incarnation, into dest (the incarnation
// last, into *inc). If the incarnation row is missing it inserts it and runs q again.
func (w *Watcher) queryIncarnation(ctx context.Context, q string, args []any, dest ...any) error {
	inc := dest[len(dest)-1].(*string)
	var v sql.NullString
	dest[len(dest)-1] = &v
	for try := 0; ; try++ {
		if err := w.cfg.DB.QueryRowContext(ctx, q, args...).Scan(dest...); err != nil {
			return err
		}
		if v.Valid {
			*inc = v.String
			return nil
		}
		if try > 0 {
			return fmt.Errorf("the incarnation row of %s is missing right after it was inserted",
				changelog.IncarnationTable(w.cfg.ChangelogTable))
		}
		if _, err := w.cfg.DB.ExecContext(ctx, w.q.claimIncarnation); err != nil {
			return fmt.Errorf("insert the incarnation row of %s (the watcher's role needs INSERT on it): %w",
				changelog.IncarnationTable(w.cfg.ChangelogTable), err)
		}
	}
}

// serverRecovered reports why positions of span s cannot be trusted with end, a new snapshot of
// incarnation inc: the incarnation changed (a crash, failover or restore), or the snapshot's
// xmax went back, which it never does while the server runs (the same, seen without an
// incarnation table, if the counter has not yet passed the old xmax again). It returns "" when
// they can.
func serverRecovered(s *position.Span, end position.Snapshot, inc string) string {
	switch {
	case s.Inc != "" && inc != s.Inc:
		return "the server's incarnation changed (crash recovery, failover or restore)"
	case end.Xmax < s.Base.Xmax:
		return fmt.Sprintf("the transaction counter went back: snapshot %s after %s", end, s.Base)
	}
	return ""
}

// askRewind has the reader go back to the saved token before its next read: a save found
// that the server recovered since the position was read.
func (w *Watcher) askRewind() {
	w.rewindAsked.Store(true)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// rewind goes back to the saved token as the database has it now, because positions read since
// can no longer be trusted (see the top of this file). Every delivery not acknowledged, and the
// floor, then hold the checkpoint at that token until acknowledged, and reading resumes after it:
// rows after it are delivered again. A client with no saved token (an ephemeral watcher, or a
// first save that was lost) starts again from the beginning of its table. Reader goroutine only.
func (w *Watcher) rewind(ctx context.Context, why string) error {
	if p := w.takePrefetch(); p != nil {
		w.spare = p.rows
	}
	w.ckMu.Lock()
	defer w.ckMu.Unlock()
	pos, err := w.loadPosition(ctx, true)
	if err != nil {
		return fmt.Errorf("go back to the saved token after a server recovery: %w", err)
	}
	w.rewindAsked.Store(false)
	w.saved, w.hasSaved, w.savedAt = pos, true, time.Now()
	func() {
		w.mu.Lock()
		defer w.mu.Unlock() // the ring's code runs under mu: a panic in it must not leave mu held
		w.ring.Rebase(pos)
		w.cursor = pos
		w.savedMirror = pos
	}()
	w.setMarked(pos)
	w.rewinds.Add(1)
	w.log.Warn("the server recovered since the last read: delivering again from the saved token",
		"why", why, "position", pos)
	return nil
}
