package pgchangestream

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
)

// requireOpen fails if ch is closed.
func requireOpen(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatal(msg)
	default:
	}
}

func TestReadyAfterTheFirstRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 2)
		f.failLoads = 2
		f.failReadNumber = 1
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		synctest.Wait()
		requireOpen(t, w.Ready(), "not ready while the saved token cannot be loaded")

		<-w.Ready()
		require.Len(t, f.readTimes(), 2, "a failed first read does not make the watcher ready")
		require.Equal(t, uint64(2), w.Stats().Delivered, "the first read's rows are on Events")
		closeWatcher(t, w)
	})
}

func TestReadyWhenStoppedBefore(t *testing.T) {
	t.Run("closed before start", func(t *testing.T) {
		w, _ := newMockWatcher(t, Config{})
		requireOpen(t, w.Ready(), "a new watcher is not ready")
		closeWatcher(t, w)
		<-w.Ready()
	})
	t.Run("closed while loading", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFakeDB(testConfig(Config{}))
			f.failLoads = 1 << 30
			w := startOn(t, t.Context(), f, Config{})
			synctest.Wait()
			requireOpen(t, w.Ready(), "not ready while loading")
			closeWatcher(t, w)
			<-w.Ready()
		})
	})
	t.Run("context ended while loading", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := newFakeDB(testConfig(Config{}))
			f.failLoads = 1 << 30
			ctx, cancel := context.WithCancel(t.Context())
			w := startOn(t, ctx, f, Config{})
			cancel()
			<-w.Ready()
			require.ErrorIs(t, w.Err(), context.Canceled)
			closeWatcher(t, w)
		})
	})
	t.Run("configuration error", func(t *testing.T) {
		w := NewPostgreSQLChangeStreamWatcher(nil, "c", "t", "", ModePolling)
		w.Start(t.Context())
		<-w.Ready()
		require.Error(t, w.Err())
	})
}
