package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/admin"
)

// tokenUsage is the usage text of "token" without a subcommand.
const tokenUsage = `Usage: pgchangestream token list [flags]
       pgchangestream token reset CLIENT --to beginning|newest|TIME|ID [--dry-run | --yes] [flags]
       pgchangestream token delete CLIENT [--dry-run | --yes] [flags]

  list    list every client's saved token as stored
  reset   set a client's saved position
  delete  delete a client's saved token: its next watcher starts as a new client

reset and delete refuse while a watcher of the client runs (see docs/operations.md).
Run 'pgchangestream token <subcommand> --help' for flags.
`

// runToken runs "token list", "token reset" or "token delete".
func runToken(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return dispatch(ctx, "token", tokenUsage, []subcommand{
		{"list", runTokenList}, {"reset", runTokenReset}, {"delete", runTokenDelete},
	}, args, stdout, stderr)
}

// adminFlags are the database and table flags of the token and prune commands.
type adminFlags struct {
	dsn  *string
	opts admin.Options
}

func addAdminFlags(c *command) *adminFlags {
	f := &adminFlags{dsn: c.dsnFlag()}
	c.fs.StringVar(&f.opts.ChangelogTable, "changelog-table", pgchangestream.DefaultChangelogTable, "changelog table")
	c.fs.StringVar(&f.opts.TokenTable, "token-table", pgchangestream.DefaultTokenTable, "table of saved positions")
	return f
}

// connect validates the table names (usage errors) and connects.
func (f *adminFlags) connect(ctx context.Context) (*sql.DB, error) {
	if _, err := quoteTable("changelog-table", f.opts.ChangelogTable); err != nil {
		return nil, err
	}
	if _, err := quoteTable("token-table", f.opts.TokenTable); err != nil {
		return nil, err
	}
	return connectFlagDSN(ctx, *f.dsn)
}

// listedToken is one client of "token list --format json": the token as a JSON object, and
// saved_at named as in status and prune.
type listedToken struct {
	Client  string          `json:"client"`
	Token   json.RawMessage `json:"token"` // null for a shared client without a token-table row
	SavedAt *time.Time      `json:"saved_at"`
	Shared  *sharedStatus   `json:"shared,omitempty"`
}

// runTokenList runs "token list".
func runTokenList(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("token list", "token list [--dsn DSN] [--format table|json] [flags]", `
Lists every client of the token table: its saved token as stored, and when it was saved.
'status' shows the positions, lag and backlog they mean.`, stdout, stderr)
	f := addAdminFlags(c)
	format := c.fs.String("format", "table", "table or json")
	return c.exit(func() error {
		if err := c.parseNoArgs(args); err != nil {
			return err
		}
		if err := checkChoice("format", *format, "table", "json"); err != nil {
			return err
		}
		db, err := f.connect(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		out, err := listTokens(ctx, db, f.opts)
		if err != nil {
			return err
		}
		if *format == "json" {
			return writeJSON(stdout, out)
		}
		tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "CLIENT\tSAVED\tTOKEN")
		var (
			clients []string
			shared  []*sharedStatus
		)
		for _, t := range out {
			if t.Shared != nil {
				clients, shared = append(clients, t.Client), append(shared, t.Shared)
			}
			if t.SavedAt == nil {
				continue // a shared client without a token-table row: its ranges follow
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", t.Client, t.SavedAt.UTC().Format(time.RFC3339), t.Token)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		return writeSharedTokens(stdout, clients, shared)
	}())
}

// writeJSON writes v as indented JSON; a nil slice is written as [].
func writeJSON[T any](w io.Writer, v []T) error {
	if v == nil {
		v = []T{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// clientArg returns the one positional argument, CLIENT.
func clientArg(c *command, args []string) (string, error) {
	args, err := c.parse(args)
	switch {
	case err != nil:
		return "", err
	case len(args) == 0:
		return "", usagef("missing CLIENT")
	case len(args) > 1:
		return "", usagef("unexpected argument %q: one CLIENT", args[1])
	}
	return args[0], nil
}

// confirmFlags adds --dry-run and --yes.
func confirmFlags(c *command) (dryRun, yes *bool) {
	return c.fs.Bool("dry-run", false, "print what would change and change nothing"),
		c.fs.Bool("yes", false, "make the change (required unless --dry-run)")
}

// checkConfirm returns a usage error unless exactly one of --dry-run and --yes is set; change
// says what --yes changes.
func checkConfirm(dryRun, yes bool, change string) error {
	switch {
	case dryRun && yes:
		return usagef("--dry-run and --yes exclude each other")
	case !dryRun && !yes:
		return usagef("this %s: add --yes to make the change, or --dry-run to see it", change)
	}
	return nil
}

// parseResetTarget parses --to: beginning, newest, an RFC 3339 time or a changelog id.
func parseResetTarget(to, table string) (admin.ResetTarget, error) {
	switch to {
	case "":
		return admin.ResetTarget{}, usagef("--to is required: beginning, newest, a time (RFC 3339) or a changelog id")
	case "beginning":
		return admin.ResetTarget{Beginning: true}, nil
	case "newest":
		return admin.ResetTarget{Newest: true, Table: table}, nil
	}
	if id, err := strconv.ParseInt(to, 10, 64); err == nil && id > 0 {
		return admin.ResetTarget{AfterID: id}, nil
	}
	if ts, err := time.Parse(time.RFC3339Nano, to); err == nil {
		return admin.ResetTarget{Time: ts}, nil
	}
	return admin.ResetTarget{}, usagef("--to %q is not beginning, newest, a time (RFC 3339) or a changelog id", to)
}

// currentToken returns the client's saved token, or "" when it has none.
func currentToken(ctx context.Context, db *sql.DB, client string, opts admin.Options) (string, error) {
	tokens, err := admin.ListTokens(ctx, db, opts)
	if err != nil {
		return "", err
	}
	for _, t := range tokens {
		if t.Client == client {
			return t.Token, nil
		}
	}
	return "", nil
}

// activeError explains a refusal because a watcher of the client runs.
func activeError(err error) error {
	if errors.Is(err, pgchangestream.ErrClientActive) {
		return fmt.Errorf("%w; stop its watchers first (exclusive ones, and those with a LISTEN connection, hold the lock)", err)
	}
	return err
}

// runTokenReset runs "token reset CLIENT".
func runTokenReset(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("token reset", "token reset CLIENT --to beginning|newest|TIME|ID [--dry-run | --yes] [flags]", `
Sets CLIENT's saved position, so that its next watcher resumes there:
  beginning  before every row: the watcher replays the whole changelog of its table
  newest     after the newest row (of --table, when given): the watcher skips what exists
  TIME       an RFC 3339 time: before the first row whose changed_at is at or after TIME
  ID         a changelog id: after that row
The token is written as {"timestamp", "eventID"}, which every schema state accepts, with the
table of CLIENT's watcher: --table, else the table its current token records. A client without
a saved token needs --table (a mistyped CLIENT would otherwise leave a token that holds back
'prune' of every table). The reset refuses while a watcher of CLIENT runs, and moves the
client's owner epoch on, so that a former exclusive watcher that lost its lock cannot save over
it. It needs --yes, or --dry-run to print the old and new token only.`, stdout, stderr)
	f := addAdminFlags(c)
	to := c.fs.String("to", "", "beginning, newest, an RFC 3339 time or a changelog id (required)")
	table := c.fs.String("table", "", "the table CLIENT's watcher reads, recorded in the token; "+
		"with --to newest also the table whose newest row counts (default: any table)")
	dryRun, yes := confirmFlags(c)
	return c.exit(func() error {
		client, err := clientArg(c, args)
		if err != nil {
			return err
		}
		target, err := parseResetTarget(*to, *table)
		if err != nil {
			return err
		}
		if err := checkConfirm(*dryRun, *yes, "changes the saved token"); err != nil {
			return err
		}
		db, err := f.connect(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		target.DryRun = true
		pos, err := admin.ResetToken(ctx, db, client, target, f.opts)
		if err != nil {
			return schemaError(err)
		}
		old, err := currentToken(ctx, db, client, f.opts)
		if err != nil {
			return err
		}
		if old == "" {
			if *table == "" {
				return fmt.Errorf("client %s has no saved token (is the name right?): pass --table, the table its watcher "+
					"reads, to create one", client)
			}
			old = "none"
		}
		kept := *table
		if kept == "" {
			_, recorded := tokenFormat(old)
			kept = deref(recorded)
		}
		where := fmt.Sprintf("%s; new token %s", describeReset(target, pos), pos.Token(kept))
		if *dryRun {
			_, err := fmt.Fprintf(stdout, "would reset client %s to %s (token now %s)\n", client, where, old)
			return err
		}
		if _, err := admin.ResetToken(ctx, db, client, admin.ResetTarget{Position: &pos, Table: *table}, f.opts); err != nil {
			return activeError(err)
		}
		_, err = fmt.Fprintf(stdout, "reset client %s to %s (token was %s)\n", client, where, old)
		return err
	}())
}

// describeReset says, as an operator reads it, where target places a client (pos, as
// admin.ResetToken resolved it).
func describeReset(target admin.ResetTarget, pos pgchangestream.Position) string {
	switch {
	case !target.Time.IsZero():
		return "after every row written before " + target.Time.UTC().Format(time.RFC3339Nano)
	case pos.ChangedAt.IsZero(): // the beginning, or newest of an empty changelog
		return "the beginning (before every row)"
	}
	return fmt.Sprintf("after row %d (changed_at %s)", pos.ID, pos.ChangedAt.UTC().Format(time.RFC3339Nano))
}

// runTokenDelete runs "token delete CLIENT".
func runTokenDelete(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("token delete", "token delete CLIENT [--dry-run | --yes] [flags]", `
Deletes CLIENT's saved token: its next watcher starts as a new client (after the newest row, or
at the oldest with Config.StartFromBeginning), and 'prune' no longer waits for it. It refuses
while a watcher of CLIENT runs, and needs --yes, or --dry-run to print the token only.`, stdout, stderr)
	f := addAdminFlags(c)
	dryRun, yes := confirmFlags(c)
	return c.exit(func() error {
		client, err := clientArg(c, args)
		if err != nil {
			return err
		}
		if err := checkConfirm(*dryRun, *yes, "changes the saved token"); err != nil {
			return err
		}
		db, err := f.connect(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		old, err := currentToken(ctx, db, client, f.opts)
		if err != nil {
			return err
		}
		if old == "" {
			return fmt.Errorf("client %s has no saved token", client)
		}
		if *dryRun {
			_, err := fmt.Fprintf(stdout, "would delete the token of client %s: %s\n", client, old)
			return err
		}
		if _, err := admin.DeleteToken(ctx, db, client, f.opts); err != nil {
			return activeError(err)
		}
		_, err = fmt.Fprintf(stdout, "deleted the token of client %s (was %s)\n", client, old)
		return err
	}())
}
