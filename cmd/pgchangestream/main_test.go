package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/pgchangestream/pgchangestream/schema"
)

// TestMain stops the shared test server after the tests and fails the run if a goroutine is
// left behind.
func TestMain(m *testing.M) {
	getenv = func(string) string { return "" } // tests never read the caller's PGCHANGESTREAM_DSN
	code := pgtest.RunMain(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left after the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// cmdTemplate is a database with the schema installed and the table "items" captured.
const cmdTemplate = "pgchangestream_cmd"

func setupCmdTemplate(ctx context.Context, db *sql.DB) error {
	if _, err := schema.Install(ctx, db, schema.Options{}); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS items (
		id serial PRIMARY KEY, name text NOT NULL, qty int NOT NULL DEFAULT 0)`); err != nil {
		return err
	}
	_, err := schema.Capture(ctx, db, "items", schema.Options{})
	return err
}

// newItemsDB returns a fresh database copied from cmdTemplate, and its DSN.
func newItemsDB(t *testing.T) (*sql.DB, string) {
	t.Helper()
	srv := pgtest.Shared(t)
	require.NoError(t, srv.CreateTemplate(context.Background(), cmdTemplate, setupCmdTemplate))
	return srv.NewDatabase(t, cmdTemplate)
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lines returns the complete lines written so far.
func (s *syncBuffer) lines() []string {
	text := s.String()
	if i := strings.LastIndexByte(text, '\n'); i >= 0 {
		return strings.Split(text[:i], "\n")
	}
	return nil
}

// runCmd runs the command line in-process and returns its exit code, stdout and stderr.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb syncBuffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// execSQL runs statements on db, failing the test on error.
func execSQL(t *testing.T, db *sql.DB, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		_, err := db.ExecContext(context.Background(), s)
		require.NoError(t, err, s)
	}
}
