package pgchangestream

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHealthReportsAReadFailureAndItsDuration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.readErr = errors.New("permission denied for table datastore_changelog")
		f.failReads = 1 << 30
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		time.Sleep(12 * time.Second)
		require.EqualError(t, w.Health(),
			"read changelog: permission denied for table datastore_changelog (failing for 12s)")
		s := w.Stats()
		require.Positive(t, s.ReadErrors)
		require.Zero(t, s.LoadErrors)
		require.ErrorContains(t, s.LastError, "permission denied")
		require.False(t, s.LastErrorAt.IsZero())

		f.mu.Lock()
		f.failReads = 0
		f.mu.Unlock()
		time.Sleep(readRetryMax + time.Second)
		require.NoError(t, w.Health(), "the failure clears on recovery")
		require.Equal(t, s.ReadErrors, w.Stats().ReadErrors, "no failure since")
		closeWatcher(t, w)
	})
}

func TestHealthReportsALoadFailureAndNoFirstRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.failLoads = 1 << 30
		w := startOn(t, t.Context(), f, Config{})
		time.Sleep(time.Second)
		require.ErrorContains(t, w.Health(), "read token table resume_tokens: fake: connection refused (failing for")
		require.NotContains(t, w.Health().Error(), "no read completed", "not yet")
		time.Sleep(firstReadTimeout)
		require.ErrorContains(t, w.Health(), "read changelog: no read completed 31s after start")
		require.Positive(t, w.Stats().LoadErrors)
		closeWatcher(t, w)
		require.NoError(t, w.Health(), "a closed watcher is not failing")
	})
}

func TestLagIsTheAgeOfTheOldestUnacknowledgedRow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", time.Now().Add(-5*time.Second), 1)
		f.insert("t", time.Now().Add(-2*time.Second), 1)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		require.Equal(t, []int64{1, 2}, receive(t, w, 2))
		synctest.Wait()
		require.Equal(t, 5*time.Second, w.Stats().Lag, "the oldest unacknowledged row")
		require.NoError(t, w.MarkProcessed(context.Background(), tok(1)))
		require.Equal(t, 2*time.Second, w.Stats().Lag)
		require.NoError(t, w.MarkProcessed(context.Background(), tok(2)))
		require.Zero(t, w.Stats().Lag, "caught up")
		closeWatcher(t, w)
	})
}

func TestLagWhileRowsAreUnread(t *testing.T) {
	w := newWatcher(testConfig(Config{}))
	now := t0.Add(time.Minute)
	w.loaded, w.cursor = true, makePosition(t0, 7)
	require.Equal(t, time.Minute, w.lagLocked(now, false), "the cursor bounds the unread rows' age")
	require.Zero(t, w.lagLocked(now, true))
	w.cursor = Position{}
	require.Zero(t, w.lagLocked(now, false), "unknown before the first row")
}
