package pgchangestream

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/listen"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// Messages the watcher logs, counted by the fault tests to prove that a fault reached it.
const (
	logReadFailed   = "changelog read failed; retrying from the same position"
	logListenLost   = "LISTEN connection lost; reconnecting"
	logListenFailed = "LISTEN connection failed; retrying"
	logListening    = "listening"
)

// TestLiveServerRestart: contract rules 11 and 15 and the at-least-once promise across a server
// restart (fast shutdown and start on the same port), on the upgraded schema in every mode, while
// concurrent writers insert (holding their transactions open for a random moment, so commit
// order and insert order differ) and a consumer acks every event. Reads fail and are retried
// from the same cursor, the LISTEN connection reconnects and catches up, acks that fail while
// the server is down are retried by the consumer; every row in the changelog is delivered, and
// after the final ack a restart delivers nothing.
func TestLiveServerRestart(t *testing.T) {
	srv := pgtest.NewServer(t, pgtest.Options{})
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			runServerFault(t, srv, mode, srv.Restart)
		})
	}
}

// TestLiveServerCrash: the same guarantees as [TestLiveServerRestart] when the server is killed
// (SIGKILL) and restarted with crash recovery: every commit the writer saw succeed survives and
// is delivered (rules 11 and 15).
func TestLiveServerCrash(t *testing.T) {
	srv := pgtest.NewServer(t, pgtest.Options{})
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			runServerFault(t, srv, mode, srv.Kill)
		})
	}
}

// runServerFault streams from a fresh database on srv while concurrent writers insert and a
// consumer acks each event, applies fault in the middle, then checks that nothing was lost.
func runServerFault(t *testing.T, srv *pgtest.Server, mode Mode, fault func(context.Context) error) {
	e := newLiveOn(t, srv)
	logs := newLogCounter()
	cfg := e.config(mode)
	cfg.Logger = slog.New(logs)
	cfg.PollInterval = 5 * time.Millisecond
	w := e.start(cfg)
	require.Eventually(t, func() bool { return w.Stats().CheckpointWrites > 0 }, 10*time.Second, 5*time.Millisecond)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu        sync.Mutex
		delivered = map[int64]int{} // id → deliveries
		ackErrs   int
	)
	var consumer sync.WaitGroup
	consumer.Go(func() {
		for {
			var ev EventWithToken
			select {
			case <-ctx.Done():
				return
			case got, ok := <-w.Events():
				if !ok {
					t.Errorf("Events closed (Err: %v)", w.Err())
					return
				}
				ev = got
			}
			id, err := strconv.ParseInt(string(ev.ResumeToken), 10, 64)
			if err != nil {
				t.Errorf("delivery with token %q: %v", ev.ResumeToken, err)
				return
			}
			mu.Lock()
			delivered[id]++
			mu.Unlock()
			for w.MarkProcessed(context.Background(), ev.ResumeToken) != nil { // the server is down: retry
				mu.Lock()
				ackErrs++
				mu.Unlock()
				if !backoff.Sleep(ctx, 20*time.Millisecond) {
					return
				}
			}
		}
	})
	writers := e.startWriters(crashWriters, 5*time.Millisecond)
	rowsAtLeast := func(n int) func() bool {
		return func() bool {
			rows, err := faultChangelog(ctx, e.db)
			return err == nil && len(rows) >= n
		}
	}
	require.Eventually(t, rowsAtLeast(50), 30*time.Second, 10*time.Millisecond)
	rows, err := faultChangelog(ctx, e.db)
	require.NoError(t, err)
	require.NoError(t, fault(ctx))
	require.Eventually(t, rowsAtLeast(len(rows)+50), 60*time.Second, 10*time.Millisecond, "the writers do not recover")
	writers.stop()

	rows, err = faultChangelog(ctx, e.db)
	require.NoError(t, err)
	missing := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, p := range rows {
			if delivered[p.ID] == 0 {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(60 * time.Second)
	for missing() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	lost := missing()
	require.Zero(t, lost, "%d of %d committed rows were never delivered; stats %+v", lost, len(rows), w.Stats())
	waitFor(t, func() bool { return w.Stats().Pending == 0 }, "every delivery is acknowledged")
	cancel()
	consumer.Wait()

	inDB := map[int64]bool{}
	for _, p := range rows {
		inDB[p.ID] = true
	}
	mu.Lock()
	defer mu.Unlock()
	for id := range writers.rows {
		require.True(t, inDB[id], "row %d was committed but is not in the changelog", id)
	}
	require.Len(t, delivered, len(rows), "delivered rows that are not in the changelog")
	if mode != ModePolling {
		// Hybrid mode delivers through its fallback polls meanwhile, so the LISTEN reconnect, in
		// backoff of up to listen.RetryMax, can come after the last delivery: wait for it.
		require.Eventually(t, func() bool { return logs.count(logListening) >= 2 }, 4*listen.RetryMax, 10*time.Millisecond,
			"the LISTEN connection did not come back")
	}
	require.NoError(t, w.Close(context.Background()))
	e.requireRestartDelivers(mode, nil, "everything was acknowledged")
	if mode == ModePolling {
		require.Positive(t, logs.count(logReadFailed), "no read failed: the fault missed the watcher")
	} else {
		require.Positive(t, logs.count(logListenLost), "the LISTEN connection was not lost")
		require.GreaterOrEqual(t, logs.count(logListening), 2, "the LISTEN connection did not come back")
	}
	t.Logf("%d rows (%d commits seen, %d transactions failed), %d acks retried, %d reads failed, LISTEN lost %d times",
		len(rows), len(writers.rows), writers.errs, ackErrs, logs.count(logReadFailed), logs.count(logListenLost))
}

// TestLiveListenTerminated: contract rule 11, "every LISTEN (re)connect is followed by a
// catch-up read". In notify mode (no fallback poll) the LISTEN connection is terminated and,
// while new connections to the database are refused (so the gap is certain), rows are
// committed: their notifications are lost and nothing is delivered. Once connections are
// allowed again the listener reconnects, the catch-up read delivers the rows committed during
// the gap, and notifications drive deliveries again. Then a few quick rounds without the gate:
// terminate and insert at once, racing the reconnect; every row is delivered either way.
func TestLiveListenTerminated(t *testing.T) {
	ctx := context.Background()
	e := newLive(t)
	app := fmt.Sprintf("pgcs-listen-%08x", rand.Uint32())
	logs := newLogCounter()
	cfg := e.config(ModeNotify)
	cfg.ConnString = withAppName(e.dsn, app)
	cfg.Logger = slog.New(logs)
	w := e.start(cfg)
	logs.waitFor(t, logListening, 1, 10*time.Second)
	require.Eventually(t, func() bool { return w.Stats().CheckpointWrites > 0 }, 10*time.Second, 5*time.Millisecond)
	first := e.insert(1)
	require.Equal(t, first, receiveWithin(t, w, 1, 10*time.Second))

	// The gate: refuse new connections to this database (the LISTEN reconnect among them).
	var dbName string
	require.NoError(t, e.db.QueryRowContext(ctx, `SELECT current_database()`).Scan(&dbName))
	admin, err := sql.Open("pgx", e.srv.DSN())
	require.NoError(t, err)
	gate := func(allow bool) {
		t.Helper()
		_, err := admin.ExecContext(ctx, `ALTER DATABASE `+changelog.Quote(dbName)+` ALLOW_CONNECTIONS `+strconv.FormatBool(allow))
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		_, _ = admin.ExecContext(ctx, `ALTER DATABASE `+changelog.Quote(dbName)+` ALLOW_CONNECTIONS true`)
		_ = admin.Close()
	})
	pinned, err := e.db.Conn(ctx) // opened before the gate closes: the writer during the gap
	require.NoError(t, err)
	defer pinned.Close()

	gate(false)
	n, err := e.srv.TerminateBackends(ctx, app)
	require.NoError(t, err)
	require.Equal(t, 1, n, "LISTEN connections terminated")
	var gap []int64
	for range 3 {
		tx, err := pinned.BeginTx(ctx, nil)
		require.NoError(t, err)
		gap = append(gap, insertItem(t, tx))
		require.NoError(t, tx.Commit())
	}
	logs.waitFor(t, logListenFailed, 1, 10*time.Second) // the listener tried and failed: a real gap
	requireNothingWithin(t, w, 300*time.Millisecond)    // no NOTIFY reached it, and notify mode does not poll
	require.Equal(t, 1, logs.count(logListening))
	gate(true)
	require.Equal(t, gap, receiveWithin(t, w, len(gap), 15*time.Second), "rows committed during the gap")
	require.Equal(t, 2, logs.count(logListening))
	after := e.insert(1) // notifications drive deliveries again
	require.Equal(t, after, receiveWithin(t, w, 1, 10*time.Second))

	// Quick rounds: the rows commit before or after the reconnect; both paths must deliver them.
	for round := range 5 {
		logs.waitFor(t, logListening, 2+round, 10*time.Second) // reconnected after the last round
		n, err := e.srv.TerminateBackends(ctx, app)
		require.NoError(t, err)
		require.Equal(t, 1, n, "round %d: LISTEN connections terminated", round)
		ids := e.insert(2)
		require.Equal(t, ids, receiveWithin(t, w, 2, 15*time.Second), "round %d", round)
		after = ids[1:]
	}
	logs.waitFor(t, logListening, 2+5, 10*time.Second)
	require.NoError(t, w.MarkProcessed(ctx, tok(after[0])))
	require.Equal(t, e.position(after[0]), e.savedToken("c"))
}

// TestLivePollingLateRowBelowCursor states the known limit of polling on the legacy schema
// (contract rule 11 and its "Known limits"): transaction A inserts row a and stays open (a.changed_at is A's start time),
// B inserts row b and commits; the polling watcher delivers b and its cursor moves to b's
// position, above a. When A commits, a is below the cursor: polling never reads it (asserted
// over 30 poll intervals). Hybrid mode recovers it through the NOTIFY that names a (tested with
// the contract scenarios). What a restart does depends on the saved token, with three clients
// in the same scenario:
//
//   - "crashed": b not acknowledged, the watcher dies (no final save). The saved token is still
//     the start position, below a, so the restarted watcher delivers a, then b: a is replayed.
//   - "acked": b acknowledged (saved token = b's position), then the watcher dies. The restart
//     resumes after b and never delivers a.
//   - "closed": b not acknowledged, Close saves the checkpoint: the predecessor of b,
//     (b.changed_at, b.id-1), still above a. The restart delivers b again, but not a.
func TestLivePollingLateRowBelowCursor(t *testing.T) {
	ctx := context.Background()
	e := newLegacy(t)
	cfg := e.config(ModePolling)
	cfg.PollInterval = 10 * time.Millisecond
	seed := e.insert(1)[0]
	clients := []string{"crashed", "acked", "closed"}
	ws := map[string]*crashable{}
	for _, c := range clients {
		cfg.ClientName = c
		ws[c] = e.startCrashable(cfg)
		require.Eventually(t, func() bool { return ws[c].Stats().CheckpointWrites > 0 }, 10*time.Second, 5*time.Millisecond)
		require.Equal(t, e.position(seed), e.savedToken(c), "start position")
	}

	txA, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = txA.Rollback() }()
	a := insertItem(t, txA)
	b := e.insert(1)[0]
	posB := e.position(b)
	for _, c := range clients {
		require.Equal(t, []int64{b}, receiveWithin(t, ws[c].Watcher, 1, 10*time.Second), c)
	}
	require.NoError(t, txA.Commit())
	posA := e.position(a)
	require.True(t, posA.Before(posB), "a %v is below b %v", posA, posB)
	requireNothingWithin(t, ws["crashed"].Watcher, 30*cfg.PollInterval)
	for _, c := range clients {
		requireNothingWithin(t, ws[c].Watcher, cfg.PollInterval)
		require.Equal(t, posB, ws[c].Stats().Cursor, c)
		require.Equal(t, e.position(seed), e.savedToken(c), "%s: nothing acknowledged yet", c)
	}

	require.NoError(t, ws["acked"].MarkProcessed(ctx, tok(b)))
	require.Equal(t, posB, e.savedToken("acked"))
	ws["crashed"].crash()
	ws["acked"].crash()
	require.NoError(t, ws["closed"].Close(ctx))
	require.Equal(t, e.position(seed), e.savedToken("crashed"), "a crash saves nothing")
	require.Equal(t, posB, e.savedToken("acked"))
	predB := Position{ChangedAt: posB.ChangedAt, ID: b - 1}
	require.Equal(t, predB, e.savedToken("closed"), "Close saves the predecessor of the unacknowledged b")
	require.True(t, posA.Before(predB), "the predecessor of b is still above a")

	restarted := map[string]*Watcher{}
	for _, c := range clients {
		cfg.ClientName = c
		restarted[c] = e.start(cfg)
	}
	require.Equal(t, []int64{a, b}, receiveWithin(t, restarted["crashed"], 2, 10*time.Second), "crashed: a is replayed")
	require.Equal(t, []int64{b}, receiveWithin(t, restarted["closed"], 1, 10*time.Second), "closed: b again, a never")
	requireNothingWithin(t, restarted["acked"], 30*cfg.PollInterval)
	next := e.insert(1)[0]
	for _, c := range clients {
		require.Equal(t, []int64{next}, receiveWithin(t, restarted[c], 1, 10*time.Second), "%s: the next row, a never", c)
	}
}

// faultRow is a row committed by faultInsert: its changelog position, and when its commit was
// sent and when it returned (the row became visible in between).
type faultRow struct {
	pos                    Position
	commitSent, commitDone time.Time
}

// faultInsert inserts one item in its own transaction, holding it open for hold before the
// commit, and returns its changelog row. It reports errors instead of failing the test, for
// writer goroutines.
func faultInsert(ctx context.Context, db *sql.DB, hold time.Duration) (faultRow, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return faultRow{}, err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `INSERT INTO items (n) VALUES (1)`); err != nil {
		return faultRow{}, err
	}
	var (
		id int64
		ts time.Time
	)
	// The trigger's nextval is the session's last; now() is the changed_at it wrote.
	if err := tx.QueryRowContext(ctx, `SELECT lastval(), now()`).Scan(&id, &ts); err != nil {
		return faultRow{}, err
	}
	if hold > 0 {
		time.Sleep(hold) // keep the transaction open, so that later ones may commit first
	}
	sent := time.Now()
	if err := tx.Commit(); err != nil {
		return faultRow{}, err
	}
	return faultRow{pos: position.Make(ts, id), commitSent: sent, commitDone: time.Now()}, nil
}

// faultChangelog returns the positions of the captured table's changelog rows in position order.
func faultChangelog(ctx context.Context, db *sql.DB) ([]Position, error) {
	rows, err := db.QueryContext(ctx, `SELECT changed_at, id FROM datastore_changelog
		WHERE table_name = $1 ORDER BY changed_at, id`, liveTable)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ps []Position
	for rows.Next() {
		var (
			ts time.Time
			id int64
		)
		if err := rows.Scan(&ts, &id); err != nil {
			return nil, err
		}
		ps = append(ps, position.Make(ts, id))
	}
	return ps, rows.Err()
}

// withAppName returns dsn with application_name set to app.
func withAppName(dsn, app string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("application_name", app)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " application_name=" + app
}

// logCounter is a slog handler that counts records by message, so that a test can see that a
// fault reached the watcher and wait for it to recover, and keeps the text of warnings.
type logCounter struct {
	mu       sync.Mutex
	counts   map[string]int
	warnings []string      // message and attributes of each record at level Warn or above
	changed  chan struct{} // closed and replaced on every record
}

func newLogCounter() *logCounter {
	return &logCounter{counts: map[string]int{}, changed: make(chan struct{})}
}

func (c *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCounter) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *logCounter) WithGroup(string) slog.Handler            { return c }

func (c *logCounter) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts[r.Message]++
	if r.Level >= slog.LevelWarn {
		text := r.Message
		r.Attrs(func(a slog.Attr) bool {
			text += " " + a.String()
			return true
		})
		c.warnings = append(c.warnings, text)
	}
	close(c.changed)
	c.changed = make(chan struct{})
	return nil
}

// count returns how many records had this message.
func (c *logCounter) count(msg string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[msg]
}

// warningsMentioning returns the warnings whose message or attributes contain s.
func (c *logCounter) warningsMentioning(s string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, w := range c.warnings {
		if strings.Contains(w, s) {
			out = append(out, w)
		}
	}
	return out
}

// waitFor waits until n records had this message, failing the test after d.
func (c *logCounter) waitFor(t *testing.T, msg string, n int, d time.Duration) {
	t.Helper()
	timeout := time.After(d)
	for {
		c.mu.Lock()
		got, changed := c.counts[msg], c.changed
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("log %q: %d records in %v, want %d", msg, got, d, n)
		}
	}
}
