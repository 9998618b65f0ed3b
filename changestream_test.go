package pgchangestream

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// testConfig fills what every test needs: a polling watcher of table "t" for client "c".
func testConfig(cfg Config) Config {
	if cfg.ClientName == "" {
		cfg.ClientName = "c"
	}
	if cfg.TableName == "" {
		cfg.TableName = "t"
	}
	if cfg.Mode == "" {
		cfg.Mode = ModePolling
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger
	}
	return cfg
}

// startOn starts a watcher on the fake; the caller closes it.
func startOn(t *testing.T, ctx context.Context, f *fakeDB, cfg Config) *Watcher {
	t.Helper()
	cfg = testConfig(cfg)
	cfg.DB = f.open(t)
	w, err := New(cfg)
	require.NoError(t, err)
	w.Start(ctx)
	return w
}

// receive takes n deliveries and returns their ids.
func receive(t *testing.T, w *Watcher, n int) []int64 {
	t.Helper()
	ids := make([]int64, 0, n)
	for range n {
		ev, ok := <-w.Events()
		require.True(t, ok, "Events closed after %d of %d deliveries", len(ids), n)
		id, err := strconv.ParseInt(string(ev.ResumeToken), 10, 64)
		require.NoError(t, err)
		require.Equal(t, string(ev.ResumeToken), ev.Event["_id"].(map[string]any)["_data"])
		ids = append(ids, id)
	}
	return ids
}

func tok(id int64) []byte { return []byte(strconv.FormatInt(id, 10)) }

func rowPos(f *fakeDB, id int64) Position {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.rows {
		if r.ID == id {
			return position.Make(r.ChangedAt, r.ID)
		}
	}
	panic("no row " + strconv.FormatInt(id, 10))
}

func closeWatcher(t *testing.T, w *Watcher) {
	t.Helper()
	require.NoError(t, w.Close(context.Background()))
}

func TestRestartReplaysBufferedDeliveries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 5)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		require.Equal(t, []int64{1}, receive(t, w, 1))
		synctest.Wait() // 2..5 are buffered in the channel
		require.Equal(t, 5, w.Stats().Pending)
		require.NoError(t, w.MarkProcessed(t.Context(), tok(1)))
		require.Equal(t, rowPos(f, 2).Predecessor(), f.token(t, "c"), "the token stops before the first unacknowledged delivery")
		closeWatcher(t, w)

		w2 := startOn(t, t.Context(), f, Config{})
		require.Equal(t, []int64{2, 3, 4, 5}, receive(t, w2, 4), "a restart replays the buffered deliveries")
		closeWatcher(t, w2)
	})
}

func TestAckIsCumulativeInDeliveryOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 5)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		receive(t, w, 5)
		require.NoError(t, w.MarkProcessed(t.Context(), tok(3)))
		st := w.Stats()
		require.Equal(t, uint64(3), st.Acked, "acking the third delivery acknowledges the two before it")
		require.Equal(t, 2, st.Pending)
		require.Equal(t, rowPos(f, 4).Predecessor(), f.token(t, "c"))
		require.Equal(t, rowPos(f, 5), st.Cursor, "acks never move the read cursor")
		require.NoError(t, w.MarkProcessed(t.Context(), tok(5)))
		require.Equal(t, rowPos(f, 5), f.token(t, "c"), "with nothing pending the token is the cursor")
		closeWatcher(t, w)
	})
}

func TestTokensThatCertifyNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 3)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		receive(t, w, 3)
		writes := w.Stats().CheckpointWrites

		require.NoError(t, w.MarkProcessed(t.Context(), nil), "an empty token")
		require.NoError(t, w.MarkProcessed(t.Context(), tok(99)), "an unknown id")
		require.NoError(t, w.MarkProcessed(t.Context(), tok(-1)))
		st := w.Stats()
		require.Equal(t, 3, st.Pending, "nothing was acknowledged")
		require.Equal(t, rowPos(f, 3), st.Cursor, "the cursor did not move")
		require.Equal(t, rowPos(f, 1).Predecessor(), f.token(t, "c"))
		require.Equal(t, writes+1, st.CheckpointWrites, "only the first call had a changed checkpoint to save")

		err := w.MarkProcessed(t.Context(), []byte("not-a-number"))
		require.ErrorIs(t, err, ErrInvalidToken)
		require.ErrorContains(t, err, `"not-a-number"`)
		require.Equal(t, 3, w.Stats().Pending)

		require.NoError(t, w.MarkProcessed(t.Context(), tok(1)))
		require.NoError(t, w.MarkProcessed(t.Context(), tok(1)), "a duplicate ack")
		require.Equal(t, 2, w.Stats().Pending, "the duplicate certified nothing more")
		require.Equal(t, rowPos(f, 2).Predecessor(), f.token(t, "c"))
		closeWatcher(t, w)
	})
}

func TestLateRowBelowCursorIsRecovered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		late := f.insertRows("t", t0, 1, false)[0] // transaction A: started first, still open
		b := f.insert("t", t0.Add(time.Second), 1)[0]
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		require.Equal(t, []int64{b}, receive(t, w, 1))

		f.commit(late) // A commits behind the cursor; its NOTIFY names the row
		w.onNotification(`{"id":` + strconv.FormatInt(late, 10) + `,"table":"t","operation":"INSERT"}`)
		require.Equal(t, []int64{late}, receive(t, w, 1), "the late row is delivered")
		require.Equal(t, rowPos(f, b), w.Stats().Cursor, "the cursor does not move back")

		require.NoError(t, w.MarkProcessed(t.Context(), tok(b)))
		require.Equal(t, rowPos(f, late).Predecessor(), f.token(t, "c"), "the token holds behind the late row until it is acked")
		closeWatcher(t, w)

		w2 := startOn(t, t.Context(), f, Config{})
		require.Equal(t, []int64{late, b}, receive(t, w2, 2), "a restart before the ack replays it")
		require.NoError(t, w2.MarkProcessed(t.Context(), tok(b)))
		require.Equal(t, rowPos(f, b), f.token(t, "c"))
		closeWatcher(t, w2)
	})
}

func TestNotifyForReadRowsFetchesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		ids := f.insert("t", t0, 3)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		receive(t, w, 3)
		for _, id := range ids {
			w.onNotification(`{"id":` + strconv.FormatInt(id, 10) + `,"table":"t","operation":"INSERT"}`)
		}
		w.onNotification(`{"id":999,"table":"other","operation":"INSERT"}`)
		w.onNotification(`garbage`)
		synctest.Wait()
		require.Equal(t, uint64(3), w.Stats().Delivered, "rows already read are not delivered again")
		closeWatcher(t, w)
	})
}

func TestLowerIDWithLaterChangedAtIsReadInPositionOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		first := f.insert("t", t0.Add(time.Second), 1)[0] // B started later but inserted first
		second := f.insert("t", t0, 1)[0]
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		require.Equal(t, []int64{second, first}, receive(t, w, 2))
		require.NoError(t, w.MarkProcessed(t.Context(), tok(second)))
		require.Equal(t, rowPos(f, first).Predecessor(), f.token(t, "c"))
		closeWatcher(t, w)
	})
}

func TestAbandonedSendStaysPending(t *testing.T) {
	for _, stop := range []string{"close", "cancel"} {
		t.Run(stop, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeDB(testConfig(Config{}))
				f.insert("t", t0, 3)
				ctx, cancel := context.WithCancel(t.Context())
				w := startOn(t, ctx, f, Config{StartFromBeginning: true, BufferSize: 1})
				synctest.Wait() // row 1 sits in the channel, the send of row 2 is blocked
				require.Equal(t, 2, w.Stats().Pending)
				if stop == "close" {
					closeWatcher(t, w)
					require.NoError(t, w.Err())
				} else {
					cancel()
					synctest.Wait()
					require.ErrorIs(t, w.Err(), context.Canceled)
				}
				require.Equal(t, []int64{1}, receive(t, w, 1), "what was buffered can still be read")
				_, open := <-w.Events()
				require.False(t, open, "Events is closed")
				require.Equal(t, uint64(1), w.Stats().Delivered)

				// The consumer flushes its final watermark after Close.
				require.NoError(t, w.MarkProcessed(context.Background(), tok(1)))
				require.NoError(t, w.Flush(context.Background()))
				require.Equal(t, rowPos(f, 2).Predecessor(), f.token(t, "c"), "the abandoned row 2 is never passed")
				require.NoError(t, w.Close(context.Background()), "a second Close is fine")

				w2 := startOn(t, t.Context(), f, Config{})
				require.Equal(t, []int64{2, 3}, receive(t, w2, 2))
				closeWatcher(t, w2)
				cancel()
			})
		})
	}
}

func TestSaturationFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 10)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, MaxPending: 4})
		receive(t, w, 10)
		st := w.Stats()
		require.Equal(t, 4, st.Pending, "tracking is bounded")
		require.Equal(t, uint64(6), st.Evicted)
		require.True(t, st.FloorActive)
		require.NoError(t, w.Flush(t.Context()))
		require.Equal(t, rowPos(f, 1).Predecessor(), f.token(t, "c"), "the floor holds the first unacknowledged delivery")

		require.NoError(t, w.MarkProcessed(t.Context(), tok(3)), "an evicted delivery")
		require.True(t, w.Stats().FloorActive, "an ack of an evicted delivery certifies nothing")
		require.Equal(t, rowPos(f, 1).Predecessor(), f.token(t, "c"))

		require.NoError(t, w.MarkProcessed(t.Context(), tok(8)))
		st = w.Stats()
		require.False(t, st.FloorActive, "an ack of a tracked delivery clears the floor")
		require.Equal(t, rowPos(f, 9).Predecessor(), f.token(t, "c"))
		closeWatcher(t, w)
	})
}

func TestLongRunWithMostlyMissingAcks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 3000
		f := newFakeDB(testConfig(Config{BatchSize: 50}))
		f.insert("t", t0, n)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, MaxPending: 64, BatchSize: 50, BufferSize: 8})
		maxPending := 0
		for i := range n {
			id := receive(t, w, 1)[0]
			require.Equal(t, int64(i+1), id)
			if i%10 != 9 { // nine in ten events are never acknowledged
				continue
			}
			require.NoError(t, w.MarkProcessed(t.Context(), tok(id)))
			maxPending = max(maxPending, w.Stats().Pending)
			require.False(t, w.Stats().FloorActive)
			want := rowPos(f, id)
			if id < n { // the next delivery is already pending (buffered)
				want = rowPos(f, id+1).Predecessor()
			}
			require.Equal(t, want, f.token(t, "c"), "an ack covers every delivery before it")
		}
		require.LessOrEqual(t, maxPending, 64)
		synctest.Wait() // the reader counts a delivery after its send completes
		require.Equal(t, uint64(n), w.Stats().Delivered, "delivery never blocked on tracking")
		closeWatcher(t, w)
	})
}

func TestFailedSaveIsAnErrorAndRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 3)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		receive(t, w, 3)
		f.mu.Lock()
		f.failSaves = 1
		f.mu.Unlock()
		err := w.MarkProcessed(t.Context(), tok(2))
		require.ErrorIs(t, err, f.readErr)
		require.ErrorContains(t, err, "save checkpoint")
		require.Equal(t, uint64(1), w.Stats().CheckpointErrors)
		require.Equal(t, Position{}, f.token(t, "c"), "nothing was saved")
		require.Equal(t, 1, w.Stats().Pending, "the acknowledgement is kept")

		require.NoError(t, w.MarkProcessed(t.Context(), nil), "a retry saves the kept acknowledgement")
		require.Equal(t, rowPos(f, 3).Predecessor(), f.token(t, "c"))
		closeWatcher(t, w)
	})
}

func TestFilteredRowsAdvanceTheTokenWhenIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 5)
		keep := func(ev Event) bool { return ev["_id"].(map[string]any)["_data"] == "5" }
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, Filter: keep, IdleCheckpointInterval: time.Second})
		require.Equal(t, []int64{5}, receive(t, w, 1))
		require.Equal(t, uint64(4), w.Stats().Filtered)
		time.Sleep(2500 * time.Millisecond) // two idle ticks pass; the next is at 3s
		require.Equal(t, Position{}, f.token(t, "c"), "no idle save while a delivery is pending")
		require.NoError(t, w.MarkProcessed(t.Context(), tok(5)))
		require.Equal(t, rowPos(f, 5), f.token(t, "c"))

		f.insert("t", t0.Add(time.Second), 3) // all filtered
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		require.Equal(t, uint64(7), w.Stats().Filtered)
		require.Equal(t, rowPos(f, 5), f.token(t, "c"), "not saved before the next idle tick")
		time.Sleep(time.Second)
		synctest.Wait()
		require.Equal(t, rowPos(f, 8), f.token(t, "c"), "filtered rows advance the saved token without acks")
		closeWatcher(t, w)
	})
}

func TestNewClientStartsAtNewestRow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 3)
		f.insert("other", t0.Add(time.Hour), 1)
		w := startOn(t, t.Context(), f, Config{})
		synctest.Wait()
		require.Equal(t, rowPos(f, 3), f.token(t, "c"), "the start position is saved at once")
		f.insert("t", t0.Add(time.Second), 2)
		require.Equal(t, []int64{5, 6}, receive(t, w, 2))
		closeWatcher(t, w)

		w2 := startOn(t, t.Context(), f, Config{ClientName: "fresh", StartFromBeginning: true})
		require.Equal(t, []int64{1, 2, 3, 5, 6}, receive(t, w2, 5))
		closeWatcher(t, w2)
	})
}

func TestLoadRetriesInsteadOfGuessing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 2)
		f.tokens["c"] = string(position.EncodeToken(rowPos(f, 1), "t"))
		f.failLoads = 3
		start := time.Now()
		w := startOn(t, t.Context(), f, Config{})
		require.Equal(t, []int64{2}, receive(t, w, 1))
		// Waits of about 100ms, 200ms and 400ms, each jittered by up to a fifth.
		require.GreaterOrEqual(t, time.Since(start), 560*time.Millisecond)
		require.LessOrEqual(t, time.Since(start), 840*time.Millisecond)
		require.Equal(t, 0, f.failLoads)
		closeWatcher(t, w)
	})
}

func TestReadErrorsRetryFromTheSamePosition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 3)
		f.failReads = 4
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		require.Equal(t, []int64{1, 2, 3}, receive(t, w, 3), "nothing is skipped")
		reads := f.readTimes()
		require.GreaterOrEqual(t, len(reads), 5)
		for i, base := range []time.Duration{50, 100, 200, 400} {
			gap := reads[i+1].Sub(reads[i])
			require.GreaterOrEqual(t, gap, base*time.Millisecond*4/5, "retry %d", i)
			require.LessOrEqual(t, gap, base*time.Millisecond*6/5, "retry %d", i)
		}
		closeWatcher(t, w)
	})
}

func TestPollCadence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{BatchSize: 10}))
		f.insert("t", t0, 35)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, BatchSize: 10, PollInterval: 10 * time.Millisecond})
		receive(t, w, 35)
		synctest.Wait()
		reads := f.readTimes()
		require.Len(t, reads, 4, "full batches are read back to back")
		require.Equal(t, reads[0], reads[3])
		time.Sleep(time.Second)
		synctest.Wait()
		polls := len(f.readTimes()) - 4
		require.InDelta(t, 100, polls, 1, "one poll per PollInterval when idle")
		closeWatcher(t, w)
	})
}

func TestFailedPrefetchIsReadAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{BatchSize: 10}))
		f.insert("t", t0, 25)
		f.failReadNumber = 2 // the read of the second batch, started while the first is delivered
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, BatchSize: 10})
		ids := receive(t, w, 25)
		for i, id := range ids {
			require.Equal(t, int64(i+1), id, "every row once, in order")
		}
		synctest.Wait()
		require.Len(t, f.readTimes(), 4, "batch 1, the failed prefetch, batch 2 read again, batch 3")
		closeWatcher(t, w)
	})
}

func TestLateRowBehindTheSavedTokenMovesItBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		late := f.insertRows("t", t0, 1, false)[0] // its transaction is open while b is read and acked
		b := f.insert("t", t0.Add(time.Second), 1)[0]
		ctx, crash := context.WithCancel(t.Context())
		w := startOn(t, ctx, f, Config{StartFromBeginning: true, BufferSize: 1})
		require.Equal(t, []int64{b}, receive(t, w, 1))
		require.NoError(t, w.MarkProcessed(t.Context(), tok(b)))
		require.Equal(t, rowPos(f, b), f.token(t, "c"))

		f.commit(late)
		w.onNotification(`{"id":` + strconv.FormatInt(late, 10) + `,"table":"t","operation":"INSERT"}`)
		synctest.Wait()
		require.Equal(t, rowPos(f, late).Predecessor(), f.token(t, "c"),
			"the token is saved back behind the recovered row before it is handed out")
		crash() // no Close, no Flush: a restart replays the late row
		synctest.Wait()
		w2 := startOn(t, t.Context(), f, Config{})
		require.Equal(t, []int64{late, b}, receive(t, w2, 2))
		closeWatcher(t, w2)
		closeWatcher(t, w)
	})
}

func TestCloseHoldsBehindLateRowsNotYetHandled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		late := f.insertRows("t", t0, 1, false)[0]
		ids := f.insert("t", t0.Add(time.Second), 3)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, BufferSize: 1})
		require.Equal(t, ids[:1], receive(t, w, 1))
		synctest.Wait() // the next row waits in the channel, the send of the third is blocked
		require.NoError(t, w.MarkProcessed(t.Context(), tok(ids[0])))
		require.Equal(t, rowPos(f, ids[1]).Predecessor(), f.token(t, "c"))

		// The late row commits and is notified while the reader is stuck sending: it never gets
		// to the hint before Close.
		f.commit(late)
		w.onNotification(`{"id":` + strconv.FormatInt(late, 10) + `,"table":"t","operation":"INSERT"}`)
		require.NoError(t, w.Close(context.Background()))
		require.Equal(t, rowPos(f, late).Predecessor(), f.token(t, "c"), "Close saved behind the late row")
		st := w.Stats()
		require.Equal(t, 3, st.Pending, "the late row is pending, never handed out")

		w2 := startOn(t, t.Context(), f, Config{})
		require.Equal(t, append([]int64{late}, ids...), receive(t, w2, 4),
			"a restart delivers it (and replays what follows it, acknowledged or not)")
		closeWatcher(t, w2)
	})
}
