package pgchangestream

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// ProcessTx in a Shared member. The transactional claim of an event (ackrows.go) is fenced by
// the event's range, the unit of its changelog row divided by 16: it inserts the
// acknowledgement row only while the range row names this member as its owner, and locks that
// row FOR KEY SHARE until the handler's transaction ends. The member's own saves and releases
// update the row without changing a key column, so they take FOR NO KEY UPDATE, which does not
// conflict with KEY SHARE: nothing of the member waits for its own handlers.
//
// Another member claims a range with FOR UPDATE, which conflicts with KEY SHARE, and with SKIP
// LOCKED: a range whose former owner (dead, paused, or past its lease) still has a claim in an
// open transaction is skipped, not waited for, so a claim never blocks the member's reader.
// Its coordinator still sees the range free or of a member not live (claimableRanges), so it
// asks again at its next look and claims the range once those transactions ended: committed
// (their acknowledgement rows then tell the new owner that the events are done), rolled back,
// or ended by the server after Config.LockSessionTimeout idle (the idle timeout the claim sets).
// Once the range is claimed, every later claim of the former owner inserts nothing and finds no
// acknowledgement row: it fails with ErrFenced and the former owner stops. So each event's
// effects commit once across members, whatever their pauses and crashes.
//
// A member deletes the acknowledgement rows of the ranges it owns that its saved checkpoint
// certifies, except in ranges with a floor (their saved position is not the member's yet), and
// the rows of changelog rows that are gone. The ranges and the checkpoint are read together
// under ckMu, and the statement checks, holding the range rows FOR KEY SHARE, that the member
// still owns them; a range it gained since is not in the list.

// claimAckShared is claimAck for a Shared member: it claims event id in tx while the member owns
// the event's range (idle is the transaction's idle timeout, in ms).
func (w *Watcher) claimAckShared(ctx context.Context, tx *sql.Tx, id int64, idle string) (bool, error) {
	member := w.sh.id.Load()
	claimed, err := w.insertClaim(ctx, tx, id, w.sh.q.claimAck, w.cfg.ClientName, id, member, idle)
	if err != nil || claimed {
		return claimed, err
	}
	var acked, exists bool
	if err := tx.QueryRowContext(ctx, w.sh.q.ackState, w.cfg.ClientName, id).Scan(&acked, &exists); err != nil {
		return false, fmt.Errorf("claim event %d wrote nothing; checking why: %w", id, err)
	}
	switch {
	case acked:
		return false, nil
	case !exists:
		return false, fmt.Errorf("claim event %d: its changelog row is gone, so its range (and its owner) is unknown", id)
	}
	return false, w.rangeFenced(member, id, "processed")
}

// rangeFenced stops a Shared member whose write for event id (a claim, a park) was refused
// because it no longer owns the event's range, and returns the error wrapping ErrFenced. what
// says what was being done with the event.
func (w *Watcher) rangeFenced(member, id int64, what string) error {
	err := fmt.Errorf("%w: member %d no longer owns the range of event %d", ErrFenced, member, id)
	w.stopOwning(err, "fenced off: another member took over the range of an event being "+what+"; stopping")
	return err
}

// sharedCompaction returns the condition, after compactAcks' certification predicate, that
// restricts it to the ranges the member owns without a floor, and adds its parameters. ckMu
// must be held, so that the view and saved (the checkpoint the caller read) go together.
func (w *Watcher) sharedCompaction(arg func(any) string) string {
	v := w.sh.view.Load()
	ranges := make([]int64, 0, len(v.owned))
	for _, r := range v.owned {
		if _, ok := v.floors[r]; !ok {
			ranges = append(ranges, int64(r))
		}
	}
	return w.sh.q.compactOwned + arg(w.sh.id.Load()) + ` AND r.range_no = ANY(` + arg(changelog.Array(ranges)) + `::int2[]) FOR KEY SHARE)`
}
