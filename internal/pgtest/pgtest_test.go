package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { os.Exit(RunMain(m)) }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func count(ctx context.Context, t *testing.T, dsn, query string) int {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	var n int
	require.NoError(t, conn.QueryRow(ctx, query).Scan(&n))
	return n
}

// uniqueTemplate names a template for one run of a test (the shared server outlives -count
// repetitions) and drops it afterwards.
func uniqueTemplate(t *testing.T, what string) string {
	name := fmt.Sprintf("pgtest_template_%s_%d", what, time.Now().UnixNano())
	t.Cleanup(func() { require.NoError(t, Shared(t).DropDatabase(context.Background(), name)) })
	return name
}

func TestSharedAnswers(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	s := Shared(t)
	require.Same(t, s, Shared(t))
	require.True(t, strings.HasPrefix(s.DSN(), "postgres://"), s.DSN())

	db, dsn := NewDatabase(t, "")
	var one int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT 1").Scan(&one))
	require.Equal(t, 1, one)
	var name string
	require.NoError(t, db.QueryRowContext(ctx, "SELECT current_database()").Scan(&name))
	require.Equal(t, s.DSNFor(name), dsn)
}

func TestTemplateCopiedConcurrently(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	s := Shared(t)
	tmpl := uniqueTemplate(t, "widgets")
	var setups atomic.Int32
	setup := func(ctx context.Context, db *sql.DB) error {
		setups.Add(1)
		if _, err := db.ExecContext(ctx, "CREATE TABLE widgets (id int PRIMARY KEY, name text NOT NULL)"); err != nil {
			return err
		}
		_, err := db.ExecContext(ctx, "INSERT INTO widgets VALUES (1, 'first')")
		return err
	}

	var wg sync.WaitGroup
	dsns := make([]string, 4)
	errs := make([]error, 4)
	for i := range dsns {
		wg.Go(func() {
			if errs[i] = s.CreateTemplate(ctx, tmpl, setup); errs[i] == nil {
				dsns[i], errs[i] = s.CreateDatabase(ctx, tmpl)
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.EqualValues(t, 1, setups.Load(), "setup runs once per template")

	for i, dsn := range dsns {
		t.Cleanup(func() {
			cfg, err := pgx.ParseConfig(dsn)
			require.NoError(t, err)
			require.NoError(t, s.DropDatabase(context.Background(), cfg.Database))
		})
		require.Equal(t, 1, count(ctx, t, dsn, "SELECT count(*) FROM widgets"))
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "INSERT INTO widgets VALUES ($1, 'copy')", 100+i)
		require.NoError(t, err)
		require.NoError(t, conn.Close(ctx))
	}
	// Each copy is independent.
	for _, dsn := range dsns {
		require.Equal(t, 2, count(ctx, t, dsn, "SELECT count(*) FROM widgets"))
	}

	// NewDatabase copies it too, and drops the copy afterwards.
	db, _ := NewDatabase(t, tmpl)
	var n int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT count(*) FROM widgets").Scan(&n))
	require.Equal(t, 1, n)
}

func TestTemplateSetupFailureIsRetried(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	s := Shared(t)
	tmpl := uniqueTemplate(t, "retry")
	boom := errors.New("boom")
	err := s.CreateTemplate(ctx, tmpl, func(ctx context.Context, db *sql.DB) error {
		if _, err := db.ExecContext(ctx, "CREATE TABLE half (id int)"); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.NoError(t, s.CreateTemplate(ctx, tmpl, func(ctx context.Context, db *sql.DB) error {
		_, err := db.ExecContext(ctx, "CREATE TABLE half (id int)") // fails if the first try was kept
		return err
	}))
	db, _ := NewDatabase(t, tmpl)
	var n int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT count(*) FROM half").Scan(&n))

	// A dropped template is set up again.
	require.NoError(t, s.DropDatabase(ctx, tmpl))
	ran := false
	require.NoError(t, s.CreateTemplate(ctx, tmpl, func(context.Context, *sql.DB) error {
		ran = true
		return nil
	}))
	require.True(t, ran)
}

func TestTerminateBackends(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	s := Shared(t)
	_, dsn := NewDatabase(t, "")
	app := "pgtest_victim_" + fmt.Sprint(time.Now().UnixNano())

	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = app
	victim, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer func() { _ = victim.Close(ctx) }()
	bystander, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer func() { _ = bystander.Close(ctx) }()

	n, err := s.TerminateBackends(ctx, app)
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 1)
	_, err = victim.Exec(ctx, "SELECT 1")
	require.Error(t, err, "the terminated connection's next query fails")
	_, err = bystander.Exec(ctx, "SELECT 1")
	require.NoError(t, err)

	n, err = s.TerminateBackends(ctx, app)
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestRestartKillStop(t *testing.T) {
	ctx := testContext(t)
	s := NewServer(t, Options{})
	require.True(t, s.Local())
	dir := s.Dir()
	require.DirExists(t, dir)
	addr := s.DSN()

	db, dsn := s.NewDatabase(t, "")
	_, err := db.ExecContext(ctx, "CREATE TABLE events (id int PRIMARY KEY)")
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, "INSERT INTO events VALUES (1)")
	require.NoError(t, err)
	require.NoError(t, db.Close())

	// Restart: same address, data kept.
	held, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	require.NoError(t, s.Restart(ctx))
	require.Equal(t, addr, s.DSN())
	_, err = held.Exec(ctx, "SELECT 1")
	require.Error(t, err, "a fast shutdown closes open connections")
	require.Equal(t, 1, count(ctx, t, dsn, "SELECT count(*) FROM events"))

	// Kill: crash recovery keeps committed rows even with fsync off.
	held, err = pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	_, err = held.Exec(ctx, "INSERT INTO events VALUES (2)")
	require.NoError(t, err)
	require.NoError(t, s.Kill(ctx))
	_, err = held.Exec(ctx, "SELECT 1")
	require.Error(t, err, "a killed server drops its connections")
	require.Equal(t, 2, count(ctx, t, dsn, "SELECT count(*) FROM events"))
	require.NoError(t, s.Kill(ctx), "a recovered server can be killed again")
	require.Equal(t, 2, count(ctx, t, dsn, "SELECT count(*) FROM events"))

	// Stop removes everything and is idempotent.
	require.NoError(t, s.Stop())
	require.NoDirExists(t, dir)
	require.NoError(t, s.Stop())
	require.Error(t, s.Restart(ctx))
	require.Error(t, s.Kill(ctx))
	_, err = pgx.Connect(ctx, dsn)
	require.Error(t, err)
}

func TestExternalDSN(t *testing.T) {
	ctx := testContext(t)
	shared := Shared(t)
	t.Setenv(EnvDSN, shared.DSN())
	s, err := Start(ctx, Options{})
	require.NoError(t, err)
	require.False(t, s.Local())
	require.Equal(t, shared.DSN(), s.DSN())
	require.ErrorIs(t, s.Restart(ctx), ErrNotLocal)
	require.ErrorIs(t, s.Kill(ctx), ErrNotLocal)

	db, _ := s.NewDatabase(t, "")
	require.NoError(t, db.PingContext(ctx))
	require.NoError(t, s.Stop())
	require.Equal(t, 1, count(ctx, t, shared.DSN(), "SELECT 1"), "Stop leaves an external server running")

	kv := newServer("host=127.0.0.1 user=postgres dbname=postgres", nil)
	require.Equal(t, `host=127.0.0.1 user=postgres dbname=postgres dbname='it\'s'`, kv.DSNFor("it's"))
}

// recordingTB records what noServer does with a test.
type recordingTB struct {
	testing.TB
	skipped, failed string
}

func (r *recordingTB) Helper()                           {}
func (r *recordingTB) Skip(args ...any)                  { r.skipped = fmt.Sprint(args...) }
func (r *recordingTB) Fatal(args ...any)                 { r.failed = fmt.Sprint(args...) }
func (r *recordingTB) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestNoServer(t *testing.T) {
	t.Setenv(EnvDSN, "")
	t.Setenv("PATH", "")
	saved := binaryDirs
	binaryDirs = []string{t.TempDir() + "/*/bin"}
	defer func() { binaryDirs = saved }()

	_, err := Start(testContext(t), Options{})
	require.ErrorIs(t, err, ErrNoServer)
	for _, want := range []string{EnvDSN, "install the PostgreSQL server binaries", "initdb", "make test-container"} {
		require.ErrorContains(t, err, want)
	}

	t.Setenv(EnvRequire, "")
	var skipped recordingTB
	noServer(&skipped, err)
	require.Contains(t, skipped.skipped, EnvDSN)
	require.Empty(t, skipped.failed)

	t.Setenv(EnvRequire, "1")
	var failed recordingTB
	noServer(&failed, err)
	require.Contains(t, failed.failed, EnvDSN)
	require.Contains(t, failed.failed, EnvRequire)
	require.Empty(t, failed.skipped)
}
