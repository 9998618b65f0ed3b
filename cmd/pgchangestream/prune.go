package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/pgchangestream/pgchangestream/admin"
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
	DryRun     bool          `json:"dry_run"`
	Deleted    int64         `json:"deleted"`
	Batches    int           `json:"batches"`
	Clients    []string      `json:"clients"`
	Unresolved []string      `json:"unresolved"`
	HeldBy     []pruneHolder `json:"held_by"`
}

// pruneHolder is a client whose token kept rows, in the JSON output of "prune".
type pruneHolder struct {
	Client     string    `json:"client"`
	Table      *string   `json:"table"` // null: the token records no table and counts for every one
	Rows       int64     `json:"rows"`
	SavedAt    time.Time `json:"saved_at"`
	AgeSeconds float64   `json:"age_seconds"`
	Stale      bool      `json:"stale"`
}

// defaultStaleAfter is the default --stale-after of prune and status. A running watcher saves
// its token at least once per Config.CheckpointRefreshInterval (a minute) while it has nothing
// pending.
const defaultStaleAfter = 24 * time.Hour

// staleAfterFlag adds --stale-after.
func staleAfterFlag(c *command) *time.Duration {
	return c.fs.Duration("stale-after", defaultStaleAfter, "flag tokens not saved for this long (their watcher may be gone)")
}

// holders converts the library's holders for output.
func holders(hs []admin.PruneHolder, staleAfter time.Duration) []pruneHolder {
	out := make([]pruneHolder, 0, len(hs))
	for _, h := range hs {
		ph := pruneHolder{Client: h.Client, Rows: h.Rows, SavedAt: h.SavedAt.UTC(),
			AgeSeconds: math.Round(h.Age.Seconds()*1000) / 1000, Stale: h.Age >= staleAfter}
		if h.Table != "" {
			ph.Table = &h.Table
		}
		out = append(out, ph)
	}
	return out
}

// writeHolders writes one line per holder.
func writeHolders(w io.Writer, hs []pruneHolder) error {
	for _, h := range hs {
		table := "every table (its token records none)"
		if h.Table != nil {
			table = "table " + *h.Table
		}
		stale := ""
		if h.Stale {
			stale = "; stale: is its watcher still running? ('token delete' it, or pass --ignore-client)"
		}
		if _, err := fmt.Fprintf(w, "held back by client %s (%s): %d rows; token saved %s ago%s\n", h.Client, table, h.Rows,
			formatAge(time.Duration(h.AgeSeconds*float64(time.Second))), stale); err != nil {
			return err
		}
	}
	return nil
}

// runPrune runs "prune".
func runPrune(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("prune", "prune [--dsn DSN] [--older-than D] [--dry-run] [--ignore-client NAME]... [flags]", `
Deletes the changelog rows that every client of their table has passed, in batches: a row goes
only if some saved token counts for its table and every such token certifies it. A token counts
for the table it records (its watcher's); a token that records none (saved by an older version)
counts for every table. --ignore-client leaves a retired client out. A token that names a row no
longer in the changelog holds back everything: nothing is deleted. The legacy processed flag,
shared by all clients, is never used. Rows younger than --older-than are kept (a margin for rows
whose transaction was open while a client passed their position).

The summary (stdout) names each client whose token kept rows back, with the number of rows and
how long ago the token was saved; tokens older than --stale-after are flagged: a running watcher
saves at least once a minute while it has nothing pending. Progress goes to stderr on a
terminal.`, stdout, stderr)
	f := addAdminFlags(c)
	olderThan := c.fs.Duration("older-than", time.Hour, "keep rows whose changed_at is younger than this")
	dryRun := c.fs.Bool("dry-run", false, "count the rows that would be deleted and delete nothing")
	var ignore stringList
	c.fs.Var(&ignore, "ignore-client", "a client whose token holds nothing back (repeatable)")
	table := c.fs.String("table", "", "delete only the rows of this table (default: every table)")
	batch := c.fs.Int("batch", admin.DefaultPruneBatch, "rows per DELETE")
	format := c.fs.String("format", "text", "text or json")
	staleAfter := staleAfterFlag(c)
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
		if *staleAfter <= 0 {
			return usagef("--stale-after must be positive, got %v", *staleAfter)
		}
		db, err := f.connect(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		opts := admin.PruneOptions{Options: f.opts, OlderThan: *olderThan, Table: *table,
			IgnoreClients: ignore, BatchSize: *batch, DryRun: *dryRun}
		progress := isTerminal(stderr)
		if progress {
			opts.Progress = func(n int64) { fmt.Fprintf(stderr, "\rdeleted %d rows", n) }
		}
		res, err := admin.Prune(ctx, db, opts)
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
			c.warn("no saved token counts for these rows: no row is known to be passed; nothing deleted")
		}
		held := holders(res.Holders, *staleAfter)
		if *format == "json" {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(pruneSummary{DryRun: *dryRun, Deleted: res.Deleted, Batches: res.Batches,
				Clients: nonNil(res.Clients), Unresolved: nonNil(res.Unresolved), HeldBy: held})
		}
		verb := "deleted"
		if *dryRun {
			verb = "would delete"
		}
		if _, err := fmt.Fprintf(stdout, "%s %d changelog rows older than %v, passed by clients: %s\n",
			verb, res.Deleted, *olderThan, strings.Join(res.Clients, ", ")); err != nil {
			return err
		}
		return writeHolders(stdout, held)
	}())
}

// nonNil returns s, or an empty slice for nil (JSON [] rather than null).
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
