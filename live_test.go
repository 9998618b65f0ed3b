package pgchangestream

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/schema"
)

// TestMain stops the shared test server after the tests and fails the run if a goroutine is
// left behind.
func TestMain(m *testing.M) {
	code := pgtest.RunMain(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left after the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// liveTemplate is a database with the schema installed (schema.Install: the upgraded schema,
// read in snapshot deltas) and the table "items" captured; live tests start from a copy of it,
// or of legacyTemplate.
const liveTemplate = "pgchangestream_live"

// liveTable is the captured table of every live test.
const liveTable = "items"

func setupLiveTemplate(ctx context.Context, db *sql.DB) error {
	if err := errOf(schema.Install(ctx, db, schema.Options{})); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE items (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
		n int NOT NULL,
		doc jsonb NOT NULL DEFAULT '{}')`); err != nil {
		return err
	}
	return errOf(schema.Capture(ctx, db, liveTable, schema.Options{}))
}

// liveEnv is one live test's database on a real PostgreSQL.
type liveEnv struct {
	t   *testing.T
	srv *pgtest.Server
	db  *sql.DB
	dsn string
}

// newLive gives the test a fresh database on the shared server.
func newLive(t *testing.T) *liveEnv {
	t.Helper()
	return newLiveOn(t, pgtest.Shared(t))
}

// newLiveOn gives the test a fresh database on srv (a server of its own for fault tests).
func newLiveOn(t *testing.T, srv *pgtest.Server) *liveEnv {
	t.Helper()
	return newEnvFrom(t, srv, liveTemplate, setupLiveTemplate)
}

// newEnvFrom gives the test a fresh copy of a template database on srv, creating the template
// with setup on first use.
func newEnvFrom(t *testing.T, srv *pgtest.Server, template string, setup func(context.Context, *sql.DB) error) *liveEnv {
	t.Helper()
	require.NoError(t, srv.CreateTemplate(context.Background(), template, setup))
	db, dsn := srv.NewDatabase(t, template)
	return &liveEnv{t: t, srv: srv, db: db, dsn: dsn}
}

// config returns a watcher config for this database: client "c", table items, the given mode
// (with a LISTEN connection string unless polling), quick fallback polls.
func (e *liveEnv) config(mode Mode) Config {
	cfg := Config{
		DB: e.db, ClientName: "c", TableName: liveTable, Mode: mode, Logger: quietLogger,
		FallbackPollInterval: 200 * time.Millisecond,
	}
	if mode != ModePolling {
		cfg.ConnString = e.dsn
	}
	return cfg
}

// start starts a watcher closed at the end of the test.
func (e *liveEnv) start(cfg Config) *Watcher {
	e.t.Helper()
	w, err := New(cfg)
	require.NoError(e.t, err)
	w.Start(context.Background())
	e.t.Cleanup(func() { _ = w.Close(context.Background()) })
	return w
}

// insert inserts n rows, one transaction each, and returns their changelog ids in order.
func (e *liveEnv) insert(n int) []int64 {
	e.t.Helper()
	ids := make([]int64, 0, n)
	for range n {
		ids = append(ids, e.inTx(func(tx *sql.Tx) int64 { return insertItem(e.t, tx) }))
	}
	return ids
}

// inTx runs f in a transaction and commits it.
func (e *liveEnv) inTx(f func(tx *sql.Tx) int64) int64 {
	e.t.Helper()
	tx, err := e.db.Begin()
	require.NoError(e.t, err)
	id := f(tx)
	require.NoError(e.t, tx.Commit())
	return id
}

// openTx begins a transaction that the test commits when it chooses (rolled back at the end if
// it did not): a writer still in flight.
func (e *liveEnv) openTx() *sql.Tx {
	e.t.Helper()
	tx, err := e.db.Begin()
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

// insertItem inserts one row in tx and returns the id of its changelog row.
func insertItem(t *testing.T, tx *sql.Tx) int64 {
	t.Helper()
	var record string
	require.NoError(t, tx.QueryRow(`INSERT INTO items (n) VALUES (1) RETURNING id::text`).Scan(&record))
	var id int64
	require.NoError(t, tx.QueryRow(`SELECT max(id) FROM datastore_changelog WHERE record_id::text = $1`, record).Scan(&id))
	return id
}

// savedToken returns the legacy position of the client's saved token: its timestamp and
// eventID, the last row it certifies in either schema state.
func (e *liveEnv) savedToken(client string) Position {
	e.t.Helper()
	var raw string
	require.NoError(e.t, e.db.QueryRow(`SELECT resume_token::text FROM resume_tokens WHERE client_name = $1`, client).Scan(&raw))
	p, err := position.DecodeToken([]byte(raw))
	require.NoError(e.t, err)
	return legacyView(p)
}

// legacyView returns the legacy position (timestamp, eventID) of p.
func legacyView(p Position) Position { return position.Make(p.ChangedAt, p.ID) }

// position returns the position of a changelog row.
func (e *liveEnv) position(id int64) Position {
	e.t.Helper()
	var ts time.Time
	require.NoError(e.t, e.db.QueryRow(`SELECT changed_at FROM datastore_changelog WHERE id = $1`, id).Scan(&ts))
	return position.Make(ts, id)
}

// receiveWithin takes n deliveries, failing the test if they do not arrive within d, and
// returns their changelog ids.
func receiveWithin(t *testing.T, w *Watcher, n int, d time.Duration) []int64 {
	t.Helper()
	timeout := time.After(d)
	ids := make([]int64, 0, n)
	for len(ids) < n {
		select {
		case ev, ok := <-w.Events():
			require.True(t, ok, "Events closed after %d of %d deliveries (Err: %v)", len(ids), n, w.Err())
			id, err := strconv.ParseInt(string(ev.ResumeToken), 10, 64)
			require.NoError(t, err)
			ids = append(ids, id)
		case <-timeout:
			t.Fatalf("received %d of %d deliveries in %v: %v; stats %+v", len(ids), n, d, ids, w.Stats())
		}
	}
	return ids
}

// requireRestartDelivers starts a new watcher for client "c" (a restart: it loads the saved
// token) and requires exactly the deliveries want, then nothing more.
func (e *liveEnv) requireRestartDelivers(mode Mode, want []int64, msgAndArgs ...any) {
	e.t.Helper()
	w := e.start(e.config(mode))
	if len(want) > 0 {
		require.Equal(e.t, want, receiveWithin(e.t, w, len(want), liveWait), msgAndArgs...)
	}
	requireNothingWithin(e.t, w, liveQuiet)
}

// requireNothingWithin fails if a delivery arrives within d.
func requireNothingWithin(t *testing.T, w *Watcher, d time.Duration) {
	t.Helper()
	select {
	case ev, ok := <-w.Events():
		if ok {
			t.Fatalf("unexpected delivery %s", ev.ResumeToken)
		}
	case <-time.After(d):
	}
}

func TestLiveSmoke(t *testing.T) {
	for _, mode := range []Mode{ModePolling, ModeHybrid, ModeNotify} {
		t.Run(string(mode), func(t *testing.T) {
			e := newLive(t)
			w := e.start(e.config(mode))
			// The watcher starts after the newest row once it has saved its start position.
			require.Eventually(t, func() bool { return w.Stats().CheckpointWrites > 0 }, 10*time.Second, 5*time.Millisecond)
			ids := e.insert(3)
			require.Equal(t, ids, receiveWithin(t, w, 3, 10*time.Second))
			require.NoError(t, w.MarkProcessed(context.Background(), tok(ids[2])))
			require.Equal(t, e.position(ids[2]), e.savedToken("c"))
		})
	}
}
