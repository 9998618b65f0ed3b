package pgtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"github.com/pgchangestream/pgchangestream/internal/backoff"
)

// pollInterval is the cadence of the bounded loops that wait for the server.
const pollInterval = 20 * time.Millisecond

// sqlstateObjectInUse is "source database ... is being accessed by other users".
const sqlstateObjectInUse = "55006"

// connect opens one connection with application_name "pgtest" (unless dsn sets one).
func connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = appName
	}
	if cfg.ConnectTimeout == 0 || cfg.ConnectTimeout > 5*time.Second {
		cfg.ConnectTimeout = 5 * time.Second
	}
	return pgx.ConnectConfig(ctx, cfg)
}

// admin runs f on a fresh connection to the default database. A fresh connection per call
// keeps admin work independent of restarts and kills.
func (s *Server) admin(ctx context.Context, f func(conn *pgx.Conn) error) error {
	conn, err := connect(ctx, s.dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	return f(conn)
}

// uniqueName returns a database name unlikely to collide, even between test binaries sharing
// one external server.
func uniqueName() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "pgtest_" + hex.EncodeToString(b[:]), nil
}

// templateLock returns the lock of the named template.
func (s *Server) templateLock(name string) *template {
	s.tmplMu.Lock()
	defer s.tmplMu.Unlock()
	t := s.tmpl[name]
	if t == nil {
		t = &template{}
		s.tmpl[name] = t
	}
	return t
}

// CreateDatabase creates a database with a unique name and returns its DSN. With a non-empty
// template it is created as a copy of that database (CREATE DATABASE ... TEMPLATE), which takes
// a fraction of a second however large the schema; copies from one template are serialized,
// and retried while another session is still connected to the template.
func (s *Server) CreateDatabase(ctx context.Context, template string) (dsn string, err error) {
	name, err := s.createDatabase(ctx, template)
	if err != nil {
		return "", err
	}
	return s.DSNFor(name), nil
}

func (s *Server) createDatabase(ctx context.Context, template string) (string, error) {
	name, err := uniqueName()
	if err != nil {
		return "", fmt.Errorf("pgtest: create database: %w", err)
	}
	q := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		q += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
		t := s.templateLock(template)
		// Held across I/O on purpose: copies must not overlap the template's setup.
		t.mu.Lock()
		defer t.mu.Unlock()
	}
	err = s.admin(ctx, func(conn *pgx.Conn) error {
		return execRetryInUse(ctx, conn, q)
	})
	if err != nil {
		return "", fmt.Errorf("pgtest: create database %s (template %q): %w", name, template, err)
	}
	return name, nil
}

// execRetryInUse runs q, retrying while the server says a database is in use by other sessions
// (they may still be exiting), for at most readyTimeout.
func execRetryInUse(ctx context.Context, conn *pgx.Conn, q string, args ...any) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		_, err := conn.Exec(ctx, q, args...)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != sqlstateObjectInUse ||
			time.Now().After(deadline) {
			return err
		}
		if !backoff.Sleep(ctx, pollInterval) {
			return ctx.Err()
		}
	}
}

// CreateTemplate makes the database name ready to be copied by [Server.CreateDatabase]: it
// creates it if missing and runs setup on it, once per server and name. Concurrent callers
// with the same name wait for the first; after a failed setup the next caller tries again on a
// fresh database. Every connection to the template is closed before it returns.
//
// With an external server the database may exist from an earlier run, so setup should be
// idempotent (CREATE TABLE IF NOT EXISTS ...), and test binaries that share the server should
// use different template names.
func (s *Server) CreateTemplate(ctx context.Context, name string, setup func(ctx context.Context, db *sql.DB) error) error {
	t := s.templateLock(name)
	// Held across I/O on purpose: one setup per name, and no copy while it runs.
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ready {
		return nil
	}
	var created bool
	err := s.admin(ctx, func(conn *pgx.Conn) error {
		var exists bool
		err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists)
		if err != nil || exists {
			return err
		}
		created = true
		_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		return err
	})
	if err != nil {
		return fmt.Errorf("pgtest: create template %q: %w", name, err)
	}

	db, err := sql.Open("pgx", s.DSNFor(name))
	if err != nil {
		return fmt.Errorf("pgtest: open template %q: %w", name, err)
	}
	err = setup(ctx, db)
	if cerr := db.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		if created {
			_ = s.dropDatabase(context.WithoutCancel(ctx), name)
		}
		return fmt.Errorf("pgtest: set up template %q: %w", name, err)
	}
	// Connections the setup leaked would make every copy fail.
	err = s.admin(ctx, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "+
			"WHERE datname = $1 AND pid <> pg_backend_pid()", name)
		return err
	})
	if err != nil {
		return fmt.Errorf("pgtest: close connections to template %q: %w", name, err)
	}
	t.ready = true
	return nil
}

// DropDatabase drops the named database if it exists, closing every connection to it
// (DROP DATABASE ... WITH (FORCE)). A template dropped this way is set up again by the next
// [Server.CreateTemplate] with its name.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	s.tmplMu.Lock()
	t := s.tmpl[name]
	s.tmplMu.Unlock()
	if t != nil {
		t.mu.Lock()
		defer t.mu.Unlock()
		t.ready = false
	}
	return s.dropDatabase(ctx, name)
}

// dropDatabase is DropDatabase for a caller holding the template's lock, if any.
func (s *Server) dropDatabase(ctx context.Context, name string) error {
	err := s.admin(ctx, func(conn *pgx.Conn) error {
		return execRetryInUse(ctx, conn, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	if err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	return nil
}

// TerminateBackends terminates (pg_terminate_backend) every server process whose connection set
// application_name to appName, waits until they are gone, and returns how many there were. The
// next query on a terminated connection fails.
func (s *Server) TerminateBackends(ctx context.Context, appName string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	var n int
	err := s.admin(ctx, func(conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, "WITH a AS MATERIALIZED (SELECT pid FROM pg_stat_activity "+
			"WHERE application_name = $1 AND pid <> pg_backend_pid()) "+
			"SELECT pid FROM a WHERE pg_terminate_backend(pid)", appName)
		if err != nil {
			return err
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return err
		}
		n = len(pids)
		for len(pids) > 0 {
			var left int
			err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)", pids).Scan(&left)
			if err != nil || left == 0 {
				return err
			}
			if !backoff.Sleep(ctx, pollInterval) {
				return ctx.Err()
			}
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("pgtest: terminate backends of %q: %w", appName, err)
	}
	return n, nil
}
