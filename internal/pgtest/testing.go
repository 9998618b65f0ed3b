package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds starting a server for a test: initdb plus the first start.
const startTimeout = 2 * time.Minute

// shared is the server of this test binary.
var shared struct {
	mu  sync.Mutex // guards the fields below
	srv *Server
	err error
	ran bool // Start was tried; srv or err is set
}

// Shared returns the server shared by every test of this test binary, starting it (fsync off)
// on first use. When no server can be had, it skips the test with a message saying how to
// provide one, or fails it if PGCHANGESTREAM_REQUIRE_POSTGRES=1. Tests must not stop it: use
// [RunMain] in TestMain. Tests that restart or kill the server should use [NewServer].
func Shared(tb testing.TB) *Server {
	tb.Helper()
	shared.mu.Lock()
	if !shared.ran {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		shared.srv, shared.err = Start(ctx, Options{})
		cancel()
		shared.ran = true
	}
	srv, err := shared.srv, shared.err
	shared.mu.Unlock()
	if err != nil {
		noServer(tb, err)
	}
	return srv
}

// noServer skips or fails tb for a server that could not be had.
func noServer(tb testing.TB, err error) {
	tb.Helper()
	switch {
	case !errors.Is(err, ErrNoServer):
		tb.Fatal(err)
	case os.Getenv(EnvRequire) == "1":
		tb.Fatalf("%v (failing instead of skipping because %s=1)", err, EnvRequire)
	default:
		tb.Skip(err)
	}
}

// stopShared stops the shared server, if it was started, and forgets it.
func stopShared() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	srv := shared.srv
	shared.srv, shared.err, shared.ran = nil, nil, false
	if srv == nil {
		return nil
	}
	return srv.Stop()
}

// RunMain runs the tests, then stops the shared server and any other server this package
// started and nobody stopped, and returns the exit code for os.Exit. On SIGINT or SIGTERM it
// stops every server this package started and exits. Use it as
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.RunMain(m)) }
func RunMain(m *testing.M) (code int) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	finished := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case sig := <-sigs:
			signal.Stop(sigs)
			for _, err := range stopAll() {
				fmt.Fprintln(os.Stderr, err)
			}
			fmt.Fprintf(os.Stderr, "pgtest: %v: stopped the test servers\n", sig)
			os.Exit(1)
		case <-finished:
		}
	})
	defer func() {
		signal.Stop(sigs)
		close(finished)
		wg.Wait()
		errs := append([]error{stopShared()}, stopAll()...)
		if err := errors.Join(errs...); err != nil {
			fmt.Fprintln(os.Stderr, err)
			if code == 0 {
				code = 1
			}
		}
	}()
	return m.Run()
}

// NewServer starts a server for this test alone, stopped in tb.Cleanup; for tests that restart
// or kill the server. It skips or fails the test like [Shared] when no server can be had.
// opts.Logf defaults to tb.Logf.
func NewServer(tb testing.TB, opts Options) *Server {
	tb.Helper()
	if opts.Logf == nil {
		opts.Logf = tb.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	srv, err := Start(ctx, opts)
	if err != nil {
		noServer(tb, err)
	}
	tb.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return srv
}

// NewDatabase returns a fresh database on the [Shared] server, copied from template if it is
// not empty, as a *sql.DB (pgx stdlib driver) and its DSN. In tb.Cleanup the *sql.DB is closed
// and the database dropped.
func NewDatabase(tb testing.TB, template string) (*sql.DB, string) {
	tb.Helper()
	return Shared(tb).NewDatabase(tb, template)
}

// NewDatabase is like the package-level [NewDatabase] on this server.
func (s *Server) NewDatabase(tb testing.TB, template string) (*sql.DB, string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	name, err := s.createDatabase(ctx, template)
	if err != nil {
		tb.Fatal(err)
	}
	dsn := s.DSNFor(name)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		tb.Fatalf("pgtest: open %s: %v", name, err)
	}
	tb.Cleanup(func() {
		_ = db.Close()
		if s.isStopped() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		defer cancel()
		if err := s.DropDatabase(ctx, name); err != nil {
			tb.Error(err)
		}
	})
	return db, dsn
}
