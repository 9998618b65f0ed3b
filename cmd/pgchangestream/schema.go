package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/schema"
)

// schemaUsage is the usage text of "schema" without a subcommand.
const schemaUsage = `Usage: pgchangestream schema install [flags]
       pgchangestream schema capture [flags] TABLE

  install  create the changelog table, the token table, their indexes and the trigger function
  capture  attach the trigger function to TABLE, so its changes fill the changelog

Run 'pgchangestream schema install --help' or 'pgchangestream schema capture --help' for flags.
`

// runSchema runs "schema install" or "schema capture".
func runSchema(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return dispatch(ctx, "schema", schemaUsage, []subcommand{
		{"install", runSchemaInstall}, {"capture", runSchemaCapture},
	}, args, stdout, stderr)
}

// schemaFlags are the flags of both schema subcommands.
type schemaFlags struct {
	dsn   *string
	print *bool
	opts  schema.Options
}

// addSchemaFlags adds --dsn, --print, --changelog-table and --function, and with all also
// --token-table and --channel, which only install uses.
func addSchemaFlags(c *command, all bool) *schemaFlags {
	f := &schemaFlags{dsn: c.dsnFlag()}
	f.print = c.fs.Bool("print", false, "print the SQL instead of running it (no database needed)")
	c.fs.StringVar(&f.opts.ChangelogTable, "changelog-table", pgchangestream.DefaultChangelogTable,
		"changelog table, name or schema.name")
	c.fs.StringVar(&f.opts.FunctionName, "function", schema.DefaultTriggerFunction, "trigger function")
	if all {
		c.fs.StringVar(&f.opts.TokenTable, "token-table", pgchangestream.DefaultTokenTable,
			"table of saved resume tokens")
		c.fs.StringVar(&f.opts.NotifyChannel, "channel", pgchangestream.DefaultNotifyChannel,
			"NOTIFY channel the trigger function notifies")
	}
	return f
}

// dryRun returns the options with DryRun set: the statements, checked, without a database.
func (f *schemaFlags) dryRun() schema.Options {
	opts := f.opts
	opts.DryRun = true
	return opts
}

// apply connects to the database of --dsn, makes the change and writes the line done to stdout.
func (f *schemaFlags) apply(ctx context.Context, stdout io.Writer, change func(*sql.DB) error, done string) error {
	db, err := connectFlagDSN(ctx, *f.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := change(db); err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, done)
	return err
}

// flagNames names the flags behind the library's configuration fields in its messages.
var flagNames = strings.NewReplacer(
	"schema.Options.ChangelogTable", "--changelog-table", "Config.ChangelogTable", "--changelog-table",
	"schema.Options.TokenTable", "--token-table", "Config.TokenTable", "--token-table",
	"schema.Options.NotifyChannel", "--channel", "Config.NotifyChannel", "--channel",
	"schema.Options.FunctionName", "--function", "Config.ClientName", "--client",
	"Config.TableName", "--table", "schema.Capture table", "TABLE",
	"admin.Options.ChangelogTable", "--changelog-table", "admin.Options.TokenTable", "--token-table",
)

// schemaError turns an invalid configuration (a bad name) into a usage error naming the flag.
func schemaError(err error) error {
	if errors.Is(err, pgchangestream.ErrInvalidConfig) {
		msg := strings.TrimPrefix(err.Error(), pgchangestream.ErrInvalidConfig.Error()+": ")
		return usagef("%s", flagNames.Replace(msg))
	}
	return err
}

// runSchemaInstall runs "schema install".
func runSchemaInstall(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("schema install", "schema install [--dsn DSN | --print] [flags]", `
Creates what the change stream needs, idempotently: the changelog table with its indexes (the
read index on (table_name, changed_at, id) is built with CREATE INDEX CONCURRENTLY on an
existing changelog), the token table, and the trigger function (CREATE OR REPLACE) that writes
a changelog row and a NOTIFY for every change of a captured table. An existing changelog is
kept as it is. Running it again changes nothing on an intact schema, and restores the trigger
function (SECURITY DEFINER, pinned search_path, owner) after other DDL replaced it, such as the
upstream services' start-up or migration: run it, then 'schema capture' for each captured table,
after every such migration. With --print, writes the SQL to stdout instead, for review or psql.`, stdout, stderr)
	f := addSchemaFlags(c, true)
	return c.exit(func() error {
		if err := c.parseNoArgs(args); err != nil {
			return err
		}
		plan, err := schema.Install(ctx, nil, f.dryRun())
		if err != nil {
			return schemaError(err)
		}
		if *f.print {
			return printInstallSQL(stdout, plan.Statements)
		}
		return f.apply(ctx, stdout, func(db *sql.DB) error {
			_, err := schema.Install(ctx, db, f.opts)
			return err
		}, fmt.Sprintf("schema installed: changelog %s, token table %s, function %s, channel %s",
			f.opts.ChangelogTable, f.opts.TokenTable, f.opts.FunctionName, f.opts.NotifyChannel))
	}())
}

// printInstallSQL writes the install statements as a psql script: the first (several commands
// that schema.Install sends as one implicit transaction) inside BEGIN/COMMIT, then each index
// build on its own.
func printInstallSQL(w io.Writer, stmts []string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "-- pgchangestream schema install: %d statements, run in order.\n", len(stmts))
	fmt.Fprintf(&b, "-- 1: tables and trigger function, in one transaction.\nBEGIN;\n%s\nCOMMIT;\n", terminate(stmts[0]))
	for i, s := range stmts[1:] {
		fmt.Fprintf(&b, "\n-- %d: index build; it cannot run inside a transaction block. If it fails, drop the\n"+
			"-- invalid index it leaves before running it again (schema.Install does that itself).\n%s\n",
			i+2, terminate(s))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// terminate ends a statement with a semicolon.
func terminate(stmt string) string {
	stmt = strings.TrimSpace(stmt)
	if strings.HasSuffix(stmt, ";") {
		return stmt
	}
	return stmt + ";"
}

// runSchemaCapture runs "schema capture TABLE".
func runSchemaCapture(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("schema capture", "schema capture [--dsn DSN | --print] [flags] TABLE", `
Attaches the trigger function to TABLE (name or schema.name) as the trigger "<name>_changes",
after every inserted, updated or deleted row, unless it is attached already. TABLE needs an id
column (it becomes the changelog's record_id). Run 'schema install' first. With --print, writes
the SQL to stdout instead.

--no-notify attaches it so that it writes the changelog row without a NOTIFY: PostgreSQL refuses
PREPARE TRANSACTION after a NOTIFY, so a table written by prepared (two-phase) transactions
needs it. Its changes are then read by polling (watchers in polling or hybrid mode).

--key PATH has the trigger write each row's unit from the value at PATH (dot-separated, in the
row as JSON, e.g. document.healthevent.nodename) instead of the record id, so that the rows of
one value stay with one member of a shared client. health_events takes
document.healthevent.nodename by default. An existing trigger with another key is an error:
drop it first.

An existing trigger without arguments (other DDL, such as the upstream services' start-up, drops
and creates theirs without any; this command gives every trigger one) is dropped and created
again with the arguments asked for, in one transaction: run it again after such DDL, with the
flags the table was first captured with.`, stdout, stderr)
	f := addSchemaFlags(c, false)
	c.fs.BoolVar(&f.opts.WithoutNotify, "no-notify", false, "write changelog rows without NOTIFY "+
		"(for tables written by PREPARE TRANSACTION)")
	c.fs.StringVar(&f.opts.Key, "key", "", "the dotted path of the rows' key, whose unit shared clients divide rows by")
	return c.exit(func() error {
		args, err := c.parse(args)
		if err != nil {
			return err
		}
		switch {
		case len(args) == 0:
			return usagef("missing TABLE")
		case len(args) > 1:
			return usagef("unexpected argument %q: capture takes one TABLE", args[1])
		}
		table := args[0]
		plan, err := schema.Capture(ctx, nil, table, f.dryRun())
		if err != nil {
			return schemaError(err)
		}
		if *f.print {
			for _, s := range plan.Statements {
				if _, err := fmt.Fprintln(stdout, terminate(s)); err != nil {
					return err
				}
			}
			return nil
		}
		return f.apply(ctx, stdout, func(db *sql.DB) error {
			_, err := schema.Capture(ctx, db, table, f.opts)
			return err
		}, fmt.Sprintf("capturing changes of %s into %s", table,
			cmp.Or(f.opts.ChangelogTable, pgchangestream.DefaultChangelogTable)))
	}())
}
