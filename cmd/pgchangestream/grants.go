package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"strings"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/schema"
)

// grantsUsage is the usage text of "grants" without a subcommand.
const grantsUsage = `Usage: pgchangestream grants revoke-writers [flags]
       pgchangestream grants restrict-reads [flags] ROLE TABLE...
       pgchangestream grants restrict-tokens [flags] ROLE CLIENT...
       pgchangestream grants unrestrict [flags] ROLE

  revoke-writers   print the REVOKE statements of the old writer grants on the changelog
  restrict-reads   limit ROLE to the changelog rows of the TABLEs (row-level security)
  restrict-tokens  limit ROLE to the saved tokens of the CLIENTs (row-level security)
  unrestrict       drop ROLE's restrictions

Run 'pgchangestream grants <subcommand> --help' for flags.
`

// runGrants runs a "grants" subcommand.
func runGrants(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	restrict := func(kind string) func(context.Context, []string, io.Writer, io.Writer) int {
		return func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
			return runRestrict(ctx, kind, args, stdout, stderr)
		}
	}
	return dispatch(ctx, "grants", grantsUsage, []subcommand{
		{"revoke-writers", runRevokeWriters}, {"restrict-reads", restrict("restrict-reads")},
		{"restrict-tokens", restrict("restrict-tokens")}, {"unrestrict", runUnrestrict},
	}, args, stdout, stderr)
}

// grantsFlags are the flags of the grants subcommands.
type grantsFlags struct {
	dsn  *string
	opts schema.Options
}

// addGrantsFlags adds --dsn, --changelog-table and --token-table.
func addGrantsFlags(c *command) *grantsFlags {
	f := &grantsFlags{dsn: c.dsnFlag()}
	c.fs.StringVar(&f.opts.ChangelogTable, "changelog-table", pgchangestream.DefaultChangelogTable,
		"changelog table, name or schema.name")
	c.fs.StringVar(&f.opts.TokenTable, "token-table", pgchangestream.DefaultTokenTable,
		"table of saved resume tokens")
	return f
}

// withDB connects to the database of --dsn and runs f.
func (f *grantsFlags) withDB(ctx context.Context, do func(*sql.DB) error) error {
	db, err := connectFlagDSN(ctx, *f.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	return schemaError(do(db))
}

// printStatements writes stmts to w, one a line, each ending with a semicolon.
func printStatements(w io.Writer, stmts []string) error {
	for _, s := range stmts {
		if _, err := fmt.Fprintln(w, terminate(s)); err != nil {
			return err
		}
	}
	return nil
}

// runRevokeWriters runs "grants revoke-writers".
func runRevokeWriters(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("grants revoke-writers", "grants revoke-writers [--dsn DSN] [flags]", `
Prints the REVOKE statements that take the old writer grants away: INSERT on the changelog,
SELECT on its id column and USAGE, UPDATE on its id sequence, from every role but the owner.
Once 'schema install' has made the trigger function run as the changelog's owner, writers of
captured tables need none of them, and without them cannot insert changelog rows of their own.
It changes nothing: review the statements, then run them (psql).

It fails, saying why, where revoking would break writes: while the trigger function is not the
one 'schema install' installs (before the upgrade, or after other DDL replaced it: run 'schema
install' and 'schema capture' again), and while a role that would lose its grants could undo the
function the way a service's start-up DDL does (a superuser; a role with the privileges of the
function's owner; one that owns a captured table and may create in another schema).
--ignore-replaceable lists the statements in the second case, for a role known to run no DDL.`,
		stdout, stderr)
	f := addGrantsFlags(c)
	c.fs.StringVar(&f.opts.FunctionName, "function", schema.DefaultTriggerFunction, "trigger function")
	c.fs.BoolVar(&f.opts.IgnoreReplaceable, "ignore-replaceable", false,
		"list the revokes even for roles that could replace the trigger function (they must run no DDL)")
	return c.exit(func() error {
		if err := c.parseNoArgs(args); err != nil {
			return err
		}
		f.opts.DryRun = true
		return f.withDB(ctx, func(db *sql.DB) error {
			res, err := schema.RevokeWriterGrants(ctx, db, f.opts)
			if err != nil {
				return err
			}
			if len(res.Statements) == 0 {
				_, err = fmt.Fprintln(stdout, "-- no old writer grants to revoke")
				return err
			}
			return printStatements(stdout, res.Statements)
		})
	}())
}

// runRestrict runs "grants restrict-reads" or "grants restrict-tokens".
func runRestrict(ctx context.Context, name string, args []string, stdout, stderr io.Writer) int {
	reads := name == "restrict-reads"
	what, restrict := "CLIENT", schema.RestrictTokens
	about := `
Limits ROLE (and its members) to the saved tokens of the CLIENTs: it can read, save and delete
only theirs, so it cannot move another client's position. It enables row-level security on the
token table with a policy open to every other role, so other roles are unaffected; the owner and
BYPASSRLS roles are never restricted: run token and prune commands as one of them. Running it
again replaces ROLE's list. With --print, writes the SQL instead (it still connects, to quote).`
	if reads {
		what, restrict = "TABLE", schema.RestrictReads
		about = `
Limits ROLE (and its members) to the changelog rows of the TABLEs (unqualified names, as the
changelog's table_name holds them): its watchers stream only those, and it can neither read nor
mark other tables' rows, nor other tables' parked events in the dead-letter table. It enables
row-level security on the changelog and the dead-letter table with a policy open to every other
role, so other roles, the owner, BYPASSRLS roles and the trigger are unaffected; reads keep their
index plans. Running it again replaces ROLE's list. It takes each table's ACCESS EXCLUSIVE lock
for a moment (waiting at most 1s). With --print, writes the SQL instead (it still connects, to
quote).`
	}
	c := newCommand("grants "+name, "grants "+name+" [--dsn DSN] [--print] [flags] ROLE "+what+"...", about, stdout, stderr)
	f := addGrantsFlags(c)
	printSQL := c.fs.Bool("print", false, "print the SQL instead of running it")
	return c.exit(func() error {
		args, err := c.parse(args)
		if err != nil {
			return err
		}
		if len(args) < 2 {
			return usagef("want ROLE and at least one %s", what)
		}
		role, values := args[0], args[1:]
		f.opts.DryRun = *printSQL
		return f.withDB(ctx, func(db *sql.DB) error {
			res, err := restrict(ctx, db, role, values, f.opts)
			if err != nil {
				return err
			}
			if f.opts.DryRun {
				return printStatements(stdout, append(append([]string{"BEGIN"}, res.Statements...), "COMMIT"))
			}
			_, err = fmt.Fprintf(stdout, "role %s restricted to %s %s\n", role, strings.ToLower(what), strings.Join(values, ", "))
			return err
		})
	}())
}

// runUnrestrict runs "grants unrestrict".
func runUnrestrict(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("grants unrestrict", "grants unrestrict [--dsn DSN] [flags] ROLE", `
Drops ROLE's restrictions on the changelog and the token table: it sees and writes again what
unrestricted roles do. Row-level security stays enabled, with its open policy.`, stdout, stderr)
	f := addGrantsFlags(c)
	return c.exit(func() error {
		args, err := c.parse(args)
		if err != nil {
			return err
		}
		if len(args) != 1 {
			return usagef("want one ROLE")
		}
		return f.withDB(ctx, func(db *sql.DB) error {
			if _, err := schema.RemoveRestrictions(ctx, db, args[0], f.opts); err != nil {
				return err
			}
			_, err := fmt.Fprintf(stdout, "role %s unrestricted\n", args[0])
			return err
		})
	}())
}
