package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// Acknowledgement rows of transactional handlers. A handler's transaction first claims its
// event: it inserts the row (client, changelog id) into "<changelog>_acks", whose key lets only
// one transaction per event commit. A claim that finds the row committed learns that the
// event's effects are committed already (a replay after a stop, a crash or a hand-over): the
// transaction is rolled back and the event counts as done, so effects happen exactly once
// whatever the order in which parallel transactions commit, and without any of them waiting
// for another (they touch different rows). The saved token moves on over the contiguous prefix
// of done events as for any acknowledgement; the rows it certifies are then deleted.
//
// An exclusive watcher's claim is fenced: it inserts only while the token row holds the
// watcher's owner epoch, and locks that row FOR KEY SHARE until the transaction ends. The
// watcher's own saves (FOR NO KEY UPDATE) do not wait for that lock; a new owner's epoch claim
// takes the row FOR UPDATE, so it waits for the former owner's claims in flight, and any claim
// after it finds the new epoch and fails with ErrFenced. So a former owner never commits an
// event's effects after its successor started.

// claimAck claims the event id in tx for this watcher's client. It returns false when a
// committed transaction claimed it before: tx must then be rolled back and the event counted as
// done. It returns an error wrapping [ErrFenced] when a later owner claimed the client (in a
// Shared member: the event's range, see shared_read.go). rerun is set for the rerun of a parked
// event, which a Shared member does not fence by range: any member may rerun it, no read
// delivers it again (the checkpoint passed it), and the parked row its transaction deletes
// lets one rerun commit. In the same statement it sets tx's idle_in_transaction_session_timeout to Config.LockSessionTimeout:
// the server ends the session of a transaction left idle that long (a paused or stuck process),
// which bounds how long a successor's epoch claim waits for its FOR KEY SHARE lock.
func (w *Watcher) claimAck(ctx context.Context, tx *sql.Tx, id int64, rerun bool) (bool, error) {
	w.ckMu.Lock()
	fenced, epoch, err := w.txFenceLocked()
	w.ckMu.Unlock()
	if err != nil {
		return false, err
	}
	idle := strconv.FormatInt(w.cfg.LockSessionTimeout.Milliseconds(), 10)
	if w.sh != nil && !rerun {
		return w.claimAckShared(ctx, tx, id, idle)
	}
	q, args := w.q.ClaimAck, []any{w.cfg.ClientName, id, idle}
	if fenced {
		q, args = w.q.ClaimAckFenced, []any{w.cfg.ClientName, id, epoch, idle}
	}
	claimed, err := w.insertClaim(ctx, tx, id, q, args...)
	if err != nil || claimed || !fenced {
		return claimed, err
	}
	var stored sql.NullInt64
	if err := tx.QueryRowContext(ctx, w.q.EpochOf, w.cfg.ClientName).Scan(&stored); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("claim event %d wrote nothing; checking why: %w", id, err)
	}
	if stored.Valid && stored.Int64 == epoch {
		return false, nil
	}
	return false, w.noWriteErr(ctx, tx, true, epoch, "")
}

// insertClaim runs the claim statement q of event id in tx and reports whether it inserted the
// acknowledgement row.
func (w *Watcher) insertClaim(ctx context.Context, tx *sql.Tx, id int64, q string, args ...any) (bool, error) {
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return false, fmt.Errorf("claim event %d in %s: %w", id, changelog.AckTable(w.cfg.ChangelogTable), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("claim event %d: %w", id, err)
	}
	return n == 1, nil
}

// compactAcks deletes the client's acknowledgement rows that its saved token certifies (or
// whose changelog row is gone): their events are never delivered again. The rows of its parked
// events stay: a parked event is certified, but its rerun must still find a claim committed by
// an attempt whose commit reported an error and took effect.
//
// An exclusive watcher's compaction is fenced as its claims are: it deletes only while the
// token row holds its owner epoch, so a former owner that wakes up after a successor claimed
// the client (or after a token reset) deletes nothing by its own, older view. A Shared
// member's is fenced by range (shared_read.go).
func (w *Watcher) compactAcks(ctx context.Context) (int64, error) {
	args := changelog.Params{w.cfg.ClientName}
	w.ckMu.Lock()
	fenced, epoch, lost := w.fenced, w.epoch, w.excl.lostErr()
	w.mu.Lock()
	saved, loaded := w.savedMirror, w.loaded
	w.mu.Unlock()
	certified := ""
	if loaded {
		certified = changelog.CertifiedBy(saved, args.Add)
		if w.sh != nil {
			certified = "(" + certified + w.sh.sharedCompaction(args.Add) + ")"
		}
	}
	w.ckMu.Unlock()
	switch {
	case lost != nil:
		return 0, lost
	case fenced && epoch == 0, !loaded: // not claimed, or not loaded, yet
		return 0, nil
	}
	q := w.q.CompactAcks + certified + `)`
	if fenced {
		q += w.q.CompactFence + args.Add(epoch) + ` FOR KEY SHARE)`
	}
	res, err := w.cfg.DB.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("delete certified rows of %s: %w", changelog.AckTable(w.cfg.ChangelogTable), err)
	}
	return res.RowsAffected()
}
