package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
)

// demoFlags are the flags of "demo".
type demoFlags struct {
	dsn                              string
	writers, crashes                 int
	rate                             float64
	duration, progress, drainTimeout time.Duration
	seed                             uint64
}

// runDemo runs "demo".
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("demo", "demo [--dsn DSN] [flags]", `
Checks that a consumer that crashes with deliveries not yet acknowledged misses no change and
gets those deliveries again. It installs the schema, creates and captures the table "orders",
and runs concurrent writers that insert, update and delete orders for --duration, each
statement its own transaction. A consumer (client "`+demoClient+`", hybrid mode)
records every event it receives and acknowledges the newest every `+strconv.Itoa(demoAckEvery)+` events (and once none
has arrived for `+demoAckIdle.String()+`), so it always holds some deliveries unacknowledged.

The consumer is crashed --crashes times at random moments and restarted with a new watcher. At
each crash the demo
  1. pauses the writers: each finishes its current transaction, then waits;
  2. waits until every row committed so far has been delivered to the consumer at least once
     (received, acknowledged or not), failing after --drain-timeout;
  3. crashes the consumer: it cancels the watcher's Start context without a Flush and closes
     its connection pool, so nothing more is saved, and the deliveries not yet acknowledged
     stay pending (Close then only releases the goroutines: its final save fails on the closed
     pool);
  4. restarts it after a random pause of up to `+maxDowntime.String()+`: the new watcher resumes after the
     saved position and delivers the unacknowledged deliveries again;
  5. resumes the writers once the new watcher has read the changelog (it listens before that).

The writers pause so that no commit is in flight around a crash. With several writers, a row
whose transaction started before rows the consumer had already read can commit after them,
behind its cursor (a late row); a running watcher recovers it from its NOTIFY, but one that
commits while no watcher runs, or before the watcher handles its NOTIFY, lies behind the saved
position and is never delivered. That is a documented limit of the library ("Known limits" in
docs/design.md, "Restarts and late commits" in docs/operations.md), not what the demo checks.

Each crash line reports the deliveries left unacknowledged and the saved position. A late row
recovered after the consumer's last save can lie behind that position: it was delivered once
and is not delivered again, and the crash line counts it apart.

After the writers stop, the consumer drains until every written row is delivered,
--drain-timeout passes, or it has stayed at the newest row for 2s with rows still missing. Then
every changelog row of "orders" is checked against the deliveries. The last line is
  demo: written=N delivered=M replayed=R lost=L
(replayed: deliveries beyond the first of a row; lost: rows never delivered). Exits 1 if any
row was lost; a lost row behind a position saved at a crash is named a late commit.

Without --dsn it starts a throwaway PostgreSQL from the local server binaries (initdb and
postgres) and removes it afterwards. With --dsn it works in that database: it creates "orders"
if missing and resets the saved position of client "`+demoClient+`".`, stdout, stderr)
	var f demoFlags
	c.fs.StringVar(&f.dsn, "dsn", "", "database to use (default: start a throwaway PostgreSQL)")
	c.fs.IntVar(&f.writers, "writers", 4, "concurrent writers")
	c.fs.Float64Var(&f.rate, "rate", 500, "rows written per second, all writers together")
	c.fs.DurationVar(&f.duration, "duration", 15*time.Second, "how long the writers write")
	c.fs.IntVar(&f.crashes, "crashes", 5, "consumer crashes, at random moments while writing")
	c.fs.Uint64Var(&f.seed, "seed", 0, "seed of the random choices (default: random, printed)")
	c.fs.DurationVar(&f.progress, "progress", time.Second, "interval of the progress report")
	c.fs.DurationVar(&f.drainTimeout, "drain-timeout", 30*time.Second,
		"how long to wait for delivery of every row written so far, before each crash and after writing")
	return c.exit(func() error {
		if err := c.parseNoArgs(args); err != nil {
			return err
		}
		if err := f.validate(); err != nil {
			return err
		}
		return demo(ctx, c, f)
	}())
}

// validate checks the flag values.
func (f *demoFlags) validate() error {
	switch {
	case f.writers < 1:
		return usagef("--writers must be at least 1, got %d", f.writers)
	case f.crashes < 0:
		return usagef("--crashes must not be negative, got %d", f.crashes)
	case !(f.rate > 0):
		return usagef("--rate must be positive, got %v", f.rate)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"duration", f.duration}, {"progress", f.progress}, {"drain-timeout", f.drainTimeout}} {
		if err := positiveDuration(d.name, d.v); err != nil {
			return err
		}
	}
	return nil
}

// demo runs the demo and returns an error if it could not run or a row was lost.
func demo(ctx context.Context, c *command, f demoFlags) error {
	if f.seed == 0 {
		f.seed = rand.Uint64()
	}
	out := &progressLine{w: c.stdout, tty: isTerminal(c.stdout)}
	dsn := f.dsn
	if dsn == "" {
		out.println("demo: starting a throwaway PostgreSQL ...")
		var stop func()
		var err error
		if dsn, stop, err = startDemoServer(ctx); err != nil {
			return err
		}
		defer stop()
	}
	db, err := connectDB(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	baseline, err := setupDemo(ctx, db)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	consumer := newDemoConsumer(dsn, db, logger)
	defer func() { _ = consumer.stop(ctx) }()
	w, err := consumer.start(ctx)
	if err != nil {
		return err
	}
	if err := waitStarted(ctx, w, 30*time.Second); err != nil {
		return err
	}
	out.println(fmt.Sprintf("demo: seed=%d writers=%d rate=%g/s duration=%v crashes=%d",
		f.seed, f.writers, f.rate, f.duration, f.crashes))

	rng := rand.New(rand.NewPCG(f.seed, 0))
	writers := newDemoWriters(db, f.writers, f.rate, f.seed)
	r := &demoRun{c: c, f: f, out: out, db: db, baseline: baseline, consumer: consumer, writers: writers,
		start: time.Now()}
	if err := r.write(ctx, rng); err != nil {
		return err
	}
	out.println(fmt.Sprintf("demo: writers stopped after %v: %d inserts, %d updates, %d deletes",
		time.Since(r.start).Round(100*time.Millisecond), writers.inserts.Load(), writers.updates.Load(), writers.deletes.Load()))

	ids, newest, err := writtenRows(ctx, db, baseline)
	if err != nil {
		return err
	}
	drainStart := time.Now()
	drained, err := r.drain(ctx, ids, newest)
	if err != nil {
		return err
	}
	if err := consumer.stop(ctx); err != nil {
		return fmt.Errorf("stop the consumer: %w", err)
	}
	out.println(r.progressText())
	switch took := time.Since(drainStart).Round(time.Millisecond); drained {
	case drainedAll:
		out.println(fmt.Sprintf("demo: drained in %v", took))
	case drainedStuck:
		out.println(fmt.Sprintf("demo: drain stopped after %v: the consumer is at the newest row, "+
			"and the rows still missing lie behind its position", took))
	default:
		out.println(fmt.Sprintf("demo: drain timed out after %v", f.drainTimeout))
	}
	seen := consumer.deliveries()
	late, err := lateRows(ctx, db, lostIDs(ids, seen), r.crashSaved)
	if err != nil {
		return err
	}
	return summarize(out, ids, seen, consumer.ackErrors.Load(), late)
}

// startDemoServer starts a throwaway PostgreSQL and creates a database for the demo. stop drops
// the database and stops the server.
func startDemoServer(ctx context.Context) (dsn string, stop func(), err error) {
	srv, err := pgtest.Start(ctx, pgtest.Options{})
	if errors.Is(err, pgtest.ErrNoServer) {
		return "", nil, errors.New("no PostgreSQL server to run the demo on: pass --dsn DSN, or install the " +
			"PostgreSQL server package (Debian/Ubuntu: apt-get install postgresql; Fedora/RHEL: dnf install " +
			"postgresql-server; macOS: brew install postgresql) so that initdb and postgres are on PATH " +
			"or under /usr/lib/postgresql/*/bin")
	}
	if err != nil {
		return "", nil, fmt.Errorf("start a throwaway PostgreSQL: %w", err)
	}
	if dsn, err = srv.CreateDatabase(ctx, ""); err != nil {
		_ = srv.Stop()
		return "", nil, err
	}
	return dsn, func() {
		if cfg, err := pgconn.ParseConfig(dsn); err == nil {
			dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
			_ = srv.DropDatabase(dropCtx, cfg.Database) // matters only for an external server
			cancel()
		}
		_ = srv.Stop()
	}, nil
}

// setupDemo installs the schema, creates and captures the demo table, resets the demo client,
// and returns the newest changelog id of the demo table: the demo's rows come after it.
func setupDemo(ctx context.Context, db *sql.DB) (baseline int64, err error) {
	if err := pgchangestream.InstallSchema(ctx, db, pgchangestream.SchemaOptions{}); err != nil {
		return 0, err
	}
	if _, err := db.ExecContext(ctx, demoTableSQL); err != nil {
		return 0, fmt.Errorf("create table %s: %w", demoTable, err)
	}
	if err := pgchangestream.CaptureChanges(ctx, db, demoTable, pgchangestream.SchemaOptions{}); err != nil {
		return 0, err
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM resume_tokens WHERE client_name = $1`, demoClient); err != nil {
		return 0, fmt.Errorf("reset client %s: %w", demoClient, err)
	}
	err = db.QueryRowContext(ctx, `SELECT coalesce(max(id), 0) FROM datastore_changelog WHERE table_name = $1`,
		demoTable).Scan(&baseline)
	if err != nil {
		return 0, fmt.Errorf("read the changelog: %w", err)
	}
	return baseline, nil
}

// writtenRows returns the changelog ids of the demo table after baseline (the rows written, in
// id order) and the newest of their positions.
func writtenRows(ctx context.Context, db *sql.DB, baseline int64) ([]int64, pgchangestream.Position, error) {
	var newest pgchangestream.Position
	positions, err := rowPositions(ctx, db, `SELECT id, changed_at FROM datastore_changelog
		WHERE table_name = $1 AND id > $2 ORDER BY id`, demoTable, baseline)
	if err != nil {
		return nil, newest, fmt.Errorf("read the written rows: %w", err)
	}
	ids := make([]int64, len(positions))
	for i, p := range positions {
		if newest.Before(p) {
			newest = p
		}
		ids[i] = p.ID
	}
	return ids, newest, nil
}

// rowPositions runs query, which selects changelog ids and changed_at, and returns the positions.
func rowPositions(ctx context.Context, db *sql.DB, query string, args ...any) ([]pgchangestream.Position, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []pgchangestream.Position
	for rows.Next() {
		var p pgchangestream.Position
		if err := rows.Scan(&p.ID, &p.ChangedAt); err != nil {
			return nil, err
		}
		p.ChangedAt = p.ChangedAt.Truncate(time.Microsecond).UTC()
		out = append(out, p)
	}
	return out, rows.Err()
}

// lostIDs returns the ids that were never delivered.
func lostIDs(ids []int64, seen map[int64]int) []int64 {
	var lost []int64
	for _, id := range ids {
		if seen[id] == 0 {
			lost = append(lost, id)
		}
	}
	return lost
}

// lateRows returns how many of the lost rows lie behind the saved position of some crash: rows
// whose transactions started before that position's row but that committed after it was read,
// around the crash, before a watcher handled their NOTIFY.
func lateRows(ctx context.Context, db *sql.DB, lost []int64, crashSaved []pgchangestream.Position) (int, error) {
	if len(lost) == 0 || len(crashSaved) == 0 {
		return 0, nil
	}
	positions, err := rowPositions(ctx, db, `SELECT id, changed_at FROM datastore_changelog WHERE id = ANY($1)`, lost)
	if err != nil {
		return 0, fmt.Errorf("read the lost rows: %w", err)
	}
	late := 0
	for _, p := range positions {
		if slices.ContainsFunc(crashSaved, p.Before) {
			late++
		}
	}
	return late, nil
}

// summarize checks every written id against the deliveries and prints the summary, whose last
// line is "demo: written=N delivered=M replayed=R lost=L". It returns an error if a row was lost.
func summarize(out *progressLine, ids []int64, seen map[int64]int, ackErrors uint64, late int) error {
	written := make(map[int64]bool, len(ids))
	for _, id := range ids {
		written[id] = true
	}
	var delivered, replayed int
	var extra []int64
	for id, n := range seen {
		delivered += n
		replayed += n - 1
		if !written[id] {
			extra = append(extra, id)
		}
	}
	lost := lostIDs(ids, seen)
	if ackErrors > 0 {
		out.println(fmt.Sprintf("demo: %d acknowledgements failed to save (retried by the next ones)", ackErrors))
	}
	if len(extra) > 0 {
		slices.Sort(extra)
		out.println(fmt.Sprintf("demo: %d delivered rows were not written by the demo: ids %v", len(extra), firstIDs(extra)))
	}
	switch {
	case len(lost) == 0:
		out.println(fmt.Sprintf("demo: every written row was delivered; %d deliveries were replays after crashes (at-least-once)", replayed))
	default:
		out.println(fmt.Sprintf("demo: %d written rows were never delivered: ids %v", len(lost), firstIDs(lost)))
		if late > 0 {
			out.println(fmt.Sprintf("demo: %d of them lie behind the position saved at a crash: late commits (their "+
				"transactions started before rows already read) that committed around the crash, before a watcher "+
				"handled their NOTIFY; see \"Restarts and late commits\" in docs/operations.md", late))
		}
	}
	out.println(fmt.Sprintf("demo: written=%d delivered=%d replayed=%d lost=%d", len(ids), delivered, replayed, len(lost)))
	if len(lost) > 0 {
		return fmt.Errorf("%d rows lost", len(lost))
	}
	return nil
}

// firstIDs returns at most the first ten ids, for messages.
func firstIDs(ids []int64) []int64 {
	return ids[:min(len(ids), 10)]
}
