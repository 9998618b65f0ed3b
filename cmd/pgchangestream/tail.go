package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// closeTimeout bounds Close (and its final save) when a subcommand stops.
const closeTimeout = 10 * time.Second

// maxTailBatch bounds the events tail writes before it flushes and acknowledges.
const maxTailBatch = 256

// tailFlags are the flags of "tail".
type tailFlags struct {
	dsn, client, table, mode, format string
	changelog, tokens, channel       string
	fromBeginning, noAck, verbose    bool
}

// runTail runs "tail".
func runTail(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("tail", "tail --table TABLE [--dsn DSN] [flags]", `
Streams the changes of TABLE to stdout as they are committed, one line per event, and
acknowledges events once their lines are written (each flushed batch by its newest event, as
acknowledgements are cumulative), so the client's saved position follows the output. A client
without a saved position starts after the newest existing change (at the oldest with
--from-beginning) and saves that start; a client with one resumes after it, replaying what was
written but not acknowledged. On SIGINT or SIGTERM it stops, saves the position and exits 0.

Formats: json writes the event document with its "token" (the changelog id) as one JSON object
per line; pretty writes "id operation table key time" and the fields set or changed.`, stdout, stderr)
	var f tailFlags
	c.fs.StringVar(&f.dsn, "dsn", "", "PostgreSQL connection string, URL or key=value, also used for LISTEN "+
		"(default $"+envDSN+")")
	c.fs.StringVar(&f.client, "client", "pgchangestream-tail", "client name: the key of the saved position")
	c.fs.StringVar(&f.table, "table", "", "table whose changes to stream, as named in the changelog (without schema; required)")
	c.fs.StringVar(&f.mode, "mode", string(pgchangestream.ModeHybrid), "polling, notify or hybrid")
	c.fs.BoolVar(&f.fromBeginning, "from-beginning", false,
		"a client without a saved position starts at the oldest change instead of the newest")
	c.fs.BoolVar(&f.noAck, "no-ack", false, "never acknowledge: the saved position stays before the first event shown")
	c.fs.StringVar(&f.format, "format", "json", "json or pretty")
	c.fs.StringVar(&f.changelog, "changelog-table", pgchangestream.DefaultChangelogTable, "changelog table")
	c.fs.StringVar(&f.tokens, "token-table", pgchangestream.DefaultTokenTable, "table of saved positions")
	c.fs.StringVar(&f.channel, "channel", pgchangestream.DefaultNotifyChannel, "NOTIFY channel")
	c.fs.BoolVar(&f.verbose, "verbose", false, "log the watcher's progress (connects, start position) to stderr")
	return c.exit(func() error {
		if err := c.parseNoArgs(args); err != nil {
			return err
		}
		return tail(ctx, c, f)
	}())
}

// tail validates the flags, connects, and streams until ctx ends or the watcher fails.
func tail(ctx context.Context, c *command, f tailFlags) error {
	if f.table == "" {
		return usagef("--table is required")
	}
	mode := pgchangestream.Mode(f.mode)
	if err := checkChoice("mode", f.mode, string(pgchangestream.ModePolling), string(pgchangestream.ModeNotify),
		string(pgchangestream.ModeHybrid)); err != nil {
		return err
	}
	if err := checkChoice("format", f.format, "json", "pretty"); err != nil {
		return err
	}
	write := writeJSONEvent
	if f.format == "pretty" {
		write = writePrettyEvent
	}
	changelog, err := quoteTable("changelog-table", f.changelog)
	if err != nil {
		return err
	}
	dsn, err := resolveDSN(f.dsn)
	if err != nil {
		return err
	}
	level := slog.LevelWarn
	if f.verbose {
		level = slog.LevelInfo
	}
	cfg := pgchangestream.Config{
		ClientName: f.client, TableName: f.table, Mode: mode, ConnString: dsn,
		ChangelogTable: f.changelog, TokenTable: f.tokens, NotifyChannel: f.channel,
		StartFromBeginning: f.fromBeginning,
		Logger:             slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: level})),
	}
	if mode == pgchangestream.ModePolling {
		cfg.ConnString = ""
	}
	db, pcfg, err := openDB(dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	cfg.DB = db
	// New validates the names without touching the database: a bad one is a usage error.
	w, err := pgchangestream.New(cfg)
	if err != nil {
		return schemaError(err)
	}
	if err := pingDB(ctx, db, pcfg); err != nil {
		return err
	}
	if err := checkTailTable(ctx, c, db, changelog, f); err != nil {
		return err
	}
	return stream(ctx, c, w, write, !f.noAck)
}

// checkTailTable fails when the changelog table is missing and warns when it has no row for the
// table yet (a typo, or a table not captured).
func checkTailTable(ctx context.Context, c *command, db *sql.DB, changelog string, f tailFlags) error {
	if err := requireTable(ctx, db, "changelog table", f.changelog, changelog); err != nil {
		return err
	}
	var any bool
	err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT FROM `+changelog+` WHERE table_name = $1)`, f.table).Scan(&any)
	if err != nil {
		return fmt.Errorf("check changelog rows of %s: %w", f.table, err)
	}
	if !any {
		c.warn("the changelog has no row for table %q yet; is it captured ('%s schema capture %s')? waiting for changes",
			f.table, prog, f.table)
	}
	return nil
}

// stream starts w, writes every delivery to stdout and, when ack is set, acknowledges each batch
// of deliveries after it is flushed, until ctx ends (a clean stop: nil) or the watcher stops on
// its own (an error). It closes w, which saves the final position.
func stream(ctx context.Context, c *command, w *pgchangestream.Watcher,
	write func(*bufio.Writer, pgchangestream.EventWithToken) error, ack bool) (err error) {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	w.Start(runCtx)
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		if cerr := w.Close(closeCtx); cerr != nil && err == nil {
			err = fmt.Errorf("close: %w", cerr)
		}
	}()
	out := bufio.NewWriter(c.stdout)
	events := w.Events()
	for ctx.Err() == nil {
		var first pgchangestream.EventWithToken
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case first, ok = <-events:
		}
		if !ok {
			return fmt.Errorf("watcher stopped: %w", w.Err())
		}
		// Write what is already waiting, flush once, then ack the newest: acks are cumulative.
		last := first.ResumeToken
		if err := write(out, first); err != nil {
			return fmt.Errorf("write event: %w", err)
		}
		for n, more := 1, true; more && n < maxTailBatch && len(events) > 0; n++ {
			var ev pgchangestream.EventWithToken
			if ev, more = <-events; more {
				if err := write(out, ev); err != nil {
					return fmt.Errorf("write event: %w", err)
				}
				last = ev.ResumeToken
			}
		}
		if err := out.Flush(); err != nil {
			return fmt.Errorf("write events: %w", err)
		}
		if !ack {
			continue
		}
		if err := w.MarkProcessed(ctx, last); err != nil && !errors.Is(err, context.Canceled) {
			// The acknowledgement is kept; the next one (or the final save) retries the save.
			c.warn("save position after event %s: %v", last, err)
		}
	}
	return nil
}
