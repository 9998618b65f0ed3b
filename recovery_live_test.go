package pgchangestream

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/listen"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
)

// TestLiveCrashReusesTransactionIDs: contract rule 17. The last transactions before a crash
// roll back, or commit asynchronously; their WAL records are not flushed, so crash recovery
// hands their transaction ids out again. A watcher that read a snapshot in which those ids had
// finished must still deliver every row committed after the crash, in every mode:
//
//   - quick: the watcher reads again as soon as the server is back;
//   - late: the watcher is stuck behind a full Events channel while, after the crash, two rows
//     are committed by transactions with reused ids and then thousands of transactions push the
//     counter past every id it saw, so the counter no longer looks as if it went back;
//   - stopped: no watcher runs during the crash; one starts afterwards from the saved token.
//
// Each trial first checks that the crash really rewound the counter (the current snapshot's
// xmax is at or below the ids the watcher saw finish), so it cannot pass vacuously.
func TestLiveCrashReusesTransactionIDs(t *testing.T) {
	srv := pgtest.NewServer(t, pgtest.Options{})
	ctx := context.Background()
	admin, err := sql.Open("pgx", srv.DSN())
	require.NoError(t, err)
	defer admin.Close()
	// Nothing but the test's own commits may flush WAL: a WAL writer round or an autovacuum
	// commit would make the rollbacks durable, and the ids would not be reused.
	for _, q := range []string{`ALTER SYSTEM SET wal_writer_delay = '10s'`, `ALTER SYSTEM SET wal_writer_flush_after = '1GB'`,
		`ALTER SYSTEM SET autovacuum = off`,
		`SELECT pg_reload_conf()`} {
		_, err := admin.ExecContext(ctx, q)
		require.NoError(t, err)
	}
	for _, variant := range []string{"quick", "late", "stopped"} {
		for _, mode := range allModes {
			t.Run(variant+"/"+string(mode), func(t *testing.T) {
				for try := 1; try <= 3; try++ {
					if runReuseTrial(t, srv, mode, variant) {
						return
					}
					t.Logf("try %d: something flushed the WAL before the crash, so no id was reused; trying again", try)
				}
				t.Fatal("the crash never rewound the transaction counter: the trial tests nothing")
			})
		}
	}
}

// runReuseTrial runs one trial of TestLiveCrashReusesTransactionIDs. It reports false, having
// checked nothing, when the crash did not rewind the transaction counter.
func runReuseTrial(t *testing.T, srv *pgtest.Server, mode Mode, variant string) bool {
	ctx := context.Background()
	e := newLiveOn(t, srv)
	cfg := e.config(mode)
	cfg.PollInterval = 5 * time.Millisecond
	cfg.DisableProcessedFlag = true // its marker's commits would flush the WAL the trial needs unflushed
	if variant == "late" {
		cfg.BufferSize = 1
	}
	w := e.start(cfg)
	waitStartSaved(t, w)
	first := e.insert(1)
	require.Equal(t, first, receiveWithin(t, w, 1, liveWait))
	require.NoError(t, w.MarkProcessed(ctx, tok(first[0]))) // a durable token before the crash

	if variant == "stopped" {
		require.NoError(t, w.Close(ctx))
	}
	// The unflushed tail of the WAL: a rollback, then asynchronous commits (which notify).
	seen := e.rollbackXid()
	lost := 1
	if variant == "late" {
		lost = 2
	}
	var lostIDs []int64
	for range lost {
		id, xid := e.asyncCommit()
		lostIDs = append(lostIDs, id)
		seen = max(seen, xid)
	}
	switch variant {
	case "quick": // the watcher delivers the row and reads on to a delta that starts past it
		require.Equal(t, lostIDs, receiveWithin(t, w, 1, liveWait))
		waitFor(t, func() bool {
			c := w.Stats().Cursor
			return c.AtDeltaStart() && c.Span.Base.Xmax > seen
		}, "the watcher reads a snapshot in which the lost transactions have finished")
	case "late": // the first row waits in the channel; the reader blocks sending the second
		waitFor(t, func() bool { return w.Stats().Cursor.ID == lostIDs[1] }, "the reader reads both rows")
	}

	require.NoError(t, srv.Kill(ctx))
	xmax := e.currentXmax()
	if xmax > seen {
		return false
	}
	after := e.insertRetrying(2)
	if variant == "late" {
		for range 3000 {
			_, err := e.db.ExecContext(ctx, `SELECT pg_current_xact_id()`)
			require.NoError(t, err)
		}
		require.Greater(t, e.currentXmax(), seen+1000, "the counter passes every id seen before the crash")
	}
	if variant == "stopped" {
		cfg.BufferSize = 0
		w = e.start(cfg)
	}
	// Notify mode reads again only once its LISTEN connection is back, after a backoff of up to
	// listen.RetryMax: allow for it on a loaded machine.
	got := receiveUntil(t, w, after, liveWait+2*listen.RetryMax)
	t.Logf("counter back at %d after %d; rows %v committed after the crash delivered among %v", xmax, seen, after, got)
	if variant != "stopped" {
		require.Positive(t, w.Stats().Rewinds, "the watcher did not go back to its saved token")
	}
	return true
}

// rollbackXid runs a transaction that inserts a row and rolls back, and returns its id.
func (e *liveEnv) rollbackXid() uint64 {
	e.t.Helper()
	tx := e.openTx()
	insertItem(e.t, tx)
	var xid uint64
	require.NoError(e.t, tx.QueryRow(`SELECT pg_current_xact_id()::text::bigint`).Scan(&xid))
	require.NoError(e.t, tx.Rollback())
	return xid
}

// asyncCommit inserts a row in a transaction committed with synchronous_commit off, and returns
// its changelog id and transaction id.
func (e *liveEnv) asyncCommit() (int64, uint64) {
	e.t.Helper()
	tx := e.openTx()
	_, err := tx.Exec(`SET LOCAL synchronous_commit = off`)
	require.NoError(e.t, err)
	id := insertItem(e.t, tx)
	var xid uint64
	require.NoError(e.t, tx.QueryRow(`SELECT pg_current_xact_id()::text::bigint`).Scan(&xid))
	require.NoError(e.t, tx.Commit())
	return id, xid
}

// currentXmax returns the xmax of the current snapshot (without taking a transaction id),
// retrying while connections of the pool still point at the server before its restart.
func (e *liveEnv) currentXmax() uint64 {
	e.t.Helper()
	var xmax uint64
	waitFor(e.t, func() bool {
		return e.db.QueryRow(`SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&xmax) == nil
	}, "the server answers again")
	return xmax
}

// insertRetrying inserts n rows, one transaction each, retrying a transaction that fails on a
// connection from before a server restart, and returns their changelog ids.
func (e *liveEnv) insertRetrying(n int) []int64 {
	e.t.Helper()
	var ids []int64
	for range n {
		var id int64
		waitFor(e.t, func() bool {
			tx, err := e.db.Begin()
			if err != nil {
				return false
			}
			defer func() { _ = tx.Rollback() }()
			var record string
			if tx.QueryRow(`INSERT INTO items (n) VALUES (1) RETURNING id::text`).Scan(&record) != nil ||
				tx.QueryRow(`SELECT max(id) FROM datastore_changelog WHERE record_id::text = $1`, record).Scan(&id) != nil {
				return false
			}
			return tx.Commit() == nil
		}, "an insert succeeds")
		ids = append(ids, id)
	}
	return ids
}

// receiveUntil takes deliveries until every id of want was delivered, failing the test if that
// does not happen within d, and returns the ids delivered.
func receiveUntil(t *testing.T, w *Watcher, want []int64, d time.Duration) []int64 {
	t.Helper()
	timeout := time.After(d)
	var got []int64
	for {
		missing := slices.DeleteFunc(slices.Clone(want), func(id int64) bool { return slices.Contains(got, id) })
		if len(missing) == 0 {
			return got
		}
		select {
		case ev, ok := <-w.Events():
			require.True(t, ok, "Events closed (Err: %v)", w.Err())
			id, err := strconv.ParseInt(string(ev.ResumeToken), 10, 64)
			require.NoError(t, err)
			got = append(got, id)
		case <-timeout:
			t.Fatalf("%s", fmt.Sprintf("rows %v never delivered (delivered %v); stats %+v", missing, got, w.Stats()))
		}
	}
}
