package schema

import (
	"bytes"
	"cmp"
	"embed"
	"fmt"
	"strings"
	"text/template"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// DefaultTriggerFunction is the default [Options.FunctionName]. It is the existing schema's
// name, so triggers that already call it pick up the function [Install] writes.
const DefaultTriggerFunction = changelog.DefaultTriggerFunction

// DefaultHealthEventsKey is the [Options.Key] that [Capture] gives the table named
// health_events when none is set: the node name of the row's health event, as the store's rows
// ({id, document: {healthevent: {nodename, ...}, ...}, created_at, ...}) hold it, so that the
// events of one node keep one unit and are read in order by one shared member. A row whose
// event spells it otherwise (healthevent.nodeName) gets the unit of its record id.
const DefaultHealthEventsKey = changelog.DefaultHealthEventsKey

// ErrInvalidConfig is wrapped by the errors of invalid names, keys, roles and lists: nothing
// was run. It is the root package's ErrInvalidConfig, so errors.Is matches either.
var ErrInvalidConfig = changelog.ErrInvalidConfig

// Options names the objects the calls of this package create and act on. Zero values take the
// same defaults as the watcher's Config. Each name is "name" or "schema.name" (letters, digits,
// _ and $), with at most one $: names are written into dollar-quoted bodies.
type Options struct {
	// ChangelogTable is the trigger-filled changelog. Default "datastore_changelog".
	ChangelogTable string
	// TokenTable holds one saved token per client. Default "resume_tokens".
	TokenTable string
	// NotifyChannel is the channel the trigger function notifies. Default "nvsentinel_changes".
	NotifyChannel string
	// FunctionName is the trigger function. Default "log_table_changes".
	FunctionName string
	// WithoutNotify makes [Capture] attach the trigger function with the argument
	// 'no_notify': it writes the changelog row and sends no NOTIFY. PostgreSQL refuses to
	// PREPARE a transaction that sent a NOTIFY, so tables written by prepared (two-phase)
	// transactions need it. Their rows are read by polling: a watcher in polling mode, or in
	// hybrid mode through its fallback poll (FallbackPollInterval); notify mode sees them only
	// at its catch-up reads. On a legacy changelog (no txid column) a row that commits behind
	// the read position is then never seen. Other calls ignore it.
	WithoutNotify bool
	// Key is the dotted path, in the row as the trigger sees it (the new row, the old one for
	// deletes, as JSON), of the value whose unit (see
	// [github.com/pgchangestream/pgchangestream.UnitOf]) [Capture] has the trigger write into
	// each changelog row, fixed when the row is written: the rows of one key stay in one unit,
	// so a member of a shared client (Config.Shared) reads them in order. Each part holds
	// letters, digits and _, at most 8 parts, e.g. "document.healthevent.nodename". A row
	// without a value at the path takes the unit of its record id. Empty: the record id, except
	// for the table named health_events, which takes [DefaultHealthEventsKey]. An existing
	// trigger with another key is an error when Key is set (the trigger must be dropped first:
	// changing a key moves its new rows to another unit), and kept as it is when Key is empty.
	// The key needs the changelog's unit column (PostgreSQL 13 and later). Other calls ignore
	// it.
	Key string
	// IgnoreReplaceable makes [RevokeWriterGrants] revoke (or, with DryRun, list) even where a
	// role that would lose its grants could replace the trigger function or rebind the capture
	// triggers (see there), for an operator who knows that role runs no DDL. Other calls
	// ignore it.
	IgnoreReplaceable bool
	// DryRun makes a call return the statements it would run, in [Result.Statements], and
	// change nothing. [Install], [Capture] and [RemoveRestrictions] then need no database (db
	// may be nil); [RestrictReads] and [RestrictTokens] still query it, to have the server quote
	// the policy's values, and [RevokeWriterGrants] still reads the catalog: they write nothing.
	DryRun bool
}

// Result is what a call did.
type Result struct {
	// Statements are the statements the call ran, in order, each one Exec call; with
	// [Options.DryRun], the statements it would run.
	Statements []string
}

const (
	// ddlLockKey is the transaction-level advisory lock taken by the table and function script
	// and by Capture, so concurrent runs do not race on the catalog.
	ddlLockKey int64 = 0x7067_6373_0000_0001
	// installLockKey is the session-level advisory lock that serializes whole Install runs,
	// including the concurrent index builds.
	installLockKey int64 = 0x7067_6373_0000_0002
	// installLockRetry is the wait between tries of installLockKey.
	installLockRetry = 200 * time.Millisecond
	// unlockTimeout bounds the release of installLockKey, which runs even after ctx is done.
	unlockTimeout = 10 * time.Second
	// alterLockTimeout bounds the wait of the txid column's ALTER TABLE for its lock, during
	// which writers of the changelog queue behind it. A run that times out is tried again
	// after alterRetry, at most alterTries times.
	alterLockTimeout = time.Second
	alterRetry       = time.Second
	alterTries       = 30
)

//go:embed *.sql
var schemaFiles embed.FS

// schemaTemplates holds the SQL templates of this directory, filled with quoted names at call
// time.
var schemaTemplates = template.Must(template.New("schema").Option("missingkey=error").
	ParseFS(schemaFiles, "*.sql"))

// renderSchema fills the named template. The templates and the shapes of their data are fixed,
// so an error here is a bug the tests catch.
func renderSchema(name string, data any) (string, error) {
	var b bytes.Buffer
	if err := schemaTemplates.ExecuteTemplate(&b, name, data); err != nil {
		return "", fmt.Errorf("render schema template %s: %w", name, err)
	}
	return strings.TrimSpace(b.String()), nil
}

// mustRenderSchema renders a template that takes no data, at package initialization.
func mustRenderSchema(name string) string {
	s, err := renderSchema(name, nil)
	if err != nil {
		panic(err)
	}
	return s
}

// checkSchemaName validates one name for the schema statements, naming field in the error.
func checkSchemaName(field, name string, check func(string) error) error {
	err := check(name)
	if err == nil && strings.Count(name, "$") > 1 {
		err = fmt.Errorf("%q holds more than one $, which could end a dollar-quoted body", name)
	}
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalidConfig, field, err)
	}
	return nil
}

// resolve fills the defaults of opts and validates every name.
func (opts Options) resolve() (Options, error) {
	opts.ChangelogTable = cmp.Or(opts.ChangelogTable, changelog.DefaultChangelogTable)
	opts.TokenTable = cmp.Or(opts.TokenTable, changelog.DefaultTokenTable)
	opts.NotifyChannel = cmp.Or(opts.NotifyChannel, changelog.DefaultNotifyChannel)
	opts.FunctionName = cmp.Or(opts.FunctionName, DefaultTriggerFunction)
	for _, f := range []struct {
		field, name string
		check       func(string) error
	}{
		{"schema.Options.ChangelogTable", opts.ChangelogTable, changelog.CheckName},
		{"schema.Options.TokenTable", opts.TokenTable, changelog.CheckName},
		{"schema.Options.NotifyChannel", opts.NotifyChannel, changelog.CheckChannel},
		{"schema.Options.FunctionName", opts.FunctionName, changelog.CheckName},
	} {
		if err := checkSchemaName(f.field, f.name, f.check); err != nil {
			return opts, err
		}
	}
	return opts, nil
}
