package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
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
)

// rolePolicySQL renders a restricted role's policy, quoting every name and value on the server
// ($1 policy, $2 table already quoted, $3 role, $4 key column, $5 the values).
const rolePolicySQL = `SELECT format('CREATE POLICY %I ON %s AS RESTRICTIVE FOR ALL TO %I USING (%I = ANY (%L::text[]))',
	$1::text, $2::text, $3::text, $4::text, $5::text[])`

// RestrictReadsSQL returns the statements [RestrictReads] runs, in order, as one transaction.
// The values are quoted by the server, so it needs db.
func RestrictReadsSQL(ctx context.Context, db *sql.DB, role string, tables []string, opts SchemaOptions) ([]string, error) {
	opts, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	for _, t := range tables {
		if err := checkChannel(t); err != nil { // one identifier: table_name holds no schema
			return nil, fmt.Errorf("%w: RestrictReads table: %v", ErrInvalidConfig, err)
		}
	}
	return restrictSQL(ctx, db, opts.ChangelogTable, "table_name", role, tables)
}

// RestrictReads limits role (and the roles that are members of it) to the changelog rows of
// tables (unqualified names, as the changelog's table_name holds them): its watchers stream
// only those tables, and it can neither read nor mark the other tables' rows. Calling it again
// replaces the list. [RemoveRestrictions] lifts it. Other roles are unaffected. Run it as the
// changelog's owner; it takes the changelog's ACCESS EXCLUSIVE lock for a moment, waiting at
// most one second for it.
func RestrictReads(ctx context.Context, db *sql.DB, role string, tables []string, opts SchemaOptions) error {
	stmts, err := RestrictReadsSQL(ctx, db, role, tables, opts)
	if err != nil {
		return err
	}
	return runRestriction(ctx, db, stmts, "restrict reads of "+role)
}

// RestrictTokensSQL returns the statements [RestrictTokens] runs, in order, as one transaction.
func RestrictTokensSQL(ctx context.Context, db *sql.DB, role string, clients []string, opts SchemaOptions) ([]string, error) {
	opts, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	for _, c := range clients {
		if c == "" || strings.ContainsRune(c, 0) {
			return nil, fmt.Errorf("%w: RestrictTokens client: %q is not a client name", ErrInvalidConfig, c)
		}
	}
	var stmts []string
	for _, table := range clientTables(opts) {
		s, err := restrictSQL(ctx, db, table, "client_name", role, clients)
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
func clientTables(opts SchemaOptions) []string {
	return []string{opts.TokenTable, parkedTable(opts.ChangelogTable), ackTable(opts.ChangelogTable),
		memberTable(opts.ChangelogTable), rangeTable(opts.ChangelogTable)}
}

// RestrictTokens limits role (and its members) to the token rows of clients: it can read, save,
// fence and delete only their tokens, so it cannot move another client's position, which
// [Prune] trusts. The same holds for the clients' rows of the dead-letter table and of the
// acknowledgement rows of transactional handlers, by which another client's events could be
// parked, released or marked done, and of the members and ranges of shared clients, by which
// another client's ranges could be taken or their saved positions moved. Calling it again
// replaces the list; [RemoveRestrictions] lifts it. Other roles are unaffected; run
// administration ([ResetToken], [Prune]) as the token table's owner or a BYPASSRLS role. Run it
// as the token table's owner.
func RestrictTokens(ctx context.Context, db *sql.DB, role string, clients []string, opts SchemaOptions) error {
	stmts, err := RestrictTokensSQL(ctx, db, role, clients, opts)
	if err != nil {
		return err
	}
	return runRestriction(ctx, db, stmts, "restrict tokens of "+role)
}

// RemoveRestrictions drops role's policies on the changelog and the client tables (see
// [RestrictTokens]): it sees and
// writes again what unrestricted roles do. Row-level security stays enabled, with the open
// policy.
func RemoveRestrictions(ctx context.Context, db *sql.DB, role string, opts SchemaOptions) error {
	opts, err := opts.resolve()
	if err != nil {
		return err
	}
	name, err := rolePolicy(role)
	if err != nil {
		return err
	}
	var stmts []string
	for _, table := range append([]string{opts.ChangelogTable}, clientTables(opts)...) {
		stmts = append(stmts, `DROP POLICY IF EXISTS `+pgx.Identifier{name}.Sanitize()+` ON `+quoteIdentifier(table))
	}
	return runRestriction(ctx, db, stmts, "remove restrictions of "+role)
}

// rolePolicy returns the name of role's policy.
func rolePolicy(role string) (string, error) {
	name := rolePolicyPrefix + role
	switch {
	case role == "" || strings.ContainsRune(role, 0):
		return "", fmt.Errorf("%w: role: %q is not a role name", ErrInvalidConfig, role)
	case len(name) > maxIdentifierLen:
		return "", fmt.Errorf("%w: role: %q is too long: its policy name %q would exceed %d bytes",
			ErrInvalidConfig, role, name, maxIdentifierLen)
	}
	return name, nil
}

// restrictSQL returns the statements that restrict role to the rows of table whose column is one
// of values.
func restrictSQL(ctx context.Context, db *sql.DB, table, column, role string, values []string) ([]string, error) {
	name, err := rolePolicy(role)
	if err != nil {
		return nil, err
	}
	if len(values) == 0 {
		return nil, fmt.Errorf("%w: no %s given for role %q (RemoveRestrictions lifts a restriction)",
			ErrInvalidConfig, column, role)
	}
	tbl := quoteIdentifier(table)
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

// runRestriction runs stmts in one transaction.
func runRestriction(ctx context.Context, db *sql.DB, stmts []string, what string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("pgchangestream: %s: %w", what, err)
	}
	for _, stmt := range stmts {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("pgchangestream: %s: %w", what, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("pgchangestream: %s: %w", what, err)
	}
	return nil
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

// definerSQL reads whether the trigger function ($1, "name()") runs as its owner.
const definerSQL = `SELECT prosecdef FROM pg_proc WHERE oid = to_regprocedure($1)`

// RevokeWriterGrantsSQL returns the REVOKE statements that take the old writer grants away:
// INSERT on the changelog, SELECT on its id column and USAGE, UPDATE on its id sequence, from every role other than the
// owner that holds them. Writers need neither once [InstallSchema] has made the trigger function
// run as the changelog's owner; it returns an error before that, when revoking would break
// writes. It only reads the catalog: review the statements, then run them. A role that inserts
// changelog rows itself, bypassing the trigger, loses that too, which is the point.
func RevokeWriterGrantsSQL(ctx context.Context, db *sql.DB, opts SchemaOptions) ([]string, error) {
	opts, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	fn := quoteIdentifier(opts.FunctionName) + "()"
	var definer sql.NullBool
	if err := db.QueryRowContext(ctx, definerSQL, fn).Scan(&definer); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("pgchangestream: read trigger function %s: %w", fn, err)
	}
	if !definer.Bool {
		return nil, fmt.Errorf("pgchangestream: trigger function %s does not run as its owner yet: "+
			"run InstallSchema first, writers still need their grants", fn)
	}
	rows, err := db.QueryContext(ctx, writerGrantsSQL, quoteIdentifier(opts.ChangelogTable))
	if err != nil {
		return nil, fmt.Errorf("pgchangestream: read grants of %s: %w", opts.ChangelogTable, err)
	}
	defer rows.Close()
	var stmts []string
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
		}
		stmts = append(stmts, "REVOKE "+what+" "+pgx.Identifier{nsp, table}.Sanitize()+" FROM "+grantee)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgchangestream: read grants of %s: %w", opts.ChangelogTable, err)
	}
	return stmts, nil
}
