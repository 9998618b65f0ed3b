package pgchangestream

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/internal/procface"
	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

// tokenID is the changelog id of an event.
func tokenID(t *testing.T, ev EventWithToken) int64 {
	id, err := strconv.ParseInt(string(ev.ResumeToken), 10, 64)
	require.NoError(t, err)
	return id
}

// startProcess runs Process in the background; cancel stops it, and the channel gives its
// result.
func startProcess(t *testing.T, w *Watcher, o ProcessOptions, h Handler) (<-chan error, context.CancelFunc) {
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- w.Process(ctx, o, h) }()
	return errc, cancel
}

// byParity keys events by the parity of their changelog id.
func byParity(ev EventWithToken) string {
	id, _, _ := position.ParseToken(ev.ResumeToken)
	return strconv.FormatInt(id%2, 10)
}

func TestProcessAcknowledgesTheLowWaterMark(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 6)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		hold := make(chan struct{})
		evenHot := func(ev EventWithToken) string { // the even ids share one key, the odd ones have one each
			if k := byParity(ev); k == "1" {
				return string(ev.ResumeToken)
			}
			return "hot"
		}
		errc, cancel := startProcess(t, w, ProcessOptions{Workers: 2, Key: evenHot}, func(_ context.Context, ev EventWithToken) error {
			if tokenID(t, ev) == 2 {
				<-hold
			}
			return nil
		})
		synctest.Wait()
		require.Equal(t, uint64(1), w.Stats().Acked, "only the prefix before the running event is acknowledged")
		require.Equal(t, rowPos(f, 2).Predecessor(), f.token(t, "c"), "the saved token stops before it")
		st := w.Stats().Process
		require.Equal(t, 3, st.InFlight, "2 runs, 4 and 6 wait behind it")
		require.Equal(t, 1, st.BusyWorkers)
		close(hold)
		synctest.Wait()
		require.Equal(t, rowPos(f, 6), f.token(t, "c"))
		cancel()
		require.NoError(t, <-errc)
		st = w.Stats().Process
		require.Equal(t, uint64(6), st.Handled)
		require.Zero(t, st.InFlight)
		require.Equal(t, 3, st.LongestKeyQueue)
		require.Equal(t, "hot", st.LongestKey)
		closeWatcher(t, w)
	})
}

func TestProcessRetriesAFailedSave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 3)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		synctest.Wait()
		f.mu.Lock()
		f.failSaves = 2
		f.mu.Unlock()
		errc, cancel := startProcess(t, w, ProcessOptions{}, func(context.Context, EventWithToken) error { return nil })
		time.Sleep(time.Second)
		synctest.Wait()
		require.Equal(t, rowPos(f, 3), f.token(t, "c"), "the acknowledgement survived the failed saves")
		require.Equal(t, uint64(2), w.Stats().CheckpointErrors)
		cancel()
		require.NoError(t, <-errc)
		closeWatcher(t, w)
	})
}

func TestProcessHandlerPanicStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 3)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		errc, cancel := startProcess(t, w, ProcessOptions{MaxAttempts: 2, Key: byParity}, func(_ context.Context, ev EventWithToken) error {
			if tokenID(t, ev) == 2 {
				panic("bad event")
			}
			return nil
		})
		defer cancel()
		err := <-errc
		require.ErrorIs(t, err, ErrPanic)
		require.ErrorContains(t, err, `key "0"`)
		require.ErrorContains(t, err, "token 2")
		require.Equal(t, rowPos(f, 2).Predecessor(), f.token(t, "c"), "the failed event is not certified")
		require.Equal(t, uint64(1), w.Stats().Process.Retries)
		closeWatcher(t, w)
	})
}

func TestProcessGracePeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 2)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		var cancelled atomic.Bool
		errc, cancel := startProcess(t, w, ProcessOptions{Workers: 2, Key: byParity, GracePeriod: 5 * time.Second},
			func(ctx context.Context, ev EventWithToken) error {
				if tokenID(t, ev) == 1 {
					time.Sleep(time.Second) // finishes within the grace period
					return ctx.Err()
				}
				<-ctx.Done() // never finishes by itself
				cancelled.Store(true)
				return ctx.Err()
			})
		synctest.Wait()
		stop := time.Now()
		cancel()
		require.NoError(t, <-errc)
		require.Equal(t, 5*time.Second, time.Since(stop))
		require.True(t, cancelled.Load(), "the unfinished handler's ctx was cancelled")
		require.Equal(t, rowPos(f, 2).Predecessor(), f.token(t, "c"), "the finished event is saved, the other is not")
		closeWatcher(t, w)

		w2 := startOn(t, t.Context(), f, Config{})
		require.Equal(t, []int64{2}, receive(t, w2, 1), "only the unfinished event is delivered again")
		synctest.Wait()
		require.Zero(t, len(w2.Events()), "and nothing else")
		closeWatcher(t, w2)
	})
}

func TestProcessEndsWhenTheWatcherCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 2)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		errc, cancel := startProcess(t, w, ProcessOptions{}, func(context.Context, EventWithToken) error { return nil })
		defer cancel()
		synctest.Wait()
		closeWatcher(t, w)
		require.NoError(t, <-errc)
		require.Equal(t, rowPos(f, 2), f.token(t, "c"))
	})
}

func TestProcessParkWithoutADeadLetterTableCertifiesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 1)
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
		errc, cancel := startProcess(t, w, ProcessOptions{MaxAttempts: 1, OnFailure: ParkOnFailure},
			func(context.Context, EventWithToken) error { return errors.New("fails") })
		time.Sleep(time.Minute)
		synctest.Wait()
		cancel()
		require.NoError(t, <-errc)
		require.Equal(t, rowPos(f, 1).Predecessor(), f.token(t, "c"), "an event that could not be parked is not finished")
		require.Zero(t, w.Stats().Process.Parked)
		closeWatcher(t, w)
	})
}

func TestProcessRefusesBadCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		ok := func(context.Context, EventWithToken) error { return nil }
		cfg := testConfig(Config{})
		cfg.DB = f.open(t)
		unstarted, err := New(cfg)
		require.NoError(t, err)
		require.ErrorContains(t, unstarted.Process(t.Context(), ProcessOptions{}, ok), "not started")

		w := startOn(t, t.Context(), f, Config{})
		for _, o := range []ProcessOptions{
			{Workers: -1}, {Workers: 4, MaxInFlight: 2}, {MaxAttempts: -1}, {RetryMinBackoff: -1},
			{RetryMinBackoff: time.Second, RetryMaxBackoff: time.Millisecond}, {GracePeriod: -1},
			{ParkedPollInterval: -1}, {OnFailure: 7}, {MaxKeyQueue: -1}, {MaxDeferred: -1},
		} {
			require.ErrorIs(t, w.Process(t.Context(), o, ok), ErrInvalidConfig, "%+v", o)
		}
		require.ErrorIs(t, w.Process(t.Context(), ProcessOptions{}, nil), ErrInvalidConfig)

		errc, cancel := startProcess(t, w, ProcessOptions{}, ok)
		synctest.Wait()
		require.ErrorIs(t, w.Process(t.Context(), ProcessOptions{}, ok), errProcessRunning)
		cancel()
		require.NoError(t, <-errc)
		closeWatcher(t, w)
	})
}

func TestProcessKeys(t *testing.T) {
	ev := EventWithToken{Event: Event{"ns": map[string]any{"coll": "items"}, "documentKey": map[string]any{"_id": "r1"},
		"fullDocument": map[string]any{"healthevent": map[string]any{"nodeName": "node-7"}}}}
	require.Equal(t, "items/r1", DocumentKey(ev))
	require.Equal(t, "node-7", NodeNameKey(ev))
	delete(ev.Event, "fullDocument")
	require.Equal(t, "items/r1", NodeNameKey(ev), "no node name: the document key")
	require.Empty(t, DocumentKey(EventWithToken{Event: Event{}}))
}

// errNoDeadLetters is the error of every call of noParkedStore.
var errNoDeadLetters = errors.New("dead-letter table not available")

// noParkedStore is a dead-letter store that fails every call.
type noParkedStore struct{}

func (noParkedStore) Park(context.Context, ParkedEvent) (int64, error) { return 0, errNoDeadLetters }
func (noParkedStore) BlockedKeys(context.Context) ([]string, error)    { return nil, errNoDeadLetters }
func (noParkedStore) Released(context.Context, int) ([]ParkedEvent, error) {
	return nil, errNoDeadLetters
}
func (noParkedStore) KeyEvents(context.Context, string) ([]ParkedEvent, error) {
	return nil, errNoDeadLetters
}
func (noParkedStore) Repark(context.Context, int64, int, string) error { return errNoDeadLetters }
func (noParkedStore) Finish(context.Context, int64) error              { return errNoDeadLetters }

// fakeParked records what the dead-letter adapter asks of the store.
type fakeParked struct {
	noParkedStore
	parkedRows []ParkedEvent
	rows       []ParkedEvent
}

func (s *fakeParked) Park(_ context.Context, p ParkedEvent) (int64, error) {
	s.parkedRows = append(s.parkedRows, p)
	return int64(len(s.parkedRows)), nil
}

func (s *fakeParked) Released(context.Context, int) ([]ParkedEvent, error) { return s.rows, nil }

func TestDeadLettersAdapter(t *testing.T) {
	s := &fakeParked{rows: []ParkedEvent{{ID: 9, Key: "k", ChangelogID: 452, Blocking: true, Event: Event{"a": 1}}}}
	d := procface.DeadLetters[EventWithToken]{Client: "c", Store: s, Events: events}
	ev := EventWithToken{Event: Event{"ns": map[string]any{"coll": "items"}}, ResumeToken: []byte("452")}
	j := &procrunJob{Ev: ev, Key: "k", Attempts: 3, LastErr: errors.New("boom")}
	require.NoError(t, d.Park(t.Context(), j, true))
	j.LastErr = nil
	require.NoError(t, d.Park(t.Context(), j, true))
	require.Equal(t, ParkedEvent{Client: "c", Key: "k", Table: "items", ChangelogID: 452, Event: ev.Event,
		Error: "boom", Attempts: 3, Blocking: true}, s.parkedRows[0])
	require.Equal(t, procface.BlockedKeyError, s.parkedRows[1].Error, "parked without running")
	ps, err := d.Released(t.Context(), 10)
	require.NoError(t, err)
	require.Len(t, ps, 1)
	require.Equal(t, "452", string(ps[0].Ev.ResumeToken))
	require.Equal(t, int64(9), ps[0].ID)
	require.True(t, ps[0].Blocking)
	require.ErrorIs(t, d.Finish(t.Context(), 9), errNoDeadLetters)
}

type procrunJob = procrun.Job[EventWithToken]

func TestProcessSavesWhenItStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		f.insert("t", t0, 2)
		// Batched checkpoints: acknowledgements stay in memory until the hourly save.
		w := startOn(t, t.Context(), f, Config{StartFromBeginning: true, CheckpointInterval: time.Hour})
		errc, cancel := startProcess(t, w, ProcessOptions{}, func(context.Context, EventWithToken) error { return nil })
		synctest.Wait()
		require.Equal(t, Position{}, f.token(t, "c"), "nothing saved while running")
		cancel()
		require.NoError(t, <-errc)
		require.Equal(t, rowPos(f, 2), f.token(t, "c"), "the stop saved the mark")
		closeWatcher(t, w)
	})
}

// withDefaults returns o with the defaults Process fills in.
func (o ProcessOptions) withDefaults() ProcessOptions {
	return ProcessOptions(o.options().WithDefaults(DocumentKey))
}
