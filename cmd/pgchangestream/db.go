package main

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
)

// connectTimeout bounds the first connection (the ping) of every subcommand.
const connectTimeout = 10 * time.Second

// connectDB opens a pool for dsn and pings the server (see openDB and pingDB).
func connectDB(ctx context.Context, dsn string) (*sql.DB, error) {
	db, cfg, err := openDB(dsn)
	if err != nil {
		return nil, err
	}
	if err := pingDB(ctx, db, cfg); err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// connectFlagDSN connects to the database named by --dsn (flagValue) or $PGCHANGESTREAM_DSN
// (see resolveDSN and connectDB).
func connectFlagDSN(ctx context.Context, flagValue string) (*sql.DB, error) {
	dsn, err := resolveDSN(flagValue)
	if err != nil {
		return nil, err
	}
	return connectDB(ctx, dsn)
}

// openDB checks dsn (a usage error if it cannot be parsed) and opens a pool without connecting.
func openDB(dsn string) (*sql.DB, *pgconn.Config, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, nil, usagef("invalid --dsn: %v", err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, nil, usagef("invalid --dsn: %v", err)
	}
	return db, cfg, nil
}

// pingDB connects within connectTimeout. The error names the server without its password.
func pingDB(ctx context.Context, db *sql.DB, cfg *pgconn.Config) error {
	pingCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		if ctx.Err() == nil && pingCtx.Err() != nil {
			err = fmt.Errorf("no answer within %v: %w", connectTimeout, err)
		}
		return fmt.Errorf("cannot connect to %s: %w", describeServer(cfg), err)
	}
	return nil
}

// describeServer names a server as user@host:port/database, without the password.
func describeServer(cfg *pgconn.Config) string {
	host := cfg.Host
	if strings.HasPrefix(host, "/") {
		host = "unix:" + host
	}
	return fmt.Sprintf("%s@%s:%d/%s", cfg.User, host, cfg.Port, cfg.Database)
}

// identifierRE is a table name as the library accepts it: name or schema.name, each part a SQL
// identifier of letters, digits, _ and $, not starting with a digit.
var identifierRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}(\.[A-Za-z_][A-Za-z0-9_$]{0,62})?$`)

// quoteTable validates a table name given as flag and returns it quoted for SQL.
func quoteTable(flagName, name string) (string, error) {
	if !identifierRE.MatchString(name) {
		return "", usagef("--%s %q is not a valid table name (name or schema.name: letters, digits, _ and $)", flagName, name)
	}
	return pgx.Identifier(strings.Split(name, ".")).Sanitize(), nil
}

// requireTable fails unless the table named by quoted (as quoteTable returns it) exists. what
// and name describe it in the messages ("changelog table", "datastore_changelog").
func requireTable(ctx context.Context, db *sql.DB, what, name, quoted string) error {
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, quoted).Scan(&exists); err != nil {
		return fmt.Errorf("check %s %s: %w", what, name, err)
	}
	if !exists {
		return fmt.Errorf("%s %s does not exist (create it with '%s schema install')", what, name, prog)
	}
	return nil
}
