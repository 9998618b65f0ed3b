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
	"github.com/pgchangestream/pgchangestream/admin"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/pgchangestream/pgchangestream/schema"
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
gets those deliveries again. It installs the schema, creates and captures the table
"`+demoTable+`", and runs concurrent writers that insert, update and delete
orders for --duration (longer when the crashes have not all happened by then), each statement
its own transaction. A consumer (client "`+demoClient+`", hybrid mode)
records every event it receives and acknowledges the newest every `+strconv.Itoa(demoAckEvery)+` events (and once none
has arrived for `+demoAckIdle.String()+`), so it always holds some deliveries unacknowledged.

The consumer is crashed --crashes times at random moments and restarted with a new watcher.
The writers never stop for a crash: transactions are in flight when the consumer dies, commit
while no watcher runs, and commit out of order (a transaction that started before rows the
consumer already read commits after them). At each crash the demo
  1. crashes the consumer: it cancels the watcher's Start context without a Flush and closes
     its connection pool, so nothing more is saved, and the deliveries not yet acknowledged
     stay pending (Close then only releases the goroutines: its final save fails on the closed
     pool);
  2. restarts it after a random pause of up to `+maxDowntime.String()+`: the new watcher resumes from the saved
     position, delivers the unacknowledged deliveries again, and every row committed meanwhile.

The schema the demo installs is read in commit order (snapshot deltas), so no committed
row may be missed, however its commit lines up with the crashes. Each crash line reports the
deliveries left unacknowledged, all delivered again after the restart, and the saved position.

After the writers stop, the consumer drains until every written row is delivered,
--drain-timeout passes, or nothing has been delivered for 2s with rows still missing. Then
every changelog row of "`+demoTable+`" is checked against the deliveries, and the demo says what it
checked. The last line is
  demo: written=N delivered=M replayed=R lost=L
(replayed: deliveries beyond the first of a row; lost: rows never delivered). Exits 1 if any
row was lost.

Without --dsn it starts a throwaway PostgreSQL from the local server binaries (initdb and
postgres) and removes it afterwards. With --dsn it works in that database: it creates
"`+demoTable+`" if missing, starts client "`+demoClient+`" afresh and deletes its token at
the end.`, stdout, stderr)
	var f demoFlags
	c.fs.StringVar(&f.dsn, "dsn", "", "database to use (default: start a throwaway PostgreSQL)")
	c.fs.IntVar(&f.writers, "writers", 4, "concurrent writers")
	c.fs.Float64Var(&f.rate, "rate", 500, "rows written per second, all writers together")
	c.fs.DurationVar(&f.duration, "duration", 15*time.Second, "how long the writers write at least")
	c.fs.IntVar(&f.crashes, "crashes", 5, "consumer crashes, at random moments while writing")
	c.fs.Uint64Var(&f.seed, "seed", 0, "seed of the random choices (default: random, printed)")
	c.fs.DurationVar(&f.progress, "progress", time.Second, "interval of the progress report")
	c.fs.DurationVar(&f.drainTimeout, "drain-timeout", 30*time.Second,
		"how long to wait, after writing, for delivery of every row written")
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
	defer func() {
		_ = consumer.stop(ctx)
		cleanCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		if err := deleteDemoToken(cleanCtx, db); err != nil {
			c.warn("delete the token of client %s: %v", demoClient, err)
		}
	}()
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

	ids, err := writtenRows(ctx, db, baseline)
	if err != nil {
		return err
	}
	drainStart := time.Now()
	drained, err := r.drain(ctx, ids)
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
		out.println(fmt.Sprintf("demo: drain stopped after %v: nothing was delivered for %v, "+
			"and rows are still missing", took, drainSettle))
	default:
		out.println(fmt.Sprintf("demo: drain timed out after %v", f.drainTimeout))
	}
	return summarize(out, ids, consumer.deliveries(), consumer.ackErrors.Load(), r.crashed)
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
	if _, err := schema.Install(ctx, db, schema.Options{}); err != nil {
		return 0, err
	}
	if _, err := db.ExecContext(ctx, demoTableSQL); err != nil {
		return 0, fmt.Errorf("create table %s: %w", demoTable, err)
	}
	if _, err := schema.Capture(ctx, db, demoTable, schema.Options{}); err != nil {
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

// writtenRows returns the changelog ids of the demo table after baseline: the rows committed
// by the writers, in id order.
func writtenRows(ctx context.Context, db *sql.DB, baseline int64) ([]int64, error) {
	rows, err := db.QueryContext(ctx, `SELECT id FROM datastore_changelog
		WHERE table_name = $1 AND id > $2 ORDER BY id`, demoTable, baseline)
	if err != nil {
		return nil, fmt.Errorf("read the written rows: %w", err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("read the written rows: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the written rows: %w", err)
	}
	return ids, nil
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

// summarize checks every written id against the deliveries across crashes consumer crashes and
// prints the summary: a line that says what was checked, then the last line, "demo: written=N
// delivered=M replayed=R lost=L". It returns an error if a row was lost.
func summarize(out *progressLine, ids []int64, seen map[int64]int, ackErrors uint64, crashes int) error {
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
	if len(lost) == 0 {
		out.println(fmt.Sprintf("demo: checked: every committed row (%d) was delivered at least once across %d "+
			"consumer crashes, with the writers committing through every crash; %d delivered again after crashes "+
			"(at-least-once); 0 lost", len(ids), crashes, replayed))
	} else {
		out.println(fmt.Sprintf("demo: checked: %d of the %d committed rows were never delivered across %d consumer "+
			"crashes: ids %v", len(lost), len(ids), crashes, firstIDs(lost)))
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

// deleteDemoToken deletes the demo client's token, waiting while the sessions of a crashed
// consumer still hold the client's lock (they end a moment after the crash).
func deleteDemoToken(ctx context.Context, db *sql.DB) error {
	for {
		_, err := admin.DeleteToken(ctx, db, demoClient, admin.Options{})
		if !errors.Is(err, pgchangestream.ErrClientActive) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}
