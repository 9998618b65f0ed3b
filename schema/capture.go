package schema

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// noNotifyArg is the trigger argument that makes the trigger function skip its NOTIFY
// (install.sql), and notifyArg the one that says it notifies, which it does without either:
// Capture gives every trigger one of them (see triggerArgs).
const (
	noNotifyArg = "no_notify"
	notifyArg   = "notify"
)

// Key paths: at most maxKeyParts parts, each of letters, digits and _.
const maxKeyParts = 8

// keyArgPrefix starts the trigger argument that names the key path (install.sql).
const keyArgPrefix = "key="

// captureStatements returns the statements Capture runs: one DO block that checks the table and
// attaches the trigger if it is missing.
func captureStatements(table string, opts Options) ([]string, error) {
	explicit := opts.Key
	opts, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	if err := checkSchemaName("schema.Capture table", table, changelog.CheckName); err != nil {
		return nil, err
	}
	key := explicit
	if key == "" && changelog.Unqualified(table) == changelog.HealthEventsTable {
		key = DefaultHealthEventsKey
	}
	explicitLiteral := "NULL"
	if explicit != "" {
		if err := checkKeyPath(explicit); err != nil {
			return nil, err
		}
		explicitLiteral = changelog.QuoteLiteral(explicit)
	}
	keyLiteral := "NULL"
	if key != "" {
		keyLiteral = changelog.QuoteLiteral(key)
	}
	trigger := changelog.TriggerName(table)
	stmt, err := renderSchema("capture.sql", struct {
		LockKey                                                  int64
		Table, TableLiteral, ChangelogLiteral, Trigger, Function string
		TriggerLiteral, Args, PlainArgs, Key, ExplicitKey        string
		NoNotify, KeyPrefix, UnitColumn                          string
		Captured, CapturedLiteral                                string
		WithoutNotify                                            bool
	}{
		ddlLockKey, changelog.Quote(table), changelog.QuoteLiteral(changelog.Quote(table)),
		changelog.QuoteLiteral(changelog.Quote(opts.ChangelogTable)), changelog.Quote(trigger),
		changelog.Quote(opts.FunctionName), changelog.QuoteLiteral(trigger),
		triggerArgs(opts.WithoutNotify, key), triggerArgs(opts.WithoutNotify, ""), keyLiteral, explicitLiteral,
		changelog.QuoteLiteral(noNotifyArg), changelog.QuoteLiteral(keyArgPrefix), changelog.QuoteLiteral(changelog.UnitColumn),
		changelog.Quote(changelog.CapturedTable(opts.ChangelogTable)), changelog.QuoteLiteral(changelog.Quote(changelog.CapturedTable(opts.ChangelogTable))),
		opts.WithoutNotify,
	})
	if err != nil {
		return nil, fmt.Errorf("pgchangestream: capture changes of %s: %w", table, err)
	}
	return []string{stmt}, nil
}

// Capture attaches the trigger function to table ("name" or "schema.name") if it is not
// attached yet, as a trigger named "<name>_changes" that fires after every inserted, updated
// or deleted row, and lists it among the captured tables ("<changelog>_captured"), for which
// alone (and for tables of the changelog's owner) the trigger function writes, even when the
// trigger existed already. Run it as the changelog's owner. The table must have a column named
// id, whose value becomes the changelog's record_id; Capture fails if the table does not
// exist, is temporary, has no id column, or has one the changelog's record_id cannot store (an
// existing changelog's UUID record_id takes only uuid ids), or if the trigger exists and
// notifies while [Options.WithoutNotify] is set (or the other way round), or exists with
// another key than an [Options.Key] given: drop it first to change. Without a Key an existing
// trigger is kept whatever its key. Run [Install] first.
//
// It runs one statement: a DO block that checks the table and attaches the trigger if it is
// missing. With [Options.DryRun] it needs no database (db may be nil) and returns that
// statement.
func Capture(ctx context.Context, db *sql.DB, table string, opts Options) (Result, error) {
	stmts, err := captureStatements(table, opts)
	if err != nil || opts.DryRun {
		return Result{Statements: stmts}, err
	}
	for _, stmt := range stmts {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return Result{}, fmt.Errorf("pgchangestream: capture changes of %s: %w", table, err)
		}
	}
	return Result{Statements: stmts}, nil
}

// checkKeyPath validates a key path: dot-separated parts of letters, digits and _, at most
// maxKeyParts of them.
func checkKeyPath(path string) error {
	parts := strings.Split(path, ".")
	if len(parts) > maxKeyParts {
		return fmt.Errorf("%w: schema.Options.Key: %q has %d parts, more than %d",
			ErrInvalidConfig, path, len(parts), maxKeyParts)
	}
	for i, part := range parts {
		if part == "" {
			return fmt.Errorf("%w: schema.Options.Key: %q: part %d is empty", ErrInvalidConfig, path, i+1)
		}
		for _, r := range part {
			if !(r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
				return fmt.Errorf("%w: schema.Options.Key: %q: part %q holds a character other than "+
					"letters, digits and _", ErrInvalidConfig, path, part)
			}
		}
	}
	return nil
}

// triggerArgs returns the argument list of the trigger function, each a quoted literal:
// 'no_notify' if withoutNotify, else 'notify', then 'key=<path>' if key is set. A trigger of
// Capture always has an argument, so one without any is not Capture's (other DDL created it,
// or an earlier release, which left a notifying trigger without a key bare).
func triggerArgs(withoutNotify bool, key string) string {
	args := []string{changelog.QuoteLiteral(notifyArg)}
	if withoutNotify {
		args[0] = changelog.QuoteLiteral(noNotifyArg)
	}
	if key != "" {
		args = append(args, changelog.QuoteLiteral(keyArgPrefix+key))
	}
	return strings.Join(args, ", ")
}
