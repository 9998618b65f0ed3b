package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// stringList is a flag that may be repeated.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// pruneSummary is the JSON output of "prune".
type pruneSummary struct {
	DryRun     bool     `json:"dry_run"`
	Deleted    int64    `json:"deleted"`
	Batches    int      `json:"batches"`
	Clients    []string `json:"clients"`
	Unresolved []string `json:"unresolved"`
}

// runPrune runs "prune".
func runPrune(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("prune", "prune [--dsn DSN] [--older-than D] [--dry-run] [--ignore-client NAME]... [flags]", `
Deletes the changelog rows that every client has passed, in batches: a row goes only if the
saved token of every client in the token table certifies it. The token table does not record
a client's table, so every token holds back the rows of every table after its position (a
client of another table too); --ignore-client leaves a retired client out. A token that names
a row no longer in the changelog holds back everything: nothing is deleted. The legacy
processed flag, shared by all clients, is never used. Rows younger than --older-than are kept
(a margin for rows whose transaction was open while a client passed their position).
Progress goes to stderr on a terminal; the summary to stdout.`, stdout, stderr)
	f := addAdminFlags(c)
	olderThan := c.fs.Duration("older-than", time.Hour, "keep rows whose changed_at is younger than this")
	dryRun := c.fs.Bool("dry-run", false, "count the rows that would be deleted and delete nothing")
	var ignore stringList
	c.fs.Var(&ignore, "ignore-client", "a client whose token holds nothing back (repeatable)")
	table := c.fs.String("table", "", "delete only the rows of this table (default: every table)")
	batch := c.fs.Int("batch", pgchangestream.DefaultPruneBatch, "rows per DELETE")
	format := c.fs.String("format", "text", "text or json")
	return c.exit(func() error {
		if err := c.parseNoArgs(args); err != nil {
			return err
		}
		if err := checkChoice("format", *format, "text", "json"); err != nil {
			return err
		}
		if *olderThan < 0 {
			return usagef("--older-than must not be negative, got %v", *olderThan)
		}
		if *batch <= 0 {
			return usagef("--batch must be positive, got %d", *batch)
		}
		db, err := f.connect(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		opts := pgchangestream.PruneOptions{AdminOptions: f.opts, OlderThan: *olderThan, Table: *table,
			IgnoreClients: ignore, BatchSize: *batch, DryRun: *dryRun}
		progress := isTerminal(stderr)
		if progress {
			opts.Progress = func(n int64) { fmt.Fprintf(stderr, "\rdeleted %d rows", n) }
		}
		res, err := pgchangestream.Prune(ctx, db, opts)
		if progress && res.Batches > 0 {
			fmt.Fprintln(stderr)
		}
		if err != nil {
			return err
		}
		for _, name := range res.Unresolved {
			c.warn("client %s's token names a changelog row that no longer exists (its watcher replays everything): "+
				"nothing deleted; reset it ('%s token reset') or pass --ignore-client %s", name, prog, name)
		}
		if len(res.Clients) == 0 && len(res.Unresolved) == 0 {
			c.warn("no saved token: no row is known to be passed; nothing deleted")
		}
		if *format == "json" {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(pruneSummary{DryRun: *dryRun, Deleted: res.Deleted, Batches: res.Batches,
				Clients: nonNil(res.Clients), Unresolved: nonNil(res.Unresolved)})
		}
		verb := "deleted"
		if *dryRun {
			verb = "would delete"
		}
		_, err = fmt.Fprintf(stdout, "%s %d changelog rows older than %v, passed by clients: %s\n",
			verb, res.Deleted, *olderThan, strings.Join(res.Clients, ", "))
		return err
	}())
}

// nonNil returns s, or an empty slice for nil (JSON [] rather than null).
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
