package admin

import (
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// The parked calls work on the dead-letter table of Options.ChangelogTable, and refuse a bad
// name before any statement.
func TestParkedCallsTakeTheChangelogsTable(t *testing.T) {
	db, mock := mockDB(t)
	mock.ExpectExec(`UPDATE "log_parked" SET retry_requested = TRUE WHERE client_name = $1 AND id = $2`).
		WithArgs("c", int64(9)).WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectExec(`DELETE FROM "datastore_changelog_parked" WHERE client_name = $1 AND id = $2`).
		WithArgs("c", int64(9)).WillReturnResult(sqlmock.NewResult(0, 0))
	require.NoError(t, RetryParked(t.Context(), db, "c", 9, Options{ChangelogTable: "log", TokenTable: "bad name"}),
		"the token table is not used")
	require.ErrorIs(t, DropParked(t.Context(), db, "c", 9, Options{}), changelog.ErrNotParked)
	_, err := ListParked(t.Context(), db, "c", Options{ChangelogTable: "bad name"})
	require.ErrorIs(t, err, changelog.ErrInvalidConfig)
	require.ErrorContains(t, err, "admin.Options.ChangelogTable")
	require.NoError(t, mock.ExpectationsWereMet())
}
