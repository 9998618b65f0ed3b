package pgchangestream

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/lock"
	"github.com/stretchr/testify/require"
)

// takeoverWait bounds a standby's takeover: a standby poll, the settle time and a read.
const takeoverWait = lock.StandbyPoll*2 + lock.SettleTime + 5*time.Second

// exclusivePair starts an active exclusive watcher and a standby of client "c" (the active one
// with Start's context ctx and, when app is set, that application_name on its LISTEN and lock
// sessions). The active watcher has received and acknowledged the first two of three rows.
// It returns both and the unacknowledged row's id.
func exclusivePair(t *testing.T, e *liveEnv, mode Mode, ctx context.Context, app string) (active, standby *Watcher, unacked int64) {
	t.Helper()
	cfg := e.config(mode)
	cfg.Exclusive, cfg.StartFromBeginning = true, true
	activeCfg := cfg
	if app != "" {
		activeCfg.ConnString = withAppName(e.dsn, app)
	}
	active = e.startCtx(ctx, activeCfg)
	waitFor(t, func() bool { return active.Stats().Active }, "the first watcher takes the lock")
	standby = e.start(cfg)
	ids := e.insert(3)
	require.Equal(t, ids, receiveWithin(t, active, 3, liveWait))
	require.NoError(t, active.MarkProcessed(context.Background(), tok(ids[1])))
	require.False(t, standby.Stats().Active)
	require.NoError(t, standby.Health(), "a standby is healthy")
	requireNothingWithin(t, standby, lock.StandbyPoll)
	return active, standby, ids[2]
}

// requireTakeover requires the standby to become active and deliver exactly the unacknowledged
// row, then rows inserted afterwards; it logs how long the takeover took since stopped.
func requireTakeover(t *testing.T, e *liveEnv, standby *Watcher, unacked int64, stopped time.Time) {
	t.Helper()
	require.Equal(t, []int64{unacked}, receiveWithin(t, standby, 1, takeoverWait),
		"the standby resumes after the acknowledged rows")
	t.Logf("takeover: first delivery %v after the active watcher stopped", time.Since(stopped).Round(time.Millisecond))
	require.True(t, standby.Stats().Active)
	ids := e.insert(2)
	require.Equal(t, ids, receiveWithin(t, standby, 2, liveWait))
	requireNothingWithin(t, standby, liveQuiet)
}

func TestLiveExclusiveTakeoverAfterClose(t *testing.T) {
	t.Parallel()
	for _, mode := range []Mode{ModePolling, ModeHybrid} { // a pool connection, then ConnString
		t.Run(string(mode), func(t *testing.T) {
			e := newLive(t)
			active, standby, unacked := exclusivePair(t, e, mode, context.Background(), "")
			require.NoError(t, active.Close(context.Background()))
			requireTakeover(t, e, standby, unacked, time.Now())
		})
	}
}

func TestLiveExclusiveTakeoverAfterContextCancel(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	ctx, cancel := context.WithCancel(context.Background())
	active, standby, unacked := exclusivePair(t, e, ModeHybrid, ctx, "")
	cancel() // a crash of the consumer: no Close, no final save
	stopped := time.Now()
	requireClosed(t, active)
	requireTakeover(t, e, standby, unacked, stopped)
}

func TestLiveExclusiveTakeoverAfterSessionsTerminated(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	app := "pgcs-excl-" + t.Name()[len(t.Name())-10:]
	active, standby, unacked := exclusivePair(t, e, ModeHybrid, context.Background(), app)
	terminated := time.Now()
	n, err := e.srv.TerminateBackends(context.Background(), app)
	require.NoError(t, err)
	require.Equal(t, 2, n, "the LISTEN and lock sessions")
	stopped := make(chan time.Time, 1)
	go func() {
		for range active.Events() {
		}
		stopped <- time.Now()
	}()
	first := receiveWithin(t, standby, 1, takeoverWait)
	took := time.Now()
	require.Equal(t, []int64{unacked}, first)
	select {
	case at := <-stopped:
		require.True(t, at.Before(took), "the active watcher stops before the standby delivers")
		t.Logf("sessions terminated: the active watcher stopped after %v, the standby delivered after %v",
			at.Sub(terminated).Round(time.Millisecond), took.Sub(terminated).Round(time.Millisecond))
	default:
		t.Fatal("the standby delivers while the active watcher has not stopped")
	}
	require.ErrorIs(t, active.Err(), ErrExclusiveLost)
	require.ErrorContains(t, active.Health(), ErrExclusiveLost.Error())
	require.ErrorIs(t, active.MarkProcessed(context.Background(), tok(unacked)), ErrExclusiveLost,
		"a watcher that lost the lock saves nothing")
	ids := e.insert(2)
	require.Equal(t, ids, receiveWithin(t, standby, 2, liveWait))
}

func TestLiveSecondWatcherWithoutExclusiveIsWarnedAbout(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	logs := newLogCounter()
	cfg := e.config(ModeHybrid)
	cfg.Logger = slog.New(logs)
	e.start(cfg)
	logs.waitFor(t, "listening", 1, liveWait)
	e.start(cfg)
	logs.waitFor(t, "another watcher with this client name is running; their deliveries and saved tokens "+
		"interleave (use Config.Exclusive, or a client name each)", 1, liveWait)

	excl := e.config(ModeHybrid)
	excl.Exclusive = true
	w := e.start(excl)
	requireNothingWithin(t, w, lock.StandbyPoll*2)
	require.False(t, w.Stats().Active, "an exclusive watcher waits for the others")
}
