package pgchangestream

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/marker"
	"github.com/stretchr/testify/require"
)

// A panic in the reader (here in the caller's Filter) stops the watcher instead of the process:
// Events closes, Err, Health and Stats report it, and the saved token never passes the row.
func TestPanicInTheReaderStopsTheWatcher(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 3)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, Filter: func(ev Event) bool {
			if ev["_id"].(map[string]any)["_data"] == "2" {
				panic("filter bug")
			}
			return true
		}})
		require.Equal(t, []int64{1}, receive(t, w, 1))
		_, open := <-w.Events()
		require.False(t, open, "Events closes")
		require.ErrorIs(t, w.Err(), ErrPanic)
		require.EqualError(t, w.Err(), "pgchangestream: panic in the reader: filter bug")
		require.ErrorContains(t, w.Health(), "pgchangestream: panic in the reader: filter bug (failing for")
		require.ErrorIs(t, w.Stats().LastError, ErrPanic)

		require.NoError(t, w.MarkProcessed(context.Background(), tok(1)))
		closeWatcher(t, w)
		require.Equal(t, rowPos(f, 1), f.token(t, "c"), "saved up to the row acknowledged, not past the row that panicked")
	})
}

// A panic in the saver goroutine (here in a background save) stops the watcher too.
func TestPanicInTheSaverStopsTheWatcher(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, Filter: func(Event) bool { return false }})
		waitStartSaved(t, w)
		f.mu.Lock()
		f.onSave = func(Position) { panic("save bug") }
		f.mu.Unlock()
		f.insert("t", t0, 2) // filtered: the saver saves them by itself
		_, open := <-w.Events()
		require.False(t, open, "Events closes")
		require.EqualError(t, w.Err(), "pgchangestream: panic in the saver: save bug")
		require.ErrorIs(t, w.Stats().LastError, ErrPanic)
		require.ErrorContains(t, w.Health(), "panic in the saver")
		f.mu.Lock()
		f.onSave = nil
		f.mu.Unlock()
		closeWatcher(t, w)
		require.Equal(t, rowPos(f, 2), f.token(t, "c"), "Close saves what was filtered")
	})
}

// A panic in the processed-flag marker fails the marking pass only: the watcher goes on
// delivering, Health reports the marker until a pass succeeds, and the marker retries.
func TestPanicInTheMarkerIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, w := startWithTwoDelivered(t, Config{ProcessedFlag: true})
		f.mu.Lock()
		f.markPanic = "marker bug"
		f.mu.Unlock()
		require.NoError(t, w.MarkProcessed(context.Background(), tok(2)))
		time.Sleep(time.Second)
		require.ErrorContains(t, w.Health(), "pgchangestream: panic in the processed-flag marker: marker bug (failing for")
		require.ErrorIs(t, w.Stats().LastError, ErrPanic)
		require.Equal(t, rowPos(f, 2), f.token(t, "c"), "the save is not the marker's")

		f.insert("t", t0, 1)
		require.Equal(t, []int64{3}, receive(t, w, 1), "the watcher goes on")
		require.NoError(t, w.Err())
		f.mu.Lock()
		f.markPanic = nil
		f.mu.Unlock()
		time.Sleep(marker.RetryMax + time.Second)
		require.NoError(t, w.Health(), "the failure clears when a pass succeeds")
		closeWatcher(t, w)
	})
}

// startWithTwoDelivered starts a watcher configured as cfg from the beginning of a fake
// changelog of two rows and takes both deliveries, inside a synctest bubble.
func startWithTwoDelivered(t *testing.T, cfg Config) (*fakeDB, *Watcher) {
	t.Helper()
	f := newFakeDB(testConfig(Config{}))
	f.insert("t", t0, 2)
	cfg.StartFromBeginning = true
	w := startOn(t, t.Context(), f, cfg)
	require.Equal(t, []int64{1, 2}, receive(t, w, 2))
	return f, w
}
