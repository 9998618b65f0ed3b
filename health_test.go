package pgchangestream

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/position"
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

func TestHealthReportsALoadFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.failLoads = 1 << 30
		w := startOn(t, t.Context(), f, Config{})
		time.Sleep(firstReadTimeout + time.Second)
		require.EqualError(t, w.Health(), "read token table resume_tokens: fake: connection refused (failing for 31s)",
			"the failure says why no read completed")
		require.Positive(t, w.Stats().LoadErrors)
		closeWatcher(t, w)
		require.NoError(t, w.Health(), "a closed watcher is not failing")
	})
}

func TestHealthNamesTheStepOfAStuckStart(t *testing.T) {
	var h health
	require.NoError(t, h.err(t0), "not started")
	h.startWork()
	start := h.working
	require.NoError(t, h.err(start.Add(firstReadTimeout-time.Second)), "not yet")
	require.EqualError(t, h.err(start.Add(firstReadTimeout+time.Second)), "load start position: not done 31s after "+
		"start, without an error (a query waits for a lock or the server, or the LISTEN connection for the server)")
	h.ok(opLoad)
	require.ErrorContains(t, h.err(start.Add(firstReadTimeout)), "read changelog: not done 30s after start")
	h.fail(opListen, errors.New("LISTEN connection: refused"))
	require.ErrorContains(t, h.err(start.Add(firstReadTimeout)), "read changelog: not done",
		"a LISTEN failure outside notify mode is not the reason")
	h.fail(opRead, errors.New("read changelog: timeout"))
	require.EqualError(t, h.err(h.lastErrAt.Add(2*time.Second)), "read changelog: timeout (failing for 2s)",
		"a failure is the reason")
	h.readOK(false)
	require.NoError(t, h.err(start.Add(time.Hour)))
	h.listenCritical = true
	require.EqualError(t, h.err(h.lastErrAt.Add(time.Minute)), "LISTEN connection: refused (failing for 1m0s)",
		"in notify mode it is")
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
	w.loaded, w.cursor = true, position.Make(t0, 7)
	require.Equal(t, time.Minute, w.lagLocked(now, false), "the cursor bounds the unread rows' age")
	require.Zero(t, w.lagLocked(now, true))
	w.cursor = Position{}
	require.Zero(t, w.lagLocked(now, false), "unknown before the first row")
}

// A failing save, in the background (batched saves) or inline (MarkProcessed), is a Health
// failure naming the token table, and Stats().LastError, until a save succeeds.
func TestHealthReportsFailingSaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 3)
		f.tokens["c"] = string(position.EncodeToken(position.Make(t0.Add(-time.Second), 0), "t"))
		f.readErr = errors.New("permission denied for table resume_tokens")
		f.failSaves = 1 << 30
		w := startOn(t, t.Context(), f, Config{CheckpointInterval: 50 * time.Millisecond})
		require.Equal(t, []int64{1, 2, 3}, receive(t, w, 3))
		require.NoError(t, w.MarkProcessed(context.Background(), tok(2)), "batched: the save is the saver's")
		time.Sleep(time.Second)
		require.Regexp(t, `^pgchangestream: save checkpoint \(.*, 2\) to token table resume_tokens: `+
			`permission denied for table resume_tokens \(failing for 950ms\)$`, w.Health(), "failing since the first tick")
		s := w.Stats()
		require.ErrorContains(t, s.LastError, "permission denied for table resume_tokens")
		require.Greater(t, s.CheckpointErrors, uint64(10))

		f.mu.Lock()
		f.failSaves = 0
		f.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		require.NoError(t, w.Health(), "the failure clears with the next save")
		require.Equal(t, rowPos(f, 2), f.token(t, "c"))
		require.ErrorContains(t, w.MarkProcessed(context.Background(), nil), "permission denied",
			"the background failure is still returned once")
		closeWatcher(t, w)
	})
}

func TestHealthReportsAFailingInlineSave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, w := startWithTwoDelivered(t, Config{})
		f.mu.Lock()
		f.failSaves = 1
		f.mu.Unlock()
		require.ErrorContains(t, w.MarkProcessed(context.Background(), tok(1)), "connection refused")
		require.ErrorContains(t, w.Health(), "save checkpoint")
		require.ErrorContains(t, w.Stats().LastError, "to token table resume_tokens: fake: connection refused")
		require.NoError(t, w.MarkProcessed(context.Background(), tok(2)))
		require.NoError(t, w.Health(), "the failure clears with the next save")
		closeWatcher(t, w)
	})
}

// The save of a new client's start position is part of the load: while it fails the load is
// retried and Health says so.
func TestHealthReportsAFailingStartSave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.failSaves = 1 << 30
		w := startOn(t, t.Context(), f, Config{})
		time.Sleep(time.Second)
		require.ErrorContains(t, w.Health(), "save start position to token table resume_tokens: fake: connection refused (failing for")
		require.ErrorContains(t, w.Stats().LastError, "save start position")
		f.mu.Lock()
		f.failSaves = 0
		f.mu.Unlock()
		time.Sleep(loadRetryMax + time.Second)
		require.NoError(t, w.Health())
		closeWatcher(t, w)
	})
}
