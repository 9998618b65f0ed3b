package schema

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// The row-level security of the changelog and the token table. Both are opt-in: nothing changes
// until a role is restricted. A restriction enables row-level security on the table with two
// kinds of policy: one permissive policy for every role, USING (true), so that roles without a
// restriction keep seeing and writing what they did, and one restrictive policy per restricted
// role, which keeps only the rows whose key (the changelog's table_name, the token table's
// client_name) is in its list. The list is a constant array in the policy, compared with the
// leakproof text equality, so the watcher's reads keep their index-range plans. The table owner
// and BYPASSRLS roles are not subject to policies, and neither is the trigger function, which
// runs as the changelog's owner.
const (
	// openPolicy is the permissive policy for every role.
	openPolicy = "pgchangestream_open"
	// rolePolicyPrefix starts the name of a restricted role's policy; the role's name follows.
	rolePolicyPrefix = "pgchangestream_role_"
	// readPolicyPrefix starts the name of a role's RestrictReads policy on the dead-letter table,
	// which also has its RestrictTokens policy; the role's name follows.
	readPolicyPrefix = "pgchangestream_read_"
)

// rolePolicySQL renders a restricted role's policy, quoting every name and value on the server
// ($1 policy, $2 table already quoted, $3 role, $4 key column, $5 the values).
const rolePolicySQL = `SELECT format('CREATE POLICY %I ON %s AS RESTRICTIVE FOR ALL TO %I USING (%I = ANY (%L::text[]))',
	$1::text, $2::text, $3::text, $4::text, $5::text[])`

// restrictReadsStatements returns the statements RestrictReads runs, in order, as one
// transaction. The values are quoted by the server, so it needs db.
func restrictReadsStatements(ctx context.Context, db *sql.DB, role string, tables []string, opts Options) ([]string, error) {
	opts, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	for _, t := range tables {
		if err := changelog.CheckChannel(t); err != nil { // one identifier: table_name holds no schema
			return nil, fmt.Errorf("%w: schema.RestrictReads table: %v", ErrInvalidConfig, err)
		}
	}
	var stmts []string
	for _, t := range valueTables(opts) {
		s, err := restrictSQL(ctx, db, t.table, "table_name", t.prefix, role, tables)
		if err != nil {
			return nil, err
		}
		stmts = append(stmts, s...)
	}
	return stmts, nil
}

// policyTable is a table a restriction puts a policy on, and the prefix of that policy's name.
type policyTable struct{ table, prefix string }

// valueTables are the tables that hold captured tables' values, by table_name: the changelog and
// Process's dead-letter table (each parked event in full). The dead-letter table's policy has a
// name of its own, as RestrictTokens puts one there too.
func valueTables(opts Options) []policyTable {
	return []policyTable{{opts.ChangelogTable, rolePolicyPrefix}, {changelog.ParkedTable(opts.ChangelogTable), readPolicyPrefix}}
}

// RestrictReads limits role (and the roles that are members of it) to the changelog rows of
// tables (unqualified names, as the changelog's table_name holds them): its watchers stream
// only those tables, and it can neither read nor mark the other tables' rows. The same holds for
// the dead-letter table of Watcher.Process, which holds parked events in full: the role reads,
// parks, releases and drops only those tables' events there. Calling it again replaces the list.
// [RemoveRestrictions] lifts it. Other roles are unaffected. Run it as the changelog's owner; it
// takes the changelog's and the dead-letter table's ACCESS EXCLUSIVE locks for a moment, waiting
// at most one second for each.
//
// Its statements run in one transaction. The policy's values are quoted by the server, so
// even with [Options.DryRun] it queries db (it writes nothing then).
func RestrictReads(ctx context.Context, db *sql.DB, role string, tables []string, opts Options) (Result, error) {
	stmts, err := restrictReadsStatements(ctx, db, role, tables, opts)
	if err != nil {
		return Result{}, err
	}
	return runInTx(ctx, db, stmts, opts.DryRun, "restrict reads of "+role)
}

// restrictTokensStatements returns the statements RestrictTokens runs, in order, as one
// transaction. The values are quoted by the server, so it needs db.
func restrictTokensStatements(ctx context.Context, db *sql.DB, role string, clients []string, opts Options) ([]string, error) {
	opts, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	for _, c := range clients {
		if c == "" || strings.ContainsRune(c, 0) {
			return nil, fmt.Errorf("%w: schema.RestrictTokens client: %q is not a client name", ErrInvalidConfig, c)
		}
	}
	var stmts []string
	for _, table := range clientTables(opts) {
		s, err := restrictSQL(ctx, db, table, "client_name", rolePolicyPrefix, role, clients)
		if err != nil {
			return nil, err
		}
		stmts = append(stmts, s...)
	}
	return stmts, nil
}

// clientTables are the tables whose rows belong to one client each, by client_name: the token
// table, Process's dead-letter table and acknowledgement rows, and shared clients' members and
// ranges.
func clientTables(opts Options) []string {
	return []string{opts.TokenTable, changelog.ParkedTable(opts.ChangelogTable), changelog.AckTable(opts.ChangelogTable),
		changelog.MemberTable(opts.ChangelogTable), changelog.RangeTable(opts.ChangelogTable)}
}

// RestrictTokens limits role (and its members) to the token rows of clients: it can read, save,
// fence and delete only their tokens, so it cannot move another client's position, which
// admin.Prune trusts. The same holds for the clients' rows of the dead-letter table and of the
// acknowledgement rows of transactional handlers, by which another client's events could be
// parked, released or marked done, and of the members and ranges of shared clients, by which
// another client's ranges could be taken or their saved positions moved. Calling it again
// replaces the list; [RemoveRestrictions] lifts it. Other roles are unaffected; run
// administration (the admin package's ResetToken and Prune) as the token table's owner or a
// BYPASSRLS role. Run it as the token table's owner.
//
// Its statements run in one transaction. The policy's values are quoted by the server, so
// even with [Options.DryRun] it queries db (it writes nothing then).
func RestrictTokens(ctx context.Context, db *sql.DB, role string, clients []string, opts Options) (Result, error) {
	stmts, err := restrictTokensStatements(ctx, db, role, clients, opts)
	if err != nil {
		return Result{}, err
	}
	return runInTx(ctx, db, stmts, opts.DryRun, "restrict tokens of "+role)
}

// RemoveRestrictions drops role's policies on the changelog, the dead-letter table and the
// client tables (see [RestrictReads], [RestrictTokens]): it sees and writes again what
// unrestricted roles do. Row-level security stays enabled, with the open policy. Its
// statements run in one transaction; with [Options.DryRun] it needs no database (db may be
// nil).
func RemoveRestrictions(ctx context.Context, db *sql.DB, role string, opts Options) (Result, error) {
	opts, err := opts.resolve()
	if err != nil {
		return Result{}, err
	}
	var policies []policyTable
	policies = append(policies, valueTables(opts)...)
	for _, table := range clientTables(opts) {
		policies = append(policies, policyTable{table, rolePolicyPrefix})
	}
	var stmts []string
	for _, p := range policies {
		name, err := rolePolicy(p.prefix, role)
		if err != nil {
			return Result{}, err
		}
		stmts = append(stmts, `DROP POLICY IF EXISTS `+pgx.Identifier{name}.Sanitize()+` ON `+changelog.Quote(p.table))
	}
	return runInTx(ctx, db, stmts, opts.DryRun, "remove restrictions of "+role)
}

// rolePolicy returns the name of role's policy whose name starts with prefix.
func rolePolicy(prefix, role string) (string, error) {
	name := prefix + role
	switch {
	case role == "" || strings.ContainsRune(role, 0):
		return "", fmt.Errorf("%w: role: %q is not a role name", ErrInvalidConfig, role)
	case len(name) > changelog.MaxIdentifierLen:
		return "", fmt.Errorf("%w: role: %q is too long: its policy name %q would exceed %d bytes",
			ErrInvalidConfig, role, name, changelog.MaxIdentifierLen)
	}
	return name, nil
}

// restrictSQL returns the statements that restrict role to the rows of table whose column is one
// of values, by its policy named with prefix.
func restrictSQL(ctx context.Context, db *sql.DB, table, column, prefix, role string, values []string) ([]string, error) {
	name, err := rolePolicy(prefix, role)
	if err != nil {
		return nil, err
	}
	if len(values) == 0 {
		return nil, fmt.Errorf("%w: no %s given for role %q (RemoveRestrictions lifts a restriction)",
			ErrInvalidConfig, column, role)
	}
	tbl := changelog.Quote(table)
	var create string
	if err := db.QueryRowContext(ctx, rolePolicySQL, name, tbl, role, column, values).Scan(&create); err != nil {
		return nil, fmt.Errorf("render the policy of %s: %w", role, err)
	}
	open := pgx.Identifier{openPolicy}.Sanitize()
	return []string{
		`SET LOCAL lock_timeout = '` + alterLockTimeout.String() + `'`,
		`ALTER TABLE ` + tbl + ` ENABLE ROW LEVEL SECURITY`,
		`DROP POLICY IF EXISTS ` + open + ` ON ` + tbl,
		`CREATE POLICY ` + open + ` ON ` + tbl + ` AS PERMISSIVE FOR ALL TO PUBLIC USING (true) WITH CHECK (true)`,
		`DROP POLICY IF EXISTS ` + pgx.Identifier{name}.Sanitize() + ` ON ` + tbl,
		create,
	}, nil
}

// runInTx runs stmts in one transaction, unless dryRun or there are none, and returns them.
func runInTx(ctx context.Context, db *sql.DB, stmts []string, dryRun bool, what string) (Result, error) {
	if dryRun || len(stmts) == 0 {
		return Result{Statements: stmts}, nil
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return Result{}, fmt.Errorf("pgchangestream: %s: %w", what, err)
	}
	for _, stmt := range stmts {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			_ = tx.Rollback()
			return Result{}, fmt.Errorf("pgchangestream: %s: %w", what, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return Result{}, fmt.Errorf("pgchangestream: %s: %w", what, err)
	}
	return Result{Statements: stmts}, nil
}

// writerGrantsSQL lists the old writer grants held by roles other than the owner: INSERT on the
// changelog ($1), SELECT on its id column (which the trigger's INSERT ... RETURNING id needed),
// and USAGE or UPDATE on its id sequence. Each row is: PUBLIC (grantee 0), the role, the
// privilege and object kind of the REVOKE, and the object's schema and name.
const writerGrantsSQL = `WITH cl AS (SELECT oid, relowner, pg_get_serial_sequence($1, 'id')::regclass::oid AS seq
	FROM pg_class WHERE oid = to_regclass($1)),
acl AS (
	SELECT 1 AS ord, cl.oid AS rel, 'INSERT ON TABLE' AS what, a.grantee
	FROM cl JOIN pg_class c ON c.oid = cl.oid CROSS JOIN LATERAL aclexplode(c.relacl) a
	WHERE a.privilege_type = 'INSERT'
	UNION
	SELECT 2, cl.oid, 'SELECT (id) ON TABLE', a.grantee
	FROM cl JOIN pg_attribute t ON t.attrelid = cl.oid AND t.attname = 'id' CROSS JOIN LATERAL aclexplode(t.attacl) a
	WHERE a.privilege_type = 'SELECT'
	UNION
	SELECT 3, cl.seq, 'USAGE, UPDATE ON SEQUENCE', a.grantee
	FROM cl JOIN pg_class c ON c.oid = cl.seq CROSS JOIN LATERAL aclexplode(c.relacl) a
	WHERE a.privilege_type IN ('USAGE', 'UPDATE'))
SELECT acl.grantee = 0, COALESCE(r.rolname, ''), acl.what, n.nspname, c.relname
FROM acl JOIN cl ON acl.grantee <> cl.relowner JOIN pg_class c ON c.oid = acl.rel
JOIN pg_namespace n ON n.oid = c.relnamespace LEFT JOIN pg_roles r ON r.oid = acl.grantee
ORDER BY acl.ord, 2`

// revokeFunctionsSQL reads the state (changelog.FunctionColumns) of the trigger function ($2, "name()")
// and of every function of its name ($3) without arguments that a trigger calls: one that
// other DDL created in another schema, which the triggers that DDL created call instead.
const revokeFunctionsSQL = changelog.SchemaCTE + `
SELECT ` + changelog.FunctionColumns + `
FROM cl, pg_catalog.pg_proc p
WHERE p.oid = to_regprocedure($2) OR (p.proname = $3 AND p.pronargs = 0
	AND EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgfoid = p.oid AND NOT t.tgisinternal))
ORDER BY 1`

// replaceableSQL says how the role $1 could undo the trigger function ($2, "name()") that
// writers rely on once their grants are gone, the way a service's start-up DDL does (CREATE OR
// REPLACE FUNCTION, then DROP TRIGGER and CREATE TRIGGER on the function its search_path finds),
// or returns NULL: it is a superuser; or it has the privileges of the function's owner, which
// CREATE OR REPLACE FUNCTION needs; or it has those of the owner of a table whose trigger calls
// the function, which DROP TRIGGER needs, and may create objects in another schema, where its own
// function of that name can land ahead of this one.
const replaceableSQL = `SELECT CASE
	WHEN r.rolsuper THEN 'is a superuser'
	WHEN pg_has_role(r.oid, p.proowner, 'USAGE') THEN format(
		'has the privileges of role %I, the owner of %s, so it can replace the function (CREATE OR REPLACE FUNCTION)',
		o.rolname, p.oid::regprocedure)
	WHEN tc.oid IS NOT NULL AND sn.nspname IS NOT NULL THEN format(
		'has the privileges of the owner of %s, whose trigger calls %s, and may create in schema %I, so it can drop the '
		'trigger and create it again on a function of that name of its own (DROP TRIGGER, CREATE FUNCTION, CREATE TRIGGER)',
		tc.oid::regclass, p.oid::regprocedure, sn.nspname)
	END
FROM pg_catalog.pg_roles r CROSS JOIN pg_catalog.pg_proc p JOIN pg_catalog.pg_roles o ON o.oid = p.proowner
LEFT JOIN LATERAL (SELECT c.oid FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
	WHERE t.tgfoid = p.oid AND NOT t.tgisinternal AND pg_has_role(r.oid, c.relowner, 'USAGE')
	ORDER BY c.oid LIMIT 1) tc ON true
LEFT JOIN LATERAL (SELECT n.nspname FROM pg_catalog.pg_namespace n
	WHERE n.oid <> p.pronamespace AND n.nspname NOT LIKE 'pg\_%' AND n.nspname <> 'information_schema'
		AND has_schema_privilege(r.oid, n.oid, 'CREATE')
	ORDER BY n.nspname LIMIT 1) sn ON true
WHERE r.rolname = $1 AND p.oid = to_regprocedure($2)`

// RevokeWriterGrants takes the old writer grants away: INSERT on the changelog, SELECT on its
// id column and USAGE, UPDATE on its id sequence, from every role other than the owner that
// holds them, by REVOKE statements run in one transaction. Writers need neither once [Install]
// has made the trigger function run as the changelog's owner. A role that inserts changelog rows
// itself, bypassing the trigger, loses that too, which is the point. It reads the catalog to
// find the grants even with [Options.DryRun], which returns the statements to review (none if
// there is nothing to revoke) and writes nothing.
//
// It returns an error, revoking nothing, where revoking would break writes, now or at the next
// DDL of the services that write the captured tables:
//   - the trigger function, or a function of its name that a trigger calls, is not the one
//     Install installs (not SECURITY DEFINER, search_path not pinned, a body that ignores
//     the trigger arguments): Install never ran, or other DDL replaced it since. Re-apply
//     the schema first. No option overrides this.
//   - a role that would lose its grants can undo the function: it is a superuser; or it has
//     the privileges of the function's owner, so it can replace the function, as a service's
//     start-up running CREATE OR REPLACE FUNCTION as that role does; or it has the privileges of
//     the owner of a captured table (it can drop and create its trigger) and may create objects
//     in a schema other than the function's (its own function of that name can come first on
//     its search_path). [Options.IgnoreReplaceable] overrides this, for an operator who
//     knows that role runs no such DDL.
func RevokeWriterGrants(ctx context.Context, db *sql.DB, opts Options) (Result, error) {
	stmts, err := revokeStatements(ctx, db, opts)
	if err != nil {
		return Result{}, err
	}
	return runInTx(ctx, db, stmts, opts.DryRun, "revoke the writer grants")
}

// revokeStatements returns the statements RevokeWriterGrants runs, after its checks.
func revokeStatements(ctx context.Context, db *sql.DB, opts Options) ([]string, error) {
	opts, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	fn := changelog.Quote(opts.FunctionName) + "()"
	if err := checkRevokeFunctions(ctx, db, opts, fn); err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, writerGrantsSQL, changelog.Quote(opts.ChangelogTable))
	if err != nil {
		return nil, fmt.Errorf("pgchangestream: read grants of %s: %w", opts.ChangelogTable, err)
	}
	defer rows.Close()
	var (
		stmts []string
		roles []string
	)
	for rows.Next() {
		var (
			public                 bool
			role, what, nsp, table string
		)
		if err := rows.Scan(&public, &role, &what, &nsp, &table); err != nil {
			return nil, fmt.Errorf("pgchangestream: read grants of %s: %w", opts.ChangelogTable, err)
		}
		grantee := "PUBLIC"
		if !public {
			grantee = pgx.Identifier{role}.Sanitize()
			if !slices.Contains(roles, role) {
				roles = append(roles, role)
			}
		}
		stmts = append(stmts, "REVOKE "+what+" "+pgx.Identifier{nsp, table}.Sanitize()+" FROM "+grantee)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgchangestream: read grants of %s: %w", opts.ChangelogTable, err)
	}
	if opts.IgnoreReplaceable {
		return stmts, nil
	}
	for _, role := range roles {
		var how sql.NullString
		if err := db.QueryRowContext(ctx, replaceableSQL, role, fn).Scan(&how); err != nil {
			return nil, fmt.Errorf("pgchangestream: check whether role %s can replace trigger function %s: %w", role, fn, err)
		}
		if how.Valid {
			return nil, fmt.Errorf("pgchangestream: not revoking the writer grants: role %s %s; DDL run as that role, "+
				"such as a service's start-up that creates its trigger function and triggers, would make writes without "+
				"the grants fail (\"permission denied for table %s\"). Take that ability away from %s, or, if it runs no "+
				"such DDL, set schema.Options.IgnoreReplaceable (grants revoke-writers --ignore-replaceable)",
				pgx.Identifier{role}.Sanitize(), how.String, opts.ChangelogTable, pgx.Identifier{role}.Sanitize())
		}
	}
	return stmts, nil
}

// checkRevokeFunctions returns an error unless the trigger function fn and every function of
// its name that a trigger calls are the ones Install installs.
func checkRevokeFunctions(ctx context.Context, db *sql.DB, opts Options, fn string) error {
	rows, err := db.QueryContext(ctx, revokeFunctionsSQL, changelog.Quote(opts.ChangelogTable), fn,
		changelog.Unqualified(opts.FunctionName))
	if err != nil {
		return fmt.Errorf("pgchangestream: read trigger function %s: %w", fn, err)
	}
	defer rows.Close()
	found := false
	for rows.Next() {
		var f changelog.FunctionState
		if err := rows.Scan(f.ScanDest()...); err != nil {
			return fmt.Errorf("pgchangestream: read trigger function %s: %w", fn, err)
		}
		found = true
		if p := f.Problem(); p != "" {
			return fmt.Errorf("pgchangestream: not revoking the writer grants: %s (schema.Install never ran, or other DDL "+
				"replaced it since, %s), and writes without the grants would fail: %s, then check again", p, changelog.ReplacedBy, changelog.RepairHint)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pgchangestream: read trigger function %s: %w", fn, err)
	}
	if !found {
		return fmt.Errorf("pgchangestream: trigger function %s does not exist: run schema.Install first, "+
			"writers still need their grants", fn)
	}
	return nil
}
