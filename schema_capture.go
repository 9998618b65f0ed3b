package pgchangestream

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// noNotifyArg is the trigger argument that makes the trigger function skip its NOTIFY
// (schema/install.sql), and notifyArg the one that says it notifies, which it does without
// either: CaptureChanges gives every trigger one of them (see triggerArgs).
const (
	noNotifyArg = "no_notify"
	notifyArg   = "notify"
)

// CaptureChangesSQL returns the statements [CaptureChanges] runs: one DO block that checks the
// table and attaches the trigger if it is missing.
func CaptureChangesSQL(table string, opts SchemaOptions) ([]string, error) {
	explicit := opts.Key
	opts, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	if err := checkSchemaName("CaptureChanges table", table, changelog.CheckName); err != nil {
		return nil, err
	}
	key := explicit
	if key == "" && changelog.Unqualified(table) == healthEventsTable {
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

// CaptureChanges attaches the trigger function to table ("name" or "schema.name") if it is not
// attached yet, as a trigger named "<name>_changes" that fires after every inserted, updated
// or deleted row, and lists it among the captured tables ("<changelog>_captured"), for which
// alone (and for tables of the changelog's owner) the trigger function writes, even when the
// trigger existed already. Run it as the changelog's owner. The table must have a column named
// id, whose value becomes the changelog's record_id; CaptureChanges fails if the table does not
// exist, is temporary, has no id column, or has one the changelog's record_id cannot store (an
// existing changelog's UUID record_id takes only uuid ids), or if the trigger exists and
// notifies while [SchemaOptions.WithoutNotify] is set (or the other way round), or exists with
// another key than a [SchemaOptions.Key] given: drop it first to change. Without a Key an
// existing trigger is kept whatever its key. Run [InstallSchema] first.
func CaptureChanges(ctx context.Context, db *sql.DB, table string, opts SchemaOptions) error {
	stmts, err := CaptureChangesSQL(table, opts)
	if err != nil {
		return err
	}
	for _, stmt := range stmts {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("pgchangestream: capture changes of %s: %w", table, err)
		}
	}
	return nil
}
