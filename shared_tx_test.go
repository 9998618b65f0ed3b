package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

const (
	// wantSharedAckClaim inserts the acknowledgement row only while member $3 owns the event's
	// range, which it locks FOR KEY SHARE until the transaction ends.
	wantSharedAckClaim = `INSERT INTO "datastore_changelog_acks" (client_name, changelog_id) SELECT r.client_name, $2::bigint
	FROM "datastore_changelog_ranges" AS r, (SELECT set_config('idle_in_transaction_session_timeout', $4, true)) AS idle
	WHERE r.client_name = $1 AND r.owner = $3
		AND r.range_no = (SELECT COALESCE(unit, "datastore_changelog_unit"(record_id::text)) / 16 FROM "datastore_changelog" WHERE id = $2::bigint)
	FOR KEY SHARE OF r ON CONFLICT DO NOTHING`
	wantSharedAckState = `SELECT EXISTS (SELECT FROM "datastore_changelog_acks" WHERE client_name = $1 AND changelog_id = $2),
	EXISTS (SELECT FROM "datastore_changelog" WHERE id = $2)`
	// wantSharedClaim locks the ranges it claims FOR UPDATE, skipping those locked (by the
	// transactional claims of their former owner) rather than waiting for them; it takes those
	// of members whose lease ran out only while the claimant is settled.
	wantSharedClaim = `UPDATE "datastore_changelog_ranges" AS r SET owner = $2, last_updated = now()
	WHERE r.client_name = $1 AND r.range_no IN (SELECT f.range_no FROM "datastore_changelog_ranges" AS f
		WHERE f.client_name = $1 AND f.range_no = ANY($3::int2[])
			AND EXISTS (SELECT FROM "datastore_changelog_members" m WHERE m.client_name = $1 AND m.member = $2 AND m.lease_until > now())
			AND (f.owner IS NULL OR f.owner = $2 OR (EXISTS (SELECT FROM "datastore_changelog_members" me WHERE me.client_name = $1 AND me.member = $2 AND me.lease_until > now()
		AND me.valid_since <= now() - $4 * interval '1 millisecond') AND NOT EXISTS (
				SELECT FROM "datastore_changelog_members" m WHERE m.client_name = $1 AND m.member = f.owner AND m.lease_until > now())))
		FOR UPDATE SKIP LOCKED)
	RETURNING r.range_no`
	// wantSharedCompact deletes the acknowledgement rows of gone changelog rows, and of rows in
	// the ranges listed that the member still owns and its checkpoint certifies.
	wantSharedCompact = `DELETE FROM "datastore_changelog_acks" AS a WHERE a.client_name = $1 AND NOT EXISTS (
	SELECT FROM "datastore_changelog_parked" p WHERE p.client_name = a.client_name AND p.changelog_id = a.changelog_id)
	AND NOT EXISTS (SELECT FROM "datastore_changelog" c WHERE c.id = a.changelog_id AND NOT ((c.changed_at, c.id) <= ($2::timestamptz, $3::bigint)` +
		` AND EXISTS (SELECT FROM "datastore_changelog_ranges" AS r WHERE r.client_name = $1` +
		` AND r.range_no = COALESCE(unit, "datastore_changelog_unit"(record_id::text)) / 16 AND r.owner = $4 AND r.range_no = ANY($5::int2[]) FOR KEY SHARE)))`
)

// sharedTxWatcher is a Shared watcher on a mock database, not started, as member 7 with its
// lease just renewed.
func sharedTxWatcher(t *testing.T) (*Watcher, sqlmock.Sqlmock) {
	t.Helper()
	w, mock := newMockWatcher(t, Config{Shared: true, LockSessionTimeout: 7 * time.Second})
	w.sh.id.Store(7)
	w.sh.renewed(time.Now())
	return w, mock
}

// A Shared member's transactional claim inserts the acknowledgement row fenced by the range
// of the event: the member must own it.
func TestSharedProcessTxClaimsByRange(t *testing.T) {
	w, mock := sharedTxWatcher(t)
	mock.ExpectBegin()
	mock.ExpectExec(wantSharedAckClaim).WithArgs("c", int64(5), int64(7), "7000").WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectExec(wantEffect).WithArgs("5").WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectCommit()
	calls := 0
	require.NoError(t, w.runTx(context.Background(), effectHandler(&calls, nil), txJob("5")))
	require.Equal(t, 1, calls)
	require.NoError(t, mock.ExpectationsWereMet())
}

// A claim that inserts nothing is done when the row exists (an earlier claim committed), and
// fenced off when it does not (another member owns the range): the watcher stops, and the
// event is neither retried nor handled. With the changelog row gone the range is unknown: an
// error, not a fence.
func TestSharedProcessTxClaimOutcomes(t *testing.T) {
	for name, c := range map[string]struct {
		acked, exists bool
		fenced        bool
	}{
		"committed before":   {acked: true, exists: true},
		"range moved on":     {exists: true, fenced: true},
		"changelog row gone": {},
	} {
		t.Run(name, func(t *testing.T) {
			w, mock := sharedTxWatcher(t)
			mock.ExpectBegin()
			mock.ExpectExec(wantSharedAckClaim).WithArgs("c", int64(5), int64(7), "7000").WillReturnResult(sqlmock.NewResult(0, 0))
			mock.ExpectQuery(wantSharedAckState).WithArgs("c", int64(5)).
				WillReturnRows(sqlmock.NewRows([]string{"acked", "exists"}).AddRow(c.acked, c.exists))
			mock.ExpectRollback()
			calls := 0
			err := w.runTx(context.Background(), effectHandler(&calls, nil), txJob("5"))
			require.Zero(t, calls, "the handler ran")
			switch {
			case c.acked:
				require.ErrorIs(t, err, procrun.ErrDone)
				require.NoError(t, w.excl.lostErr())
			case c.fenced:
				require.ErrorIs(t, err, ErrFenced)
				require.IsType(t, procrun.Fatal(nil), err, "a fenced claim is retried or parked")
				require.ErrorIs(t, w.excl.lostErr(), ErrFenced, "the watcher goes on")
			default:
				require.ErrorContains(t, err, "is gone")
				require.NotErrorIs(t, err, ErrFenced)
				require.NotErrorIs(t, err, procrun.ErrDone)
				require.NoError(t, w.excl.lostErr())
			}
			require.NoError(t, mock.ExpectationsWereMet())
		})
	}
}

// The rerun of a parked event is not fenced by range: any member reruns the client's parked
// events, and the parked row the transaction deletes lets one rerun commit.
func TestSharedProcessTxParkedRerunIsNotFencedByRange(t *testing.T) {
	w, mock := sharedTxWatcher(t)
	mock.ExpectBegin()
	mock.ExpectExec(w.q.ClaimAck).WithArgs("c", int64(5), "7000").WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectExec(`DELETE FROM "datastore_changelog_parked" WHERE client_name = $1 AND id = $2`).WithArgs("c", int64(9)).
		WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectExec(wantEffect).WithArgs("5").WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectCommit()
	j := txJob("5")
	j.Parked = 9
	calls := 0
	require.NoError(t, w.runTx(context.Background(), effectHandler(&calls, nil), j))
	require.Equal(t, 1, calls)
	require.NoError(t, mock.ExpectationsWereMet())
}

// The claim of ranges locks them FOR UPDATE SKIP LOCKED: it never waits for a former owner's
// transactional claims in flight (ranges still locked are claimed at a later look).
func TestSharedClaimSkipsLockedRanges(t *testing.T) {
	w, mock := sharedTxWatcher(t)
	mock.ExpectQuery(wantSharedClaim).WithArgs("c", int64(7), "{1,2,3}", int64(5000)).
		WillReturnRows(sqlmock.NewRows([]string{"range_no"}).AddRow(1).AddRow(3))
	require.NoError(t, w.sh.claimRanges(context.Background(), []int{1, 2, 3}))
	require.NoError(t, mock.ExpectationsWereMet())
}

// A member deletes the acknowledgement rows of the ranges it owns without a floor, by its
// checkpoint, fenced by their owner; those of ranges with floors stay.
func TestSharedCompactionByRange(t *testing.T) {
	w, mock := sharedTxWatcher(t)
	ahead := Position{ID: 9, Span: &position.Span{Seq: 1, Base: mustSnapshot(t, "98:108:98,105")}}
	saved := Position{ChangedAt: time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC), ID: 40}
	w.ckMu.Lock()
	w.sh.view.Store(newSharedView([]int{2, 3, 4}, map[int]Position{3: ahead}))
	w.mu.Lock()
	w.savedMirror, w.loaded = saved, true
	w.mu.Unlock()
	w.ckMu.Unlock()
	mock.ExpectExec(wantSharedCompact).WithArgs("c", saved.ChangedAt, int64(40), int64(7), "{2,4}").
		WillReturnResult(sqlmock.NewResult(0, 3))
	n, err := w.compactAcks(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	require.NoError(t, mock.ExpectationsWereMet())
}

// A failed save keeps the floors it would have dropped: the ranges still hold their own saved
// positions, which the reads and the compaction must go on respecting.
func TestSharedSaveKeepsFloorsUntilWritten(t *testing.T) {
	w, mock := sharedTxWatcher(t)
	ahead := Position{ID: 9, Span: &position.Span{Seq: 1, Base: mustSnapshot(t, "98:108:98,105")}}
	w.sh.view.Store(newSharedView([]int{2, 3}, map[int]Position{3: ahead}))
	passed := Position{ID: 11, Span: &position.Span{Seq: 3, Base: mustSnapshot(t, "130:131:130")}}
	boom := errors.New("connection reset")
	mock.ExpectExec(w.sh.q.save).WithArgs("c", int64(7), "tok", "{2,3}").WillReturnError(boom)
	require.ErrorIs(t, w.writeShared(context.Background(), passed, "tok", ""), boom)
	require.Len(t, w.sh.view.Load().floors, 1, "a floor dropped by a save that failed")
	mock.ExpectExec(w.sh.q.save).WithArgs("c", int64(7), "tok", "{2,3}").WillReturnResult(sqlmock.NewResult(0, 2))
	require.NoError(t, w.writeShared(context.Background(), passed, "tok", ""))
	require.Empty(t, w.sh.view.Load().floors)
	require.NoError(t, mock.ExpectationsWereMet())
}

// ProcessTx is open to Shared watchers (this one is not started); MarkProcessedTx is not, and
// says what to use instead.
func TestSharedTxRefusals(t *testing.T) {
	w, mock := sharedTxWatcher(t)
	require.ErrorContains(t, w.ProcessTx(context.Background(), ProcessOptions{}, effectHandler(new(int), nil)), "not started")
	err := w.MarkProcessedTx(context.Background(), new(sql.Tx), []byte("5"))
	require.ErrorIs(t, err, errSharedTx)
	require.ErrorContains(t, err, "use ProcessTx")
	require.NoError(t, mock.ExpectationsWereMet(), "no statement")
}
