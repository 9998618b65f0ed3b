package pgchangestream

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"strings"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// DefaultTriggerFunction is the default [SchemaOptions.FunctionName]. It is the existing schema's
// name, so triggers that already call it pick up the function [InstallSchema] writes.
const DefaultTriggerFunction = changelog.DefaultTriggerFunction

// SchemaOptions names the objects [InstallSchema] and [CaptureChanges] create. Zero values take
// the same defaults as [Config]. Each name is "name" or "schema.name" (letters, digits, _ and $),
// with at most one $: names are written into dollar-quoted bodies.
type SchemaOptions struct {
	// ChangelogTable is the trigger-filled changelog. Default "datastore_changelog".
	ChangelogTable string
	// TokenTable holds one saved token per client. Default "resume_tokens".
	TokenTable string
	// NotifyChannel is the channel the trigger function notifies. Default "nvsentinel_changes".
	NotifyChannel string
	// FunctionName is the trigger function. Default "log_table_changes".
	FunctionName string
	// WithoutNotify makes [CaptureChanges] attach the trigger function with the argument
	// 'no_notify': it writes the changelog row and sends no NOTIFY. PostgreSQL refuses to
	// PREPARE a transaction that sent a NOTIFY, so tables written by prepared (two-phase)
	// transactions need it. Their rows are read by polling: a watcher in polling mode, or in
	// hybrid mode through its fallback poll (FallbackPollInterval); notify mode sees them only
	// at its catch-up reads. On a legacy changelog (no txid column) a row that commits behind
	// the read position is then never seen. [InstallSchema] ignores it.
	WithoutNotify bool
	// Key is the dotted path, in the row as the trigger sees it (the new row, the old one for
	// deletes, as JSON), of the value whose unit (see [UnitOf]) [CaptureChanges] has the trigger
	// write into each changelog row, fixed when the row is written: the rows of one key stay in
	// one unit, so a member of a [Config.Shared] client reads them in order. Each part holds
	// letters, digits and _, at most 8 parts, e.g. "document.healthevent.nodename". A row
	// without a value at the path takes the unit of its record id. Empty: the record id, except
	// for the table named health_events, which takes [DefaultHealthEventsKey]. An existing
	// trigger with another key is an error when Key is set (the trigger must be dropped first:
	// changing a key moves its new rows to another unit), and kept as it is when Key is empty.
	// The key needs the changelog's unit column (PostgreSQL 13 and later). [InstallSchema]
	// ignores it.
	Key string
	// IgnoreReplaceable makes [RevokeWriterGrantsSQL] list the revokes even where a role that
	// would lose its grants could replace the trigger function or rebind the capture triggers
	// (see there), for an operator who knows that role runs no DDL. Other functions ignore it.
	IgnoreReplaceable bool
}

const (
	// ddlLockKey is the transaction-level advisory lock taken by the table and function script
	// and by CaptureChanges, so concurrent runs do not race on the catalog.
	ddlLockKey int64 = 0x7067_6373_0000_0001
	// installLockKey is the session-level advisory lock that serializes whole InstallSchema
	// runs, including the concurrent index builds.
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

//go:embed schema/*.sql
var schemaFiles embed.FS

// schemaTemplates holds the SQL templates of schema/, filled with quoted names at call time.
var schemaTemplates = template.Must(template.New("schema").Option("missingkey=error").
	ParseFS(schemaFiles, "schema/*.sql"))

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

// The queries of schema/indexes.sql that take no names.
var (
	tryInstallLockSQL = mustRenderSchema("try_install_lock")
	installUnlockSQL  = mustRenderSchema("install_unlock")
	invalidIndexesSQL = mustRenderSchema("invalid_indexes")
	serverVersionSQL  = mustRenderSchema("server_version")
)

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
func (opts SchemaOptions) resolve() (SchemaOptions, error) {
	opts.ChangelogTable = cmp.Or(opts.ChangelogTable, DefaultChangelogTable)
	opts.TokenTable = cmp.Or(opts.TokenTable, DefaultTokenTable)
	opts.NotifyChannel = cmp.Or(opts.NotifyChannel, DefaultNotifyChannel)
	opts.FunctionName = cmp.Or(opts.FunctionName, DefaultTriggerFunction)
	for _, f := range []struct {
		field, name string
		check       func(string) error
	}{
		{"SchemaOptions.ChangelogTable", opts.ChangelogTable, changelog.CheckName},
		{"SchemaOptions.TokenTable", opts.TokenTable, changelog.CheckName},
		{"SchemaOptions.NotifyChannel", opts.NotifyChannel, changelog.CheckChannel},
		{"SchemaOptions.FunctionName", opts.FunctionName, changelog.CheckName},
	} {
		if err := checkSchemaName(f.field, f.name, f.check); err != nil {
			return opts, err
		}
	}
	return opts, nil
}

// changelogIndex is one index of the changelog: its template in schema/indexes.sql and its
// unqualified name.
type changelogIndex struct {
	template, name string
	txid           bool // on the txid column: PostgreSQL 13 and later only
}

// changelogIndexes returns the indexes of the changelog table, the read index first. The
// default changelog keeps the existing schema's names for the two indexes it already has;
// other changelogs get names derived from theirs, so two changelogs in one schema do not clash.
func changelogIndexes(log string) ([]changelogIndex, error) {
	base := changelog.Unqualified(log)
	unprocessed, tableRecord := base+"_unprocessed_idx", base+"_table_record_idx"
	if base == DefaultChangelogTable {
		unprocessed, tableRecord = "idx_changelog_unprocessed", "idx_changelog_table_record"
	}
	indexes := []changelogIndex{
		{"stream_index", base + "_stream_idx", false},
		{"txid_unit_index", base + "_txid_unit_idx", true},
		{"unprocessed_index", unprocessed, false},
		{"table_record_index", tableRecord, false},
	}
	for _, idx := range indexes {
		if len(idx.name) > changelog.MaxIdentifierLen {
			return nil, fmt.Errorf("%w: SchemaOptions.ChangelogTable: %q is too long: "+
				"its index name %q would exceed %d bytes", ErrInvalidConfig, log, idx.name, changelog.MaxIdentifierLen)
		}
	}
	return indexes, nil
}

// installPlan is what InstallSchema runs for one SchemaOptions.
type installPlan struct {
	changelog  string           // quoted changelog table
	indexes    []changelogIndex // built concurrently by statements[1:], in order
	retired    string           // the earlier txid index: kept, but dropped if left invalid
	statements []string         // the table and function script, then one build per index
}

// newInstallPlan validates opts and renders the install statements. Errors other than invalid
// names are attributed to the install.
func newInstallPlan(opts SchemaOptions) (installPlan, error) {
	p, err := renderInstallPlan(opts)
	if err != nil && !errors.Is(err, ErrInvalidConfig) {
		err = fmt.Errorf("pgchangestream: install schema: %w", err)
	}
	return p, err
}

// renderInstallPlan is newInstallPlan without the attribution of errors.
func renderInstallPlan(opts SchemaOptions) (installPlan, error) {
	opts, err := opts.resolve()
	if err != nil {
		return installPlan{}, err
	}
	indexes, err := changelogIndexes(opts.ChangelogTable)
	if err != nil {
		return installPlan{}, err
	}
	p := installPlan{changelog: changelog.Quote(opts.ChangelogTable), indexes: indexes,
		retired: changelog.Unqualified(opts.ChangelogTable) + "_txid_idx"}
	createIndex := func(idx changelogIndex, create string) (string, error) {
		return renderSchema(idx.template, struct{ Create, Name, Changelog, Unit string }{
			create, changelog.Quote(idx.name), p.changelog, changelog.UnitExpression(opts.ChangelogTable),
		})
	}
	var inTx, txidInTx, concurrent []string
	for _, idx := range indexes {
		plain, err := createIndex(idx, "CREATE INDEX")
		if err != nil {
			return installPlan{}, err
		}
		built, err := createIndex(idx, "CREATE INDEX CONCURRENTLY")
		if err != nil {
			return installPlan{}, err
		}
		if idx.txid {
			txidInTx = append(txidInTx, plain)
		} else {
			inTx = append(inTx, plain)
		}
		concurrent = append(concurrent, built)
	}
	script, err := renderSchema("install.sql", struct {
		LockKey                                                    int64
		Changelog, ChangelogLiteral, TokenTable, Function, Channel string
		Indexes, TxidIndexes                                       []string
		TxidColumn, LockTimeout, Incarnation                       string
		TokenTableLiteral, EpochColumn, FunctionLiteral            string
		Parked, ParkedIndex, Acks                                  string
		UnitFunction, UnitColumn, KeyPrefix                        string
		MemberSequence, Members, Ranges                            string
		Captured, CapturedLiteral                                  string
	}{
		ddlLockKey, p.changelog, changelog.QuoteLiteral(p.changelog), changelog.Quote(opts.TokenTable),
		changelog.Quote(opts.FunctionName), changelog.QuoteLiteral(opts.NotifyChannel), inTx, txidInTx,
		txidColumn, alterLockTimeout.String(), changelog.Quote(changelog.IncarnationTable(opts.ChangelogTable)),
		changelog.QuoteLiteral(changelog.Quote(opts.TokenTable)), changelog.EpochColumn,
		changelog.QuoteLiteral(changelog.Quote(opts.FunctionName) + "()"),
		changelog.Quote(changelog.ParkedTable(opts.ChangelogTable)), changelog.Quote(changelog.Unqualified(changelog.ParkedTable(opts.ChangelogTable)) + "_key_idx"),
		changelog.Quote(changelog.AckTable(opts.ChangelogTable)),
		changelog.Quote(changelog.UnitFunction(opts.ChangelogTable)), changelog.UnitColumn, keyArgPrefix,
		changelog.Quote(changelog.MemberSequence(opts.ChangelogTable)), changelog.Quote(changelog.MemberTable(opts.ChangelogTable)),
		changelog.Quote(changelog.RangeTable(opts.ChangelogTable)),
		changelog.Quote(changelog.CapturedTable(opts.ChangelogTable)), changelog.QuoteLiteral(changelog.Quote(changelog.CapturedTable(opts.ChangelogTable))),
	})
	if err != nil {
		return installPlan{}, err
	}
	tokenTable := changelog.Quote(opts.TokenTable)
	prune, err := renderSchema("prune_function", struct {
		Function, Changelog, TokenTable, Ranges, Certified string
		Legacy, Switchover, Snapshot, InRows               string
		Restricted, Refusal, TokenTableLiteral             string
		DefaultBatch                                       int
	}{
		changelog.Quote(changelog.PruneFunction(opts.ChangelogTable)), p.changelog, tokenTable,
		changelog.Quote(changelog.RangeTable(opts.ChangelogTable)), changelog.CertifiedByToken(), changelog.FormLegacy, changelog.FormSwitchover, changelog.FormSnapshot, changelog.FormInRows,
		changelog.RestrictedTokens("to_regclass(" + changelog.QuoteLiteral(tokenTable) + ")"),
		changelog.QuoteLiteral(strings.ReplaceAll(changelog.RestrictedTokensMessage, "%s", "%")), changelog.QuoteLiteral(tokenTable),
		changelog.DefaultPruneBatch,
	})
	if err != nil {
		return installPlan{}, err
	}
	p.statements = append([]string{script + "\n\n" + prune + ";"}, concurrent...)
	return p, nil
}

// InstallSchemaSQL returns the statements [InstallSchema] runs, in order, each one Exec call:
//
//  1. one script of several commands, run as one implicit transaction (the simple query
//     protocol, which database/sql drivers use for Exec without arguments): a transaction-level
//     advisory lock; CREATE OR REPLACE of the unit function "<changelog>_unit" (the SQL form of
//     [UnitOf]); the changelog table with its indexes if the table is missing; on PostgreSQL 13
//     and later its txid and unit columns if missing; the token table if missing, and its
//     owner_epoch column (Config.Exclusive) if missing; the dead-letter table of
//     [Watcher.Process] ("<changelog>_parked"), the acknowledgement rows of [Watcher.ProcessTx]
//     ("<changelog>_acks"), and the members ("<changelog>_members", ids from
//     "<changelog>_member_seq") and ranges ("<changelog>_ranges") of [Config.Shared] clients if
//     missing; the captured tables ("<changelog>_captured") if missing, adopting, when it creates
//     them, the tables whose triggers already execute the trigger function; CREATE OR REPLACE of
//     the trigger function as SECURITY DEFINER, writing only for captured tables, then its
//     search_path pinned to pg_catalog, the changelog's schema and pg_temp, its owner set to the
//     changelog's, and EXECUTE revoked from PUBLIC; CREATE OR REPLACE of the retention function "<changelog>_prune"
//     (schema/prune.sql, the SQL form of admin.Prune);
//  2. CREATE INDEX CONCURRENTLY IF NOT EXISTS for the read index (table_name, changed_at, id),
//     named "<changelog>_stream_idx";
//  3. the same for the index of snapshot-delta reads, (table_name, txid, id, unit expression),
//     named "<changelog>_txid_unit_idx" (skipped before PostgreSQL 13);
//  4. the same for the existing schema's partial (changed_at) WHERE processed = FALSE index
//     and its (table_name, record_id) index.
//
// The concurrent builds cannot run inside a transaction block. Around these statements
// InstallSchema also holds a session-level advisory lock, and drops any of the indexes that a
// failed concurrent build left invalid before building it again.
func InstallSchemaSQL(opts SchemaOptions) ([]string, error) {
	p, err := newInstallPlan(opts)
	if err != nil {
		return nil, err
	}
	return p.statements, nil
}

// InstallSchema creates the changelog table, the token table, their indexes and the trigger
// function that fills the changelog and notifies [SchemaOptions.NotifyChannel] with
// {"id": <changelog id>, "table": <table>, "operation": "INSERT|UPDATE|DELETE"}. It runs
// [InstallSchemaSQL]'s statements. It is idempotent and keeps an existing changelog as it is
// (including a UUID record_id), only adding missing indexes, which it builds without blocking
// writes. Concurrent calls wait for each other; a call that has to build an index on a large
// changelog takes as long as the build. The trigger function runs as the changelog's owner, so
// writers of captured tables need no privilege on the changelog ([RevokeWriterGrantsSQL]). It writes
// only for the tables [CaptureChanges] listed (or that the install adopted) and for tables of the
// changelog's owner: another relation that fires it, such as a temporary table named like a
// captured one, makes the write fail with SQLSTATE 42501.
func InstallSchema(ctx context.Context, db *sql.DB, opts SchemaOptions) error {
	p, err := newInstallPlan(opts)
	if err != nil {
		return err
	}
	if err := p.run(ctx, db); err != nil {
		return fmt.Errorf("pgchangestream: install schema: %w", err)
	}
	return nil
}

// run executes the plan on one connection that holds the install lock throughout.
func (p installPlan) run(ctx context.Context, db *sql.DB) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("get a connection: %w", err)
	}
	defer func() { _ = conn.Close() }() // ErrConnDone if unlockInstall discarded it
	if err := lockInstall(ctx, conn); err != nil {
		return err
	}
	defer unlockInstall(ctx, conn)
	if err := runScript(ctx, conn, p.statements[0]); err != nil {
		return err
	}
	if err := p.dropInvalidIndexes(ctx, conn); err != nil {
		return err
	}
	var version int
	if err := conn.QueryRowContext(ctx, serverVersionSQL).Scan(&version); err != nil {
		return fmt.Errorf("read server version: %w", err)
	}
	for i, stmt := range p.statements[1:] {
		if p.indexes[i].txid && version < 130000 {
			continue // no txid column before PostgreSQL 13
		}
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("build index %s: %w", p.indexes[i].name, err)
		}
	}
	return nil
}

// runScript runs the table and function script, trying again while the txid column's ALTER
// TABLE times out waiting for its lock (transactions using the changelog hold it back).
func runScript(ctx context.Context, conn *sql.Conn, script string) error {
	for try := 1; ; try++ {
		_, err := conn.ExecContext(ctx, script)
		if err == nil || !changelog.HasCode(err, changelog.LockNotAvailable) || try == alterTries {
			if err != nil {
				return fmt.Errorf("create tables and trigger function: %w", err)
			}
			return nil
		}
		if !sleepCtx(ctx, alterRetry) {
			return fmt.Errorf("add the txid column: waiting for the changelog's lock: %w", ctx.Err())
		}
	}
}

// dropInvalidIndexes drops those of the plan's indexes that a failed concurrent build left
// invalid, so the builds that follow create them again, and the earlier txid index if an
// earlier release's build left it invalid (it is built no more: the unit index replaces it).
func (p installPlan) dropInvalidIndexes(ctx context.Context, conn *sql.Conn) error {
	rows, err := conn.QueryContext(ctx, invalidIndexesSQL, p.changelog)
	if err != nil {
		return fmt.Errorf("find invalid indexes: %w", err)
	}
	defer rows.Close()
	var invalid []pgx.Identifier
	for rows.Next() {
		var schema, name string
		if err := rows.Scan(&schema, &name); err != nil {
			return fmt.Errorf("find invalid indexes: %w", err)
		}
		if name == p.retired {
			invalid = append(invalid, pgx.Identifier{schema, name})
		}
		for _, idx := range p.indexes {
			if idx.name == name {
				invalid = append(invalid, pgx.Identifier{schema, name})
			}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("find invalid indexes: %w", err)
	}
	for _, idx := range invalid {
		stmt, err := renderSchema("drop_index", idx.Sanitize())
		if err != nil {
			return err
		}
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("drop invalid index %s: %w", idx.Sanitize(), err)
		}
	}
	return nil
}

// lockInstall takes the session-level install lock on conn, trying again every
// installLockRetry until ctx is done. It never waits inside the server (see
// schema/indexes.sql).
func lockInstall(ctx context.Context, conn *sql.Conn) error {
	for {
		var locked bool
		if err := conn.QueryRowContext(ctx, tryInstallLockSQL, installLockKey).Scan(&locked); err != nil {
			return fmt.Errorf("take install lock: %w", err)
		}
		if locked {
			return nil
		}
		t := time.NewTimer(installLockRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("wait for a concurrent install: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// unlockInstall releases the install lock. If that fails, it discards the connection, which
// releases the lock too: a pooled connection must not keep it.
func unlockInstall(ctx context.Context, conn *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
	defer cancel()
	var released bool
	err := conn.QueryRowContext(ctx, installUnlockSQL, installLockKey).Scan(&released)
	if err != nil || !released {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	}
}
