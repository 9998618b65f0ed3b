package admin

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/lock"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// A dry run resolves every kind of target, and touches no token.
func TestResetTokenDryRunResolvesTheTarget(t *testing.T) {
	ctx := context.Background()
	db, mock := mockDB(t)
	for _, target := range []ResetTarget{{DryRun: true}, {Beginning: true, Newest: true, DryRun: true}, {Beginning: true, Position: &Position{}}} {
		_, err := ResetToken(ctx, db, "c", target, Options{})
		require.ErrorContains(t, err, "set exactly one")
	}
	pos, err := ResetToken(ctx, db, "c", ResetTarget{Beginning: true, DryRun: true}, Options{})
	require.NoError(t, err)
	require.Equal(t, Position{}, pos)
	pos, err = ResetToken(ctx, db, "c", ResetTarget{Time: t0, DryRun: true}, Options{})
	require.NoError(t, err)
	require.Equal(t, Position{ChangedAt: t0.Add(-time.Microsecond), ID: math.MaxInt64}, pos,
		"every row before the time is passed, none at it")

	mock.ExpectQuery(wantNewest).WithArgs("items").
		WillReturnRows(sqlmock.NewRows([]string{"changed_at", "id"}).AddRow(t0, int64(7)))
	pos, err = ResetToken(ctx, db, "c", ResetTarget{Newest: true, Table: "items", DryRun: true}, Options{})
	require.NoError(t, err)
	require.Equal(t, position.Make(t0, 7), pos)
	at := position.Make(t0, 3)
	pos, err = ResetToken(ctx, db, "c", ResetTarget{Position: &at, DryRun: true}, Options{})
	require.NoError(t, err)
	require.Equal(t, at, pos)
	mock.ExpectQuery(`SELECT changed_at, id FROM "datastore_changelog" ORDER BY changed_at DESC, id DESC LIMIT 1`).
		WillReturnRows(sqlmock.NewRows([]string{"changed_at", "id"}))
	pos, err = ResetToken(ctx, db, "c", ResetTarget{Newest: true, DryRun: true}, Options{})
	require.NoError(t, err)
	require.Equal(t, Position{}, pos, "an empty changelog")
	mock.ExpectQuery(`SELECT changed_at FROM "datastore_changelog" WHERE id = $1`).WithArgs(int64(5)).
		WillReturnRows(sqlmock.NewRows([]string{"changed_at"}))
	_, err = ResetToken(ctx, db, "c", ResetTarget{AfterID: 5, DryRun: true}, Options{})
	require.EqualError(t, err, "pgchangestream: changelog row 5 does not exist")
	require.NoError(t, mock.ExpectationsWereMet())

	_, err = ResetToken(ctx, db, "c", ResetTarget{Beginning: true, DryRun: true}, Options{TokenTable: "a b"})
	require.ErrorIs(t, err, changelog.ErrInvalidConfig)
}

func TestResetTokenHoldsTheClientLock(t *testing.T) {
	ctx := context.Background()
	db, mock := mockDB(t)
	key := lock.Key("resume_tokens", "c")
	at := position.Make(t0, 3)
	takeLock := func() { // and no shared client's ranges: a changelog without the _ranges table
		mock.ExpectQuery(`SELECT pg_try_advisory_lock($1)`).WithArgs(key).
			WillReturnRows(sqlmock.NewRows([]string{"ok"}).AddRow(true))
		mock.ExpectQuery(`SELECT to_regclass($1) IS NOT NULL`).WithArgs(`"datastore_changelog_ranges"`).
			WillReturnRows(sqlmock.NewRows([]string{"exists"}).AddRow(false))
	}
	expectReset := func(fenced bool, token string) { // the owner epoch moves on, when the table has one
		mock.ExpectQuery(changelog.EpochColumnSQL).WithArgs(`"resume_tokens"`).
			WillReturnRows(sqlmock.NewRows([]string{"exists"}).AddRow(fenced))
		mock.ExpectBegin()
		mock.ExpectExec(wantSaveToken).WithArgs("c", token).WillReturnResult(sqlmock.NewResult(0, 1))
		if fenced {
			mock.ExpectExec(changelog.BumpEpochSQL(`"resume_tokens"`)).WithArgs("c").WillReturnResult(sqlmock.NewResult(0, 1))
		}
		mock.ExpectCommit()
		mock.ExpectExec(lock.SessionResetSQL).WillReturnResult(sqlmock.NewResult(0, 0))
	}
	for _, fenced := range []bool{true, false} {
		takeLock()
		mock.ExpectQuery(wantLoad).WithArgs("c").WillReturnRows(savedTokenRows(`{"eventID": 1, "table": "items"}`))
		expectReset(fenced, `{"timestamp":"2026-01-02T03:04:05Z","eventID":3,"table":"items"}`)
		_, err := ResetToken(ctx, db, "c", ResetTarget{Position: &at}, Options{})
		require.NoError(t, err, "the token keeps its table")
	}
	takeLock()
	expectReset(false, `{"timestamp":"2026-01-02T03:04:05Z","eventID":3,"table":"other"}`)
	pos, err := ResetToken(ctx, db, "c", ResetTarget{Position: &at, Table: "other"}, Options{})
	require.NoError(t, err)
	require.Equal(t, at, pos)
	require.Equal(t, `{"timestamp":"2026-01-02T03:04:05Z","eventID":3,"table":"other"}`, pos.Token("other"),
		"Token gives the JSON the reset saved")
	_, err = ResetToken(ctx, db, "c", ResetTarget{Position: &at, Table: " "}, Options{})
	require.ErrorIs(t, err, changelog.ErrInvalidConfig)

	mock.ExpectQuery(`SELECT pg_try_advisory_lock($1)`).WithArgs(key).
		WillReturnRows(sqlmock.NewRows([]string{"ok"}).AddRow(false))
	mock.ExpectExec(lock.SessionResetSQL).WillReturnResult(sqlmock.NewResult(0, 0))
	_, err = DeleteToken(ctx, db, "c", Options{})
	require.ErrorIs(t, err, changelog.ErrClientActive)
	require.EqualError(t, err, "pgchangestream: a watcher of the client is running: c")
	require.NoError(t, mock.ExpectationsWereMet())
}
