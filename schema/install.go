package schema

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// The queries of indexes.sql that take no names.
var (
	tryInstallLockSQL = mustRenderSchema("try_install_lock")
	installUnlockSQL  = mustRenderSchema("install_unlock")
	invalidIndexesSQL = mustRenderSchema("invalid_indexes")
	serverVersionSQL  = mustRenderSchema("server_version")
)

// changelogIndex is one index of the changelog: its template in indexes.sql and its
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
	if base == changelog.DefaultChangelogTable {
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
			return nil, fmt.Errorf("%w: schema.Options.ChangelogTable: %q is too long: "+
				"its index name %q would exceed %d bytes", ErrInvalidConfig, log, idx.name, changelog.MaxIdentifierLen)
		}
	}
	return indexes, nil
}

// installPlan is what Install runs for one Options.
type installPlan struct {
	changelog  string           // quoted changelog table
	indexes    []changelogIndex // built concurrently by statements[1:], in order
	retired    string           // the earlier txid index: kept, but dropped if left invalid
	statements []string         // the table and function script, then one build per index
}

// newInstallPlan validates opts and renders the install statements. Errors other than invalid
// names are attributed to the install.
func newInstallPlan(opts Options) (installPlan, error) {
	p, err := renderInstallPlan(opts)
	if err != nil && !errors.Is(err, ErrInvalidConfig) {
		err = fmt.Errorf("pgchangestream: install schema: %w", err)
	}
	return p, err
}

// renderInstallPlan is newInstallPlan without the attribution of errors.
func renderInstallPlan(opts Options) (installPlan, error) {
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
		changelog.TxidColumn, alterLockTimeout.String(), changelog.Quote(changelog.IncarnationTable(opts.ChangelogTable)),
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
		changelog.Quote(changelog.RangeTable(opts.ChangelogTable)), changelog.CertifiedByToken(),
		changelog.FormLegacy, changelog.FormSwitchover, changelog.FormSnapshot, changelog.FormInRows,
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

// Install creates the changelog table, the token table, their indexes and the trigger
// function that fills the changelog and notifies [Options.NotifyChannel] with
// {"id": <changelog id>, "table": <table>, "operation": "INSERT|UPDATE|DELETE"}. It is
// idempotent and keeps an existing changelog as it is (including a UUID record_id), only adding
// missing indexes, which it builds without blocking writes. Concurrent calls wait for each
// other; a call that has to build an index on a large changelog takes as long as the build. The
// trigger function runs as the changelog's owner, so writers of captured tables need no
// privilege on the changelog ([RevokeWriterGrants]). It writes only for the tables [Capture]
// listed (or that the install adopted) and for tables of the changelog's owner: another
// relation that fires it, such as a temporary table named like a captured one, makes the write
// fail with SQLSTATE 42501.
//
// Its statements, in order, each one Exec call:
//
//  1. one script of several commands, run as one implicit transaction (the simple query
//     protocol, which database/sql drivers use for Exec without arguments): a transaction-level
//     advisory lock; CREATE OR REPLACE of the unit function "<changelog>_unit" (the SQL form of
//     UnitOf in the root package); the changelog table with its indexes if the table is
//     missing; on PostgreSQL 13 and later its txid and unit columns if missing; the token table
//     if missing, and its owner_epoch column (Config.Exclusive) if missing; the dead-letter
//     table of Watcher.Process ("<changelog>_parked"), the acknowledgement rows of
//     Watcher.ProcessTx ("<changelog>_acks"), and the members ("<changelog>_members", ids from
//     "<changelog>_member_seq") and ranges ("<changelog>_ranges") of Config.Shared clients if
//     missing; the captured tables ("<changelog>_captured") if missing, adopting, when it
//     creates them, the tables whose triggers already execute the trigger function; CREATE OR
//     REPLACE of the trigger function as SECURITY DEFINER, writing only for captured tables,
//     then its search_path pinned to pg_catalog, the changelog's schema and pg_temp, its owner
//     set to the changelog's, and EXECUTE revoked from PUBLIC; CREATE OR REPLACE of the
//     retention function "<changelog>_prune" (prune.sql, the SQL form of admin's Prune);
//  2. CREATE INDEX CONCURRENTLY IF NOT EXISTS for the read index (table_name, changed_at, id),
//     named "<changelog>_stream_idx";
//  3. the same for the index of snapshot-delta reads, (table_name, txid, id, unit expression),
//     named "<changelog>_txid_unit_idx" (skipped before PostgreSQL 13);
//  4. the same for the existing schema's partial (changed_at) WHERE processed = FALSE index
//     and its (table_name, record_id) index.
//
// The concurrent builds cannot run inside a transaction block. Around these statements Install
// also holds a session-level advisory lock, and drops any of the indexes that a failed
// concurrent build left invalid before building it again; [Result.Statements] lists those
// drops too, and leaves out a build it skipped. With [Options.DryRun] it needs no database (db
// may be nil) and returns the four kinds of statements above, every build included.
func Install(ctx context.Context, db *sql.DB, opts Options) (Result, error) {
	p, err := newInstallPlan(opts)
	if err != nil {
		return Result{}, err
	}
	if opts.DryRun {
		return Result{Statements: p.statements}, nil
	}
	ran, err := p.run(ctx, db)
	if err != nil {
		return Result{Statements: ran}, fmt.Errorf("pgchangestream: install schema: %w", err)
	}
	return Result{Statements: ran}, nil
}

// run executes the plan on one connection that holds the install lock throughout. It returns
// the statements it ran.
func (p installPlan) run(ctx context.Context, db *sql.DB) ([]string, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("get a connection: %w", err)
	}
	defer func() { _ = conn.Close() }() // ErrConnDone if unlockInstall discarded it
	if err := lockInstall(ctx, conn); err != nil {
		return nil, err
	}
	defer unlockInstall(ctx, conn)
	if err := runScript(ctx, conn, p.statements[0]); err != nil {
		return nil, err
	}
	ran := []string{p.statements[0]}
	drops, err := p.dropInvalidIndexes(ctx, conn)
	ran = append(ran, drops...)
	if err != nil {
		return ran, err
	}
	var version int
	if err := conn.QueryRowContext(ctx, serverVersionSQL).Scan(&version); err != nil {
		return ran, fmt.Errorf("read server version: %w", err)
	}
	for i, stmt := range p.statements[1:] {
		if p.indexes[i].txid && version < 130000 {
			continue // no txid column before PostgreSQL 13
		}
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			return ran, fmt.Errorf("build index %s: %w", p.indexes[i].name, err)
		}
		ran = append(ran, stmt)
	}
	return ran, nil
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
		if !backoff.Sleep(ctx, alterRetry) {
			return fmt.Errorf("add the txid column: waiting for the changelog's lock: %w", ctx.Err())
		}
	}
}

// dropInvalidIndexes drops those of the plan's indexes that a failed concurrent build left
// invalid, so the builds that follow create them again, and the earlier txid index if an
// earlier release's build left it invalid (it is built no more: the unit index replaces it).
// It returns the drops it ran.
func (p installPlan) dropInvalidIndexes(ctx context.Context, conn *sql.Conn) ([]string, error) {
	rows, err := conn.QueryContext(ctx, invalidIndexesSQL, p.changelog)
	if err != nil {
		return nil, fmt.Errorf("find invalid indexes: %w", err)
	}
	defer rows.Close()
	var invalid []pgx.Identifier
	for rows.Next() {
		var schema, name string
		if err := rows.Scan(&schema, &name); err != nil {
			return nil, fmt.Errorf("find invalid indexes: %w", err)
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
		return nil, fmt.Errorf("find invalid indexes: %w", err)
	}
	var ran []string
	for _, idx := range invalid {
		stmt, err := renderSchema("drop_index", idx.Sanitize())
		if err != nil {
			return ran, err
		}
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			return ran, fmt.Errorf("drop invalid index %s: %w", idx.Sanitize(), err)
		}
		ran = append(ran, stmt)
	}
	return ran, nil
}

// lockInstall takes the session-level install lock on conn, trying again every
// installLockRetry until ctx is done. It never waits inside the server (see indexes.sql).
func lockInstall(ctx context.Context, conn *sql.Conn) error {
	for {
		var locked bool
		if err := conn.QueryRowContext(ctx, tryInstallLockSQL, installLockKey).Scan(&locked); err != nil {
			return fmt.Errorf("take install lock: %w", err)
		}
		if locked {
			return nil
		}
		if !backoff.Sleep(ctx, installLockRetry) {
			return fmt.Errorf("wait for a concurrent install: %w", ctx.Err())
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
