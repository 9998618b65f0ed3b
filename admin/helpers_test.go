package admin

import (
	"database/sql"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// The exact statements, as PostgreSQL receives them.
const (
	wantSaveToken = `INSERT INTO "resume_tokens" (client_name, resume_token, last_updated) VALUES ($1, $2::jsonb, now())
	ON CONFLICT (client_name) DO UPDATE SET resume_token = EXCLUDED.resume_token, last_updated = EXCLUDED.last_updated`
	wantLoad   = `SELECT resume_token::text FROM "resume_tokens" WHERE client_name = $1`
	wantNewest = `SELECT changed_at, id FROM "datastore_changelog" WHERE table_name = $1 ORDER BY changed_at DESC, id DESC LIMIT 1`
)

func mockDB(t *testing.T) (*sql.DB, sqlmock.Sqlmock) {
	t.Helper()
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db, mock
}

func savedTokenRows(raw ...string) *sqlmock.Rows {
	rows := sqlmock.NewRows([]string{"resume_token"})
	for _, r := range raw {
		rows.AddRow(r)
	}
	return rows
}
