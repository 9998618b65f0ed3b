package pgchangestream

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

func TestBatchedCheckpointsSaveInTheBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 5)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, CheckpointInterval: 100 * time.Millisecond})
		receive(t, w, 5)
		synctest.Wait()
		writes := w.Stats().CheckpointWrites
		for id := int64(1); id <= 4; id++ {
			require.NoError(t, w.MarkProcessed(t.Context(), tok(id)))
		}
		require.Equal(t, writes, w.Stats().CheckpointWrites, "MarkProcessed returns without saving")
		require.Equal(t, Position{}, f.token(t, "c"))

		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		require.Equal(t, writes+1, w.Stats().CheckpointWrites, "one save for the four acks")
		require.Equal(t, rowPos(f, 5).Predecessor(), f.token(t, "c"), "the batched save never passes a pending delivery")

		time.Sleep(time.Second)
		synctest.Wait()
		require.Equal(t, writes+1, w.Stats().CheckpointWrites, "nothing changed, nothing written")

		require.NoError(t, w.MarkProcessed(t.Context(), tok(5)))
		require.NoError(t, w.Flush(t.Context()), "Flush saves at once")
		require.Equal(t, rowPos(f, 5), f.token(t, "c"))
		closeWatcher(t, w)
	})
}

// An acknowledgement in batched mode returns at once, even while a slow background save holds
// the checkpoint lock.
func TestBatchedAckDoesNotWaitForBackgroundSave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 5)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, CheckpointInterval: 100 * time.Millisecond})
		receive(t, w, 5)
		require.NoError(t, w.MarkProcessed(t.Context(), tok(1)))
		f.mu.Lock()
		f.saveDelay = time.Second
		f.mu.Unlock()
		time.Sleep(100 * time.Millisecond) // the background save starts and takes a second
		synctest.Wait()
		start := time.Now()
		for id := int64(2); id <= 4; id++ {
			require.NoError(t, w.MarkProcessed(t.Context(), tok(id)))
		}
		require.Zero(t, time.Since(start), "the acknowledgements waited for the background save")
		require.Equal(t, 1, w.Stats().Pending)
		f.mu.Lock()
		f.saveDelay = 0
		f.mu.Unlock()
		time.Sleep(time.Second)
		closeWatcher(t, w)
	})
}

// The processed flag is set by the marker after a save, so an acknowledgement never waits for it.
func TestAckDoesNotWaitForTheProcessedFlag(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 5)
		f.markDelay = time.Second
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		receive(t, w, 5)
		start := time.Now()
		for id := int64(1); id <= 5; id++ {
			require.NoError(t, w.MarkProcessed(t.Context(), tok(id)))
		}
		require.Zero(t, time.Since(start), "an acknowledgement waited for the processed flag")
		require.Equal(t, rowPos(f, 5), f.token(t, "c"))
		closeWatcher(t, w)
	})
}

func TestBatchedSaveFailureIsReportedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 3)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, CheckpointInterval: 100 * time.Millisecond})
		receive(t, w, 3)
		synctest.Wait()
		f.mu.Lock()
		f.failSaves = 1
		f.mu.Unlock()
		require.NoError(t, w.MarkProcessed(t.Context(), tok(1)))
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		require.Equal(t, uint64(1), w.Stats().CheckpointErrors)

		err := w.MarkProcessed(t.Context(), tok(2))
		require.ErrorIs(t, err, f.readErr, "the next MarkProcessed reports the background failure")
		require.ErrorContains(t, err, "save checkpoint")
		require.NoError(t, w.MarkProcessed(t.Context(), tok(2)), "reported once")

		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		require.Equal(t, rowPos(f, 3).Predecessor(), f.token(t, "c"), "the kept acknowledgements are saved by the next background save")
		closeWatcher(t, w)
	})
}

func TestBatchedSaveFailureReachesFlush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 2)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, CheckpointInterval: time.Second})
		receive(t, w, 2)
		synctest.Wait()
		f.mu.Lock()
		f.failSaves = 1
		f.mu.Unlock()
		require.NoError(t, w.MarkProcessed(t.Context(), tok(1)))
		time.Sleep(time.Second)
		synctest.Wait()
		err := w.Flush(t.Context())
		require.ErrorIs(t, err, f.readErr, "Flush reports the background failure")
		require.Equal(t, rowPos(f, 2).Predecessor(), f.token(t, "c"), "and saves")
		require.NoError(t, w.Flush(t.Context()))
		closeWatcher(t, w)
	})
}

func TestBatchedModeSavesOnCloseAndAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 3)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, CheckpointInterval: time.Hour})
		receive(t, w, 3)
		require.NoError(t, w.MarkProcessed(t.Context(), tok(1)))
		require.Equal(t, Position{}, f.token(t, "c"))
		require.NoError(t, w.Close(context.Background()), "Close saves")
		require.Equal(t, rowPos(f, 2).Predecessor(), f.token(t, "c"))
		require.NoError(t, w.MarkProcessed(context.Background(), tok(3)))
		require.Equal(t, rowPos(f, 3), f.token(t, "c"), "after Close, MarkProcessed saves before it returns")
	})
}

func TestCloseSavesFilteredProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 4)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, IdleCheckpointInterval: time.Hour,
			Filter: func(Event) bool { return false }})
		synctest.Wait()
		require.Equal(t, uint64(4), w.Stats().Filtered)
		require.Equal(t, Position{}, f.token(t, "c"))
		require.NoError(t, w.Close(context.Background()))
		require.Equal(t, rowPos(f, 4), f.token(t, "c"))
	})
}

func TestPollWaitByMode(t *testing.T) {
	db, _ := mockDB(t)
	w, err := New(Config{DB: db, ClientName: "c", TableName: "t", ConnString: "postgres://u@localhost/db",
		FallbackPollInterval: time.Second, Logger: quietLogger})
	require.NoError(t, err)
	for range 100 {
		d := w.pollWait()
		require.GreaterOrEqual(t, d, 800*time.Millisecond, "hybrid fallback polls are jittered by up to a fifth")
		require.Less(t, d, 1200*time.Millisecond)
	}
	w, err = New(Config{DB: db, ClientName: "c", TableName: "t", ConnString: "postgres://u@localhost/db", Mode: ModeNotify})
	require.NoError(t, err)
	require.Zero(t, w.pollWait(), "notify mode waits for a NOTIFY only")
}

// loadedAt puts w in the state of a load that saved p, without a reader: the test moves the
// cursor itself.
func loadedAt(w *Watcher, p Position) {
	w.ckMu.Lock()
	w.saved, w.hasSaved, w.savedAt = p, true, time.Now()
	w.ckMu.Unlock()
	w.mu.Lock()
	w.cursor, w.savedMirror, w.loaded = p, p, true
	w.mu.Unlock()
}

// A caught-up watcher whose table gets no writes still saves the newer snapshot its reads moved
// on to (so admin.Prune can delete what other transactions wrote), at most once per
// CheckpointRefreshInterval, and never past a pending delivery.
func TestCaughtUpWatcherSavesItsNewerSnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		cfg := testConfig(Config{CheckpointRefreshInterval: time.Minute})
		cfg.DB = f.open(t)
		w, err := New(cfg)
		require.NoError(t, err)
		start := Position{ChangedAt: t0, ID: 9, Span: &position.Span{Seq: 1, Base: mustSnapshot(t, "100:105:")}}
		loadedAt(w, start)
		moveOn := func(s string) Position { // a delta without a row of the table
			w.mu.Lock()
			defer w.mu.Unlock()
			w.cursor = w.cursor.NextDelta(mustSnapshot(t, s))
			return w.cursor
		}
		ctx, cancel := context.WithCancel(t.Context())
		w.wg.Add(1)
		go w.saveLoop(ctx)

		second := moveOn("106:110:")
		time.Sleep(59 * time.Second)
		synctest.Wait()
		require.Empty(t, f.savedPositions(), "only the snapshot moved: no save before the interval")
		time.Sleep(time.Second)
		synctest.Wait()
		require.Len(t, f.savedPositions(), 1, "the newer snapshot is saved after the interval")
		require.Equal(t, second.String(), f.token(t, "c").String())

		third := moveOn("111:115:")
		time.Sleep(30 * time.Second)
		synctest.Wait()
		require.Len(t, f.savedPositions(), 1, "at most one such save per interval")

		// A delivery pending in the next delta holds the token back, however long it waits.
		d := third.WithEnd(mustSnapshot(t, "116:120:"), "")
		d.Xid, d.ID = 112, 10
		w.mu.Lock()
		w.seq++
		w.ring.Push(w.seq, d.ID, d)
		w.cursor = d.NextDelta(mustSnapshot(t, "121:125:"))
		w.mu.Unlock()
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		for _, p := range f.savedPositions() {
			require.False(t, d.Predecessor().Before(p), "saved %s past the pending delivery %s", p, d)
		}
		require.Len(t, f.savedPositions(), 1, "nothing is saved while a delivery is pending")

		cancel()
		w.wg.Wait()
	})
}

// On a legacy changelog a caught-up watcher's position does not move; it is saved again once
// per CheckpointRefreshInterval, so the token's saved time tells a running client from an
// abandoned token.
func TestCaughtUpWatcherRefreshesItsToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 1)
		w := startOn(t, t.Context(), f, Config{CheckpointRefreshInterval: time.Minute})
		synctest.Wait()
		require.Len(t, f.savedPositions(), 1, "the start is saved")
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		require.Equal(t, []Position{rowPos(f, 1), rowPos(f, 1)}, f.savedPositions(), "the token is saved again")
		time.Sleep(30 * time.Second)
		synctest.Wait()
		require.Len(t, f.savedPositions(), 2)
		closeWatcher(t, w)
	})
}

// Background saves failing on every tick for 65 s (an outage) write the first failure, a
// summary every 30 s and one line when saves succeed again, not a line per attempt.
func TestBackgroundSaveFailuresAreLoggedWithACount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 3)
		h := &recordHandler{}
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, CheckpointInterval: 100 * time.Millisecond,
			Logger: slog.New(h)})
		receive(t, w, 3)
		synctest.Wait()
		f.mu.Lock()
		f.failSaves = 650 // 65 s of ticks
		f.mu.Unlock()
		require.NoError(t, w.MarkProcessed(t.Context(), tok(3)))
		time.Sleep(70 * time.Second)
		synctest.Wait()
		require.Equal(t, rowPos(f, 3), f.token(t, "c"), "saved once the outage ended")
		var failed, recovered []map[string]any
		for _, l := range h.lines() {
			switch l["msg"] {
			case "background checkpoint save failed":
				failed = append(failed, l)
			case "background checkpoint save failed: recovered":
				recovered = append(recovered, l)
			}
		}
		require.Len(t, failed, 3, "the first failure and two summaries")
		require.Equal(t, int64(300), failed[1]["repeated"])
		require.Len(t, recovered, 1)
		require.Equal(t, int64(650), recovered[0]["failures"])
		require.ErrorIs(t, w.Close(context.Background()), f.readErr, "the failure not yet reported is Close's error")
	})
}
