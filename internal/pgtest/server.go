package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Environment variables read by this package.
const (
	// EnvDSN names an existing server to use instead of starting one.
	EnvDSN = "PGCHANGESTREAM_TEST_DSN"
	// EnvRequire set to "1" turns the skip for a missing server into a test failure.
	EnvRequire = "PGCHANGESTREAM_REQUIRE_POSTGRES"
)

// ErrNoServer is wrapped by the error [Start] returns when no source can provide a server. Its
// text says how to provide one.
var ErrNoServer = errors.New("pgtest: no PostgreSQL server available")

// ErrNotLocal is wrapped by the errors of [Server.Restart] and [Server.Kill] for a server this
// package did not start (PGCHANGESTREAM_TEST_DSN).
var ErrNotLocal = errors.New("pgtest: restarting or killing the server needs a local cluster " +
	"started by pgtest (unset " + EnvDSN + " and install the PostgreSQL server binaries)")

// howTo is the advice in every "no server" message.
const howTo = "set " + EnvDSN + " to the URL of a server whose user may create databases " +
	"(for example postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable), " +
	"or install the PostgreSQL server binaries so that initdb and postgres are on PATH " +
	"or under /usr/lib/postgresql/*/bin (Debian/Ubuntu: apt-get install postgresql; " +
	"Fedora/RHEL: dnf install postgresql-server; macOS: brew install postgresql), " +
	"or, with a Docker engine, run the tests through the container command " +
	"(make test-container, or go run . -dir ../../.. -- go test ./... in internal/pgtest/containers)"

// binaryDirs are the places searched for initdb and postgres after PATH, by glob; the highest
// version wins.
var binaryDirs = []string{"/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/usr/local/pgsql/bin"}

// readyTimeout bounds the wait for a server to accept connections after a start, restart or
// kill, when the caller's context has no earlier deadline.
const readyTimeout = 30 * time.Second

// appName is the application_name of the connections this package opens itself.
const appName = "pgtest"

// Options configures a server started by [Start] or [NewServer].
type Options struct {
	// Fsync makes commits durable against a machine crash (fsync and full_page_writes on), for
	// benchmarks. Default off, which is much faster and enough for tests. synchronous_commit
	// stays on either way, so a commit has reached the operating system when it returns and
	// survives [Server.Kill]. Ignored for an external server.
	Fsync bool
	// Logf receives progress messages (cluster directory, port, restarts). Default: discarded.
	Logf func(format string, args ...any)
	// ListenAddress is an address the server listens on besides 127.0.0.1, trusting every
	// client that reaches it: the end of a network namespace's link that a fault test cuts.
	// The address must exist when the server starts. Local clusters only.
	ListenAddress string
}

// unavailable reports that one source of servers cannot be used here; [Start] moves on to the
// next source and names the reason if none is left.
type unavailable string

func (u unavailable) Error() string { return string(u) }

// Server is one running PostgreSQL: a local cluster started by this package, a container, or
// an external server named by PGCHANGESTREAM_TEST_DSN. Its methods are safe for concurrent use.
type Server struct {
	dsn   string                           // DSN of the default database; immutable
	local *cluster                         // the cluster this package started; nil otherwise
	stopC func() error                     // stops a container; nil otherwise
	logf  func(format string, args ...any) // never nil

	stopOnce sync.Once
	stopErr  error // set by stopOnce
	stopped  chan struct{}

	tmplMu sync.Mutex           // guards tmpl
	tmpl   map[string]*template // by template database name
}

// template serializes the work on one template database: its setup and every copy from it.
type template struct {
	mu    sync.Mutex // held across setup and CREATE DATABASE ... TEMPLATE
	ready bool       // setup has succeeded; guarded by mu
}

// running holds the servers this package started in this process and nobody stopped yet, for
// [RunMain].
var running servers

type servers struct {
	mu  sync.Mutex // guards set
	set map[*Server]struct{}
}

func (r *servers) add(s *Server) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.set == nil {
		r.set = map[*Server]struct{}{}
	}
	r.set[s] = struct{}{}
}

func (r *servers) remove(s *Server) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.set, s)
}

// stopAll stops every running server and returns the errors.
func stopAll() []error {
	running.mu.Lock()
	all := make([]*Server, 0, len(running.set))
	for s := range running.set {
		all = append(all, s)
	}
	running.mu.Unlock()
	var errs []error
	for _, s := range all {
		if err := s.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// Start starts a server, or connects to the one PGCHANGESTREAM_TEST_DSN names, in the order
// described in the package documentation. It is meant for code outside tests (benchmarks, the
// demo command); tests use [Shared] or [NewServer]. When no source can provide a server, the
// error wraps [ErrNoServer] and says how to provide one. The caller must call [Server.Stop].
func Start(ctx context.Context, opts Options) (*Server, error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		return startExternal(ctx, dsn, logf)
	}
	s, err := startLocal(ctx, opts, logf)
	var u unavailable
	if errors.As(err, &u) {
		return nil, fmt.Errorf("%w (%s): %s", ErrNoServer, u, howTo)
	}
	if err == nil {
		running.add(s)
	}
	return s, err
}

func newServer(dsn string, logf func(string, ...any)) *Server {
	return &Server{dsn: dsn, logf: logf, stopped: make(chan struct{}), tmpl: map[string]*template{}}
}

// startExternal checks that the server named by dsn answers.
func startExternal(ctx context.Context, dsn string, logf func(string, ...any)) (*Server, error) {
	if _, err := pgx.ParseConfig(dsn); err != nil {
		return nil, fmt.Errorf("pgtest: parse %s: %w", EnvDSN, err)
	}
	s := newServer(dsn, logf)
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	conn, err := connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("pgtest: connect to the server %s names: %w", EnvDSN, err)
	}
	_ = conn.Close(ctx)
	logf("pgtest: using the server %s names", EnvDSN)
	return s, nil
}

// DSN returns the URL (or keyword/value string, as given in PGCHANGESTREAM_TEST_DSN) of the
// server's default database, for example
// postgres://postgres@127.0.0.1:54321/postgres?sslmode=disable.
func (s *Server) DSN() string { return s.dsn }

// DSNFor returns the DSN of the named database on this server.
func (s *Server) DSNFor(database string) string {
	if u, err := url.Parse(s.dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + database
		u.RawPath = ""
		return u.String()
	}
	// Keyword/value form: a later keyword overrides an earlier one.
	r := strings.NewReplacer(`\`, `\\`, `'`, `\'`)
	return s.dsn + " dbname='" + r.Replace(database) + "'"
}

// Local reports whether this package started the cluster, so that [Server.Restart] and
// [Server.Kill] are available.
func (s *Server) Local() bool { return s.local != nil }

// Stop stops a cluster this package started and removes its directory, or stops the container.
// For an external server it does nothing. Calls after the first return the first result.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		running.remove(s)
		close(s.stopped)
		switch {
		case s.local != nil:
			s.stopErr = s.local.stop()
		case s.stopC != nil:
			s.stopErr = s.stopC()
		}
	})
	return s.stopErr
}

// isStopped reports whether Stop was called.
func (s *Server) isStopped() bool {
	select {
	case <-s.stopped:
		return true
	default:
		return false
	}
}

// Restart shuts the cluster down (fast mode: open connections are closed) and starts it again on
// the same port. It returns when the server accepts connections, bounded by ctx and 30 seconds.
// It needs a local cluster: otherwise the error wraps [ErrNotLocal].
func (s *Server) Restart(ctx context.Context) error {
	if s.local == nil {
		return fmt.Errorf("pgtest: restart: %w", ErrNotLocal)
	}
	if s.isStopped() {
		return errors.New("pgtest: restart: server stopped")
	}
	return s.local.restart(ctx)
}

// Kill simulates a crash: it sends SIGKILL to the postmaster (pid read from postmaster.pid) and
// to its remaining child processes, then starts the cluster again on the same port, which runs
// crash recovery. It returns when the server accepts connections, bounded by ctx and 30
// seconds. Committed rows survive even with fsync off, as the operating system keeps them. It
// needs a local cluster: otherwise the error wraps [ErrNotLocal].
func (s *Server) Kill(ctx context.Context) error {
	if s.local == nil {
		return fmt.Errorf("pgtest: kill: %w", ErrNotLocal)
	}
	if s.isStopped() {
		return errors.New("pgtest: kill: server stopped")
	}
	return s.local.kill(ctx)
}

// Dir returns the directory of a local cluster (data directory, socket directory and the server
// log postgres.log), or "" for other servers.
func (s *Server) Dir() string {
	if s.local == nil {
		return ""
	}
	return s.local.dir
}
