package pgchangestream

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

func TestResetPosition(t *testing.T) {
	ctx := context.Background()
	db, mock := mockDB(t)
	for _, target := range []ResetTarget{{}, {Beginning: true, Newest: true}} {
		_, err := ResetPosition(ctx, db, target, AdminOptions{})
		require.ErrorContains(t, err, "set exactly one")
	}
	pos, err := ResetPosition(ctx, db, ResetTarget{Beginning: true}, AdminOptions{})
	require.NoError(t, err)
	require.Equal(t, Position{}, pos)
	pos, err = ResetPosition(ctx, db, ResetTarget{Time: t0}, AdminOptions{})
	require.NoError(t, err)
	require.Equal(t, Position{ChangedAt: t0.Add(-time.Microsecond), ID: math.MaxInt64}, pos,
		"every row before the time is passed, none at it")

	mock.ExpectQuery(wantNewest).WithArgs("items").
		WillReturnRows(sqlmock.NewRows([]string{"changed_at", "id"}).AddRow(t0, int64(7)))
	pos, err = ResetPosition(ctx, db, ResetTarget{Newest: true, Table: "items"}, AdminOptions{})
	require.NoError(t, err)
	require.Equal(t, position.Make(t0, 7), pos)
	mock.ExpectQuery(`SELECT changed_at, id FROM "datastore_changelog" ORDER BY changed_at DESC, id DESC LIMIT 1`).
		WillReturnRows(sqlmock.NewRows([]string{"changed_at", "id"}))
	pos, err = ResetPosition(ctx, db, ResetTarget{Newest: true}, AdminOptions{})
	require.NoError(t, err)
	require.Equal(t, Position{}, pos, "an empty changelog")
	mock.ExpectQuery(`SELECT changed_at FROM "datastore_changelog" WHERE id = $1`).WithArgs(int64(5)).
		WillReturnRows(sqlmock.NewRows([]string{"changed_at"}))
	_, err = ResetPosition(ctx, db, ResetTarget{AfterID: 5}, AdminOptions{})
	require.EqualError(t, err, "pgchangestream: changelog row 5 does not exist")
	require.NoError(t, mock.ExpectationsWereMet())

	_, err = ResetPosition(ctx, db, ResetTarget{Beginning: true}, AdminOptions{TokenTable: "a b"})
	require.ErrorIs(t, err, ErrInvalidConfig)
}

func TestResetTokenHoldsTheClientLock(t *testing.T) {
	ctx := context.Background()
	db, mock := mockDB(t)
	key := lockKey("resume_tokens", "c")
	q := buildQueries(Config{TokenTable: DefaultTokenTable})
	lock := func() { // and no shared client's ranges: a changelog without the _ranges table
		mock.ExpectQuery(`SELECT pg_try_advisory_lock($1)`).WithArgs(key).
			WillReturnRows(sqlmock.NewRows([]string{"ok"}).AddRow(true))
		mock.ExpectQuery(`SELECT to_regclass($1) IS NOT NULL`).WithArgs(`"datastore_changelog_ranges"`).
			WillReturnRows(sqlmock.NewRows([]string{"exists"}).AddRow(false))
	}
	expectReset := func(fenced bool, token string) { // the owner epoch moves on, when the table has one
		mock.ExpectQuery(q.epochColumn).WithArgs(`"resume_tokens"`).
			WillReturnRows(sqlmock.NewRows([]string{"exists"}).AddRow(fenced))
		mock.ExpectBegin()
		mock.ExpectExec(wantSaveToken).WithArgs("c", token).WillReturnResult(sqlmock.NewResult(0, 1))
		if fenced {
			mock.ExpectExec(q.bumpEpoch).WithArgs("c").WillReturnResult(sqlmock.NewResult(0, 1))
		}
		mock.ExpectCommit()
		mock.ExpectExec(sessionResetSQL).WillReturnResult(sqlmock.NewResult(0, 0))
	}
	for _, fenced := range []bool{true, false} {
		lock()
		mock.ExpectQuery(wantLoad).WithArgs("c").WillReturnRows(savedTokenRows(`{"eventID": 1, "table": "items"}`))
		expectReset(fenced, `{"timestamp":"2026-01-02T03:04:05Z","eventID":3,"table":"items"}`)
		require.NoError(t, ResetToken(ctx, db, "c", position.Make(t0, 3), AdminOptions{}), "the token keeps its table")
	}
	lock()
	expectReset(false, `{"timestamp":"2026-01-02T03:04:05Z","eventID":3,"table":"other"}`)
	require.NoError(t, ResetTableToken(ctx, db, "c", "other", position.Make(t0, 3), AdminOptions{}))
	require.ErrorIs(t, ResetTableToken(ctx, db, "c", " ", position.Make(t0, 3), AdminOptions{}), ErrInvalidConfig)

	mock.ExpectQuery(`SELECT pg_try_advisory_lock($1)`).WithArgs(key).
		WillReturnRows(sqlmock.NewRows([]string{"ok"}).AddRow(false))
	mock.ExpectExec(sessionResetSQL).WillReturnResult(sqlmock.NewResult(0, 0))
	_, err := DeleteToken(ctx, db, "c", AdminOptions{})
	require.ErrorIs(t, err, ErrClientActive)
	require.EqualError(t, err, "pgchangestream: a watcher of the client is running: c")
	require.NoError(t, mock.ExpectationsWereMet())
}
