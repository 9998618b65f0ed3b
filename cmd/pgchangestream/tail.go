package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// closeTimeout bounds Close (and its final save) when a subcommand stops.
const closeTimeout = 10 * time.Second

// maxTailBatch bounds the events tail writes before it flushes and acknowledges.
const maxTailBatch = 256

// tailFlags are the flags of "tail".
type tailFlags struct {
	dsn, client, table, mode, format, from string
	changelog, tokens, channel             string
	fromBeginning, noAck, verbose, atEnd   bool
	count                                  int
}

// ephemeralClient is the client name of a tail without --client; it saves nothing.
const ephemeralClient = "pgchangestream-tail"

// endPoll is how often tail --exit-at-end checks whether the watcher has caught up.
const endPoll = 50 * time.Millisecond

// runTail runs "tail".
func runTail(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("tail", "tail --table TABLE [--dsn DSN] [flags]", `
Streams the changes of TABLE to stdout as they are committed, one line per event. It exits 1
when the changelog has no row of TABLE and TABLE does not exist or has no id column (nothing
could ever arrive), and says why it waits when TABLE is not captured or has no change yet.

Without --client, tail saves nothing: it starts after the newest existing change (see --from)
and leaves no trace in the token table. With --client NAME it acknowledges events once their
lines are written (each flushed batch by its newest event, as acknowledgements are cumulative),
so NAME's saved position follows the output: a client without a saved position starts as
--from says and saves that start; a client with one resumes after it. --no-ack never saves.
On SIGINT or SIGTERM it stops, saves the position (with --client) and exits 0.

--from applies to a client without a saved position: beginning, newest (default) or an RFC 3339
time (the table is read from its oldest row and older events are skipped). To move a saved
position, use 'token reset'.

Formats: json writes the event document with its "token" (the changelog id) as one JSON object
per line; pretty writes "id operation table key time" and the fields set or changed.`, stdout, stderr)
	var f tailFlags
	c.fs.StringVar(&f.dsn, "dsn", "", "PostgreSQL connection string, URL or key=value, also used for LISTEN "+
		"(default $"+envDSN+")")
	c.fs.StringVar(&f.client, "client", "", "client name: acknowledge and save the position under this name "+
		"(default: save nothing)")
	c.fs.StringVar(&f.table, "table", "", "table whose changes to stream, as named in the changelog (without schema; required)")
	c.fs.StringVar(&f.mode, "mode", string(pgchangestream.ModeHybrid), "polling, notify or hybrid")
	c.fs.StringVar(&f.from, "from", "newest", "without a saved position, start at: beginning, newest or an RFC 3339 time")
	c.fs.BoolVar(&f.fromBeginning, "from-beginning", false, "same as --from beginning")
	c.fs.BoolVar(&f.noAck, "no-ack", false, "never acknowledge nor save: the saved position stays where it was")
	c.fs.IntVar(&f.count, "count", 0, "exit after writing this many events (0: no limit)")
	c.fs.IntVar(&f.count, "n", 0, "same as --count")
	c.fs.BoolVar(&f.atEnd, "exit-at-end", false, "exit once every committed change has been written")
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

// startFrom applies --from (or --from-beginning) to cfg.
func startFrom(cfg *pgchangestream.Config, f tailFlags) error {
	from := f.from
	if f.fromBeginning {
		from = "beginning"
	}
	switch from {
	case "newest":
		return nil
	case "beginning":
		cfg.StartFromBeginning = true
		return nil
	}
	at, err := time.Parse(time.RFC3339Nano, from)
	if err != nil {
		return usagef("--from %q is not beginning, newest or an RFC 3339 time", from)
	}
	cfg.StartFromBeginning = true
	cfg.Filter = func(ev pgchangestream.Event) bool {
		t, ok := ev["clusterTime"].(time.Time)
		return !ok || !t.Before(at)
	}
	return nil
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
	if f.count < 0 {
		return usagef("--count must not be negative, got %d", f.count)
	}
	cfg := pgchangestream.Config{
		ClientName: f.client, TableName: f.table, Mode: mode, ConnString: dsn,
		ChangelogTable: f.changelog, TokenTable: f.tokens, NotifyChannel: f.channel,
		Ephemeral: f.client == "" || f.noAck,
		Logger:    slog.New(tableChecked{slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: level})}),
	}
	if f.client == "" {
		cfg.ClientName = ephemeralClient
	}
	if err := startFrom(&cfg, f); err != nil {
		return err
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
	return stream(ctx, c, w, write, streamOptions{ack: f.client != "" && !f.noAck, count: f.count, atEnd: f.atEnd})
}

// streamOptions say when stream acknowledges and when it stops by itself.
type streamOptions struct {
	ack   bool // acknowledge each flushed batch
	count int  // stop after this many events; 0: no limit
	atEnd bool // stop once caught up
}

// tableStateQuery asks, of table $1 (a bare name, as the changelog records it): whether the
// changelog has a row of it, whether a table of that name exists, whether it has an id column,
// and whether it has a trigger (as the watcher's own check, a trigger counts as captured).
const tableStateQuery = `SELECT EXISTS (SELECT FROM %s WHERE table_name = $1),
	EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.relname = $1 AND c.relkind IN ('r', 'p')),
	EXISTS (SELECT FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
		WHERE c.relname = $1 AND c.relkind IN ('r', 'p') AND a.attname = 'id' AND a.attnum > 0 AND NOT a.attisdropped),
	EXISTS (SELECT FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
		WHERE c.relname = $1 AND NOT t.tgisinternal)`

// checkTailTable fails when the changelog table is missing, or when the changelog has no row of
// the table and the table does not exist or has no id column (nothing will ever arrive). When
// the table can be captured but has no row yet, it says once why tail waits.
func checkTailTable(ctx context.Context, c *command, db *sql.DB, changelog string, f tailFlags) error {
	if err := requireTable(ctx, db, "changelog table", f.changelog, changelog); err != nil {
		return err
	}
	var rows, exists, hasID, captured bool
	err := db.QueryRowContext(ctx, fmt.Sprintf(tableStateQuery, changelog), f.table).Scan(&rows, &exists, &hasID, &captured)
	if err != nil {
		return fmt.Errorf("check table %s: %w", f.table, err)
	}
	switch {
	case rows: // a dropped table's history can still be read
	case !exists:
		return fmt.Errorf("table %q does not exist (--table is the table's name, without schema)", f.table)
	case !hasID:
		return fmt.Errorf("table %q has no \"id\" column: changes are recorded by its id, so it cannot be captured", f.table)
	case !captured:
		c.warn("table %q is not captured: no change of it is recorded (capture it with '%s schema capture %s'); "+
			"waiting for changes", f.table, prog, f.table)
	default:
		c.warn("table %q has no recorded change yet; waiting for changes", f.table)
	}
	return nil
}

// tableChecked is a log handler that drops the watcher's start-up warning about a table without
// changelog rows: checkTailTable has checked the table, and said why tail waits.
type tableChecked struct{ slog.Handler }

// tableWarning starts the watcher's warning that tableChecked drops.
const tableWarning = "no changelog row and no table with a trigger has Config.TableName"

func (h tableChecked) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, tableWarning) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h tableChecked) WithAttrs(attrs []slog.Attr) slog.Handler {
	return tableChecked{h.Handler.WithAttrs(attrs)}
}

func (h tableChecked) WithGroup(name string) slog.Handler {
	return tableChecked{h.Handler.WithGroup(name)}
}

// stream starts w, writes every delivery to stdout and, with opts.ack, acknowledges each batch
// of deliveries after it is flushed, until ctx ends, opts.count events are written or, with
// opts.atEnd, the watcher has caught up (a clean stop: nil), or the watcher stops on its own (an
// error). It closes w, which saves the final position.
func stream(ctx context.Context, c *command, w *pgchangestream.Watcher,
	write func(*bufio.Writer, pgchangestream.EventWithToken) error, opts streamOptions) (err error) {
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
	var tick <-chan time.Time
	if opts.atEnd {
		t := time.NewTicker(endPoll)
		defer t.Stop()
		tick = t.C
	}
	out := bufio.NewWriter(c.stdout)
	events := w.Events()
	written := 0
	lastReceived := time.Now()
	for ctx.Err() == nil {
		var first pgchangestream.EventWithToken
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			if caughtUp(w, events, lastReceived) {
				return nil
			}
			continue
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
		written++
		for n, more := 1, true; more && n < maxTailBatch && len(events) > 0 && (opts.count == 0 || written < opts.count); n++ {
			var ev pgchangestream.EventWithToken
			if ev, more = <-events; more {
				if err := write(out, ev); err != nil {
					return fmt.Errorf("write event: %w", err)
				}
				last = ev.ResumeToken
				written++
			}
		}
		lastReceived = time.Now()
		if err := out.Flush(); err != nil {
			return fmt.Errorf("write events: %w", err)
		}
		if opts.ack {
			if err := w.MarkProcessed(ctx, last); err != nil && !errors.Is(err, context.Canceled) {
				// The acknowledgement is kept; the next one (or the final save) retries the save.
				c.warn("save position after event %s: %v", last, err)
			}
		}
		if opts.count > 0 && written >= opts.count {
			return nil
		}
	}
	return nil
}

// caughtUp reports whether every change committed before the watcher's last empty read has
// been written: that read came after the last event was received, and nothing waits in events
// (a send completes before the reader reads again).
func caughtUp(w *pgchangestream.Watcher, events <-chan pgchangestream.EventWithToken, lastReceived time.Time) bool {
	lastEmpty, _ := w.LagState()
	return lastEmpty.After(lastReceived) && len(events) == 0
}
