package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

const wantEffect = `INSERT INTO effects VALUES ($1)`

// txStepWatcher is a watcher on a mock database, not started: runTx needs only its
// configuration and queries.
func txStepWatcher(t *testing.T) (*Watcher, sqlmock.Sqlmock) {
	t.Helper()
	db, mock := mockDB(t)
	cfg := testConfig(Config{})
	cfg.DB, cfg.LockSessionTimeout = db, 7*time.Second
	w, err := New(cfg)
	require.NoError(t, err)
	return w, mock
}

// expectClaim expects the transaction's start and the claim of id, which inserts n rows and sets
// the transaction's idle timeout to Config.LockSessionTimeout (7 s) in the same statement.
func expectClaim(w *Watcher, mock sqlmock.Sqlmock, id int64, n int64) {
	mock.ExpectBegin()
	mock.ExpectExec(w.q.ClaimAck).WithArgs("c", id, "7000").WillReturnResult(sqlmock.NewResult(0, n))
}

// effectHandler writes one effect in tx and counts its calls; err, if set, is its error after.
func effectHandler(calls *int, err error) TxHandler {
	return func(ctx context.Context, tx *sql.Tx, ev EventWithToken) error {
		*calls++
		if _, e := tx.ExecContext(ctx, wantEffect, string(ev.ResumeToken)); e != nil {
			return e
		}
		return err
	}
}

func txJob(id string) *procrun.Job[EventWithToken] {
	return &procrun.Job[EventWithToken]{Ev: EventWithToken{ResumeToken: []byte(id)}}
}

// The step: begin, the claim (with the idle timeout of Config.LockSessionTimeout for this
// transaction only), the handler's statements, commit.
func TestProcessTxStepCommitsClaimAndEffect(t *testing.T) {
	w, mock := txStepWatcher(t)
	expectClaim(w, mock, 5, 1)
	mock.ExpectExec(wantEffect).WithArgs("5").WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectCommit()
	calls := 0
	require.NoError(t, w.runTx(context.Background(), effectHandler(&calls, nil), txJob("5")))
	require.Equal(t, 1, calls)
	require.NoError(t, mock.ExpectationsWereMet())
}

func TestProcessTxStepClaimedBeforeIsDone(t *testing.T) {
	w, mock := txStepWatcher(t)
	expectClaim(w, mock, 5, 0)
	mock.ExpectRollback()
	calls := 0
	require.ErrorIs(t, w.runTx(context.Background(), effectHandler(&calls, nil), txJob("5")), procrun.ErrDone)
	require.Zero(t, calls, "the handler is not called")
	require.NoError(t, mock.ExpectationsWereMet())
}

func TestProcessTxStepRollsBackAFailure(t *testing.T) {
	boom := errors.New("boom")
	for name, c := range map[string]struct {
		handler func(calls *int) TxHandler
		commit  error // the commit's error, when the handler succeeds
		want    error
	}{
		"handler error": {handler: func(calls *int) TxHandler { return effectHandler(calls, boom) }, want: boom},
		"handler panic": {handler: func(calls *int) TxHandler {
			return func(ctx context.Context, tx *sql.Tx, ev EventWithToken) error { *calls++; panic("bug") }
		}, want: ErrPanic},
		"commit error": {handler: func(calls *int) TxHandler { return effectHandler(calls, nil) }, commit: boom, want: boom},
	} {
		t.Run(name, func(t *testing.T) {
			w, mock := txStepWatcher(t)
			expectClaim(w, mock, 5, 1)
			if name != "handler panic" {
				mock.ExpectExec(wantEffect).WithArgs("5").WillReturnResult(sqlmock.NewResult(0, 1))
			}
			if c.commit != nil {
				mock.ExpectCommit().WillReturnError(c.commit)
			} else {
				mock.ExpectRollback()
			}
			calls := 0
			err := w.runTx(context.Background(), c.handler(&calls), txJob("5"))
			require.ErrorIs(t, err, c.want)
			require.NotErrorIs(t, err, procrun.ErrDone)
			require.Equal(t, 1, calls)
			require.NoError(t, mock.ExpectationsWereMet())
		})
	}
}

// A rerun deletes its parked row in the transaction; a row already gone (dropped by an
// operator) finishes the rerun without the handler.
func TestProcessTxStepParkedRerun(t *testing.T) {
	del := `DELETE FROM "datastore_changelog_parked" WHERE client_name = $1 AND id = $2`
	for _, found := range []bool{true, false} {
		w, mock := txStepWatcher(t)
		expectClaim(w, mock, 5, 1)
		n := int64(0)
		if found {
			n = 1
		}
		mock.ExpectExec(del).WithArgs("c", int64(9)).WillReturnResult(sqlmock.NewResult(0, n))
		if found {
			mock.ExpectExec(wantEffect).WithArgs("5").WillReturnResult(sqlmock.NewResult(0, 1))
			mock.ExpectCommit()
		} else {
			mock.ExpectRollback()
		}
		j := txJob("5")
		j.Parked = 9
		calls := 0
		err := w.runTx(context.Background(), effectHandler(&calls, nil), j)
		if found {
			require.NoError(t, err)
			require.Equal(t, 1, calls)
		} else {
			require.ErrorIs(t, err, procrun.ErrDone)
			require.Zero(t, calls)
		}
		require.NoError(t, mock.ExpectationsWereMet())
	}
}

func TestProcessTxRefusesBadCalls(t *testing.T) {
	w, mock := txStepWatcher(t)
	require.ErrorIs(t, w.ProcessTx(context.Background(), ProcessOptions{}, nil), ErrInvalidConfig)
	w.cfg.Ephemeral = true
	require.ErrorContains(t, w.ProcessTx(context.Background(), ProcessOptions{}, effectHandler(new(int), nil)), "ephemeral")
	w.cfg.Ephemeral = false
	require.ErrorContains(t, w.ProcessTx(context.Background(), ProcessOptions{}, effectHandler(new(int), nil)), "not started")
	require.NoError(t, mock.ExpectationsWereMet(), "no statement")
}

// On a legacy changelog ProcessTx refuses (ErrLegacyChangelog): at once once the token is
// loaded, and an event reached before that is neither claimed nor handled, and stops the run.
func TestProcessTxRefusesALegacyChangelog(t *testing.T) {
	w, mock := txStepWatcher(t)
	loadLegacy(t, w, mock)
	calls := 0
	err := w.ProcessTx(context.Background(), ProcessOptions{}, effectHandler(&calls, nil))
	require.ErrorIs(t, err, ErrLegacyChangelog)
	require.ErrorContains(t, err, "schema.Install", "the error says how to upgrade")
	err = w.runTx(context.Background(), effectHandler(&calls, nil), txJob("5"))
	require.Equal(t, procrun.Fatal(ErrLegacyChangelog), err, "the run stops at once")
	require.Zero(t, calls)
	require.NoError(t, mock.ExpectationsWereMet(), "no statement")
}
