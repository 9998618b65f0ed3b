package pgchangestream

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The skip-free scenarios of contract rule 11 on the upgraded schema (schema.Install adds the
// transaction-id column; reads follow commit visibility in snapshot deltas): a row's position is
// fixed at INSERT but it becomes visible at COMMIT, and no committed row may be skipped whatever
// the commit order, in every mode, across restarts.

// TestLiveOutOfOrderCommits proves rule 11 in every mode: transaction A inserts first and commits
// last, B and C commit in between, and R rolls back. Every committed row is delivered exactly once
// while the watcher runs, the rolled-back row never, and after the acks a restart delivers
// nothing again.
func TestLiveOutOfOrderCommits(t *testing.T) {
	runModes(t, allModes, newLive, func(t *testing.T, e *liveEnv, mode Mode) {
		w := e.start(e.config(mode))
		waitStartSaved(t, w)
		got := newDeliveries()
		wait := got.consume(t, w)

		txA := e.openTx()
		a1 := insertItem(t, txA)
		b := e.insert(1)[0]
		txR := e.openTx()
		r := insertItem(t, txR)
		txC := e.openTx()
		c1, c2 := insertItem(t, txC), insertItem(t, txC)
		require.NoError(t, txC.Commit())
		require.NoError(t, txR.Rollback())
		got.requireAll(t, []int64{b, c1, c2}, liveWait, "B and C")
		a2 := insertItem(t, txA)
		require.NoError(t, txA.Commit())
		got.requireAll(t, []int64{a1, a2}, liveWait, "A, committed last")

		got.requireQuiet(t, liveQuiet)
		require.NoError(t, w.Close(context.Background()))
		wait()
		require.Zero(t, got.count(r), "the rolled-back row")
		require.Empty(t, got.repeated(), "delivered twice while the watcher ran")
		require.Equal(t, 5, got.total())
		e.requireRestartDelivers(mode, nil, "everything was acknowledged")
	})
}

// TestLiveTransactionOpenAcrossRestart proves rule 11 across a restart in every mode: transaction A
// inserts while a watcher runs, B commits and is acknowledged, the watcher stops (Close, or the
// end of Start's context), and A commits while no watcher runs. The restarted watcher delivers
// A's row, and not B's again.
func TestLiveTransactionOpenAcrossRestart(t *testing.T) {
	t.Parallel()
	for _, mode := range allModes {
		for _, stop := range []string{"close", "cancel"} {
			t.Run(string(mode)+"/"+stop, func(t *testing.T) {
				t.Parallel()
				e := newLive(t)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				w := e.startCtx(ctx, e.config(mode))
				waitStartSaved(t, w)

				txA := e.openTx()
				a := insertItem(t, txA)
				b := e.insert(1)[0]
				require.Equal(t, []int64{b}, receiveWithin(t, w, 1, liveWait))
				require.NoError(t, w.MarkProcessed(context.Background(), tok(b)))
				if stop == "cancel" {
					cancel()
					requireClosed(t, w)
				} else {
					require.NoError(t, w.Close(context.Background()))
				}
				require.NoError(t, txA.Commit())

				e.requireRestartDelivers(mode, []int64{a}, "A committed while no watcher ran")
			})
		}
	}
}

// TestLiveConcurrentWritersAcrossRestarts proves rule 11 under load in every mode: eight writers
// hold their transactions open 0–30 ms while the watcher is restarted three times (twice with
// Close, once by ending Start's context) and the consumer acknowledges every delivery. Every row
// committed is delivered at least once.
func TestLiveConcurrentWritersAcrossRestarts(t *testing.T) {
	runModes(t, allModes, newLive, func(t *testing.T, e *liveEnv, mode Mode) {
		cfg := e.config(mode)
		cfg.PollInterval = 5 * time.Millisecond
		got := newDeliveries()
		run := func(stop string) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := e.startCtx(ctx, cfg)
			wait := got.consume(t, w)
			time.Sleep(400 * time.Millisecond)
			if stop == "cancel" {
				cancel()
			} else {
				require.NoError(t, w.Close(context.Background()))
			}
			wait()
		}

		first := e.start(cfg)
		waitStartSaved(t, first)
		require.NoError(t, first.Close(context.Background()))
		writers := e.startWriters(8, 30*time.Millisecond)
		for _, stop := range []string{"close", "cancel", "close"} {
			run(stop)
		}
		w := e.start(cfg)
		got.consume(t, w)
		time.Sleep(400 * time.Millisecond)
		writers.stop()
		require.Zero(t, writers.errs, "writer errors: %v", writers.lastErr)

		committed := e.idsInOrder()
		require.Len(t, committed, writers.committed())
		got.requireAll(t, committed, liveWait, "across 3 restarts")
		t.Logf("%d rows committed, %d deliveries, %d rows delivered more than once",
			len(committed), got.total(), len(got.repeated()))
	})
}

// TestLiveBigTransactionOvertaken proves rule 11 for a large transaction in hybrid mode: it inserts
// 50,000 rows, one row committed after it began overtakes it, and then it commits. Every row is
// delivered exactly once.
func TestLiveBigTransactionOvertaken(t *testing.T) {
	t.Parallel()
	const n = 50_000
	e := newLive(t)
	cfg := e.config(ModeHybrid)
	cfg.BatchSize, cfg.BufferSize = 1000, 1000
	cfg.CheckpointInterval = 100 * time.Millisecond // acknowledge 50,000 rows without a save each
	w := e.start(cfg)
	waitStartSaved(t, w)
	got := newDeliveries()
	wait := got.consume(t, w)

	big := e.openTx()
	_, err := big.Exec(`INSERT INTO items (n) SELECT g FROM generate_series(1, $1::int) g`, n)
	require.NoError(t, err)
	b := e.insert(1)[0]
	got.requireAll(t, []int64{b}, liveWait, "the row that overtook the big transaction")
	require.NoError(t, big.Commit())

	all := e.idsInOrder()
	require.Len(t, all, n+1)
	got.requireAll(t, all, 60*time.Second, "the big transaction")
	got.requireQuiet(t, liveQuiet)
	require.NoError(t, w.Close(context.Background()))
	wait()
	require.Empty(t, got.repeated(), "delivered twice while the watcher ran")
}

// TestLiveNewClientStartsAtSnapshot proves rule 14 on the upgraded schema in every mode: a client
// without a saved token starts at the current snapshot. Rows committed before Start are not
// delivered, even one committed after a transaction still open at Start began; that transaction's
// row, committed after Start, is delivered. With StartFromBeginning every row is.
func TestLiveNewClientStartsAtSnapshot(t *testing.T) {
	runModes(t, allModes, newLive, func(t *testing.T, e *liveEnv, mode Mode) {
		before := e.insert(2)
		txA := e.openTx()
		a := insertItem(t, txA)
		b := e.insert(1)[0]

		w := e.start(e.config(mode))
		waitStartSaved(t, w)
		require.NoError(t, txA.Commit())
		after := e.insert(1)[0]
		require.ElementsMatch(t, []int64{a, after}, receiveWithin(t, w, 2, liveWait),
			"the transaction open at Start, and the row after it")
		requireNothingWithin(t, w, liveQuiet)

		cfg := e.config(mode)
		cfg.ClientName, cfg.StartFromBeginning = "fresh", true
		w2 := e.start(cfg)
		require.ElementsMatch(t, append(before, a, b, after), receiveWithin(t, w2, 5, liveWait))
		requireNothingWithin(t, w2, liveQuiet)
	})
}

// TestLiveLongTransactionDoesNotDelay proves rule 11's "no open transaction delays other
// transactions' rows" in hybrid mode: while a write transaction stays open for several seconds in
// another database of the cluster, and one in this database, rows committed meanwhile are
// delivered promptly (p99 under a second); the long transaction's own row is delivered when it
// commits.
func TestLiveLongTransactionDoesNotDelay(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	other := newLive(t)
	otherTx := other.openTx()
	insertItem(t, otherTx)
	longTx := e.openTx()
	long := insertItem(t, longTx)

	w := e.start(e.config(ModeHybrid))
	waitStartSaved(t, w)
	got := newDeliveries()
	got.consume(t, w)
	var rows []faultRow
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		row, err := faultInsert(context.Background(), e.db, 0)
		require.NoError(t, err)
		rows = append(rows, row)
		time.Sleep(20 * time.Millisecond)
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.pos.ID
	}
	got.requireAll(t, ids, liveWait, "rows committed while the long transactions were open")
	latencies := make([]time.Duration, len(rows))
	got.mu.Lock()
	for i, r := range rows {
		latencies[i] = got.first[r.pos.ID].Sub(r.commitDone)
	}
	got.mu.Unlock()
	slices.Sort(latencies)
	p50, p99 := latencies[len(latencies)/2], latencies[len(latencies)*99/100]
	t.Logf("%d rows, latency p50 %v, p99 %v, max %v", len(rows), p50, p99, latencies[len(latencies)-1])
	require.Less(t, p99, time.Second, "rows waited for the open transactions")

	require.NoError(t, longTx.Commit())
	committed := time.Now()
	got.requireAll(t, []int64{long}, liveWait, "the long transaction's row")
	got.mu.Lock()
	require.Less(t, got.first[long].Sub(committed), time.Second)
	got.mu.Unlock()
	require.NoError(t, otherTx.Rollback())
}

// TestLiveLegacySchemaWarnsAtStart proves rule 11's legacy clause: on a changelog without the
// transaction-id column the watcher works as before and says once, at Start, with a warning that
// names schema.Install, that reads are not skip-free; on the upgraded schema it says nothing of
// the kind.
func TestLiveLegacySchemaWarnsAtStart(t *testing.T) {
	t.Parallel()
	for _, schema := range []string{"legacy", "upgraded"} {
		t.Run(schema, func(t *testing.T) {
			t.Parallel()
			newEnv := newLive
			if schema == "legacy" {
				newEnv = newLegacy
			}
			e := newEnv(t)
			logs := newLogCounter()
			cfg := e.config(ModeHybrid)
			cfg.Logger = slog.New(logs)
			for run := range 2 { // a restart warns again, once
				w := e.start(cfg)
				if run == 0 {
					waitStartSaved(t, w)
				}
				ids := e.insert(3)
				require.Equal(t, ids, receiveWithin(t, w, 3, liveWait))
				require.NoError(t, w.MarkProcessed(context.Background(), tok(ids[2])))
				require.NoError(t, w.Close(context.Background()))
			}
			warnings := logs.warningsMentioning("schema.Install")
			if schema == "legacy" {
				require.Len(t, warnings, 2, "one warning per Start")
			} else {
				require.Empty(t, warnings)
			}
		})
	}
}
