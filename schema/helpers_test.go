package schema

import (
	"context"
	"database/sql"
	"os"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// TestMain stops the shared test server after the tests.
func TestMain(m *testing.M) { os.Exit(pgtest.RunMain(m)) }

// mockDB returns a sqlmock database that matches statements exactly.
func mockDB(t *testing.T) (*sql.DB, sqlmock.Sqlmock) {
	t.Helper()
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db, mock
}

// errOf is the error of a call, for the tests that check only that.
func errOf(_ Result, err error) error { return err }

// installSQL returns the statements Install would run with opts, from a dry run without a
// database.
func installSQL(opts Options) ([]string, error) {
	opts.DryRun = true
	res, err := Install(context.Background(), nil, opts)
	return res.Statements, err
}

// captureSQL returns the statements Capture would run for table with opts, from a dry run
// without a database.
func captureSQL(table string, opts Options) ([]string, error) {
	opts.DryRun = true
	res, err := Capture(context.Background(), nil, table, opts)
	return res.Statements, err
}
