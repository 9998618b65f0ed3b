package pgchangestreamtest

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/internal/processcases"
)

// id is the changelog id of an event.
func id(t *testing.T, ev pgchangestream.EventWithToken) int64 {
	n, err := strconv.ParseInt(string(ev.ResumeToken), 10, 64)
	require.NoError(t, err)
	return n
}

// inserts returns n inserts of records r1..rn.
func inserts(n int) []Change {
	out := make([]Change, n)
	for i := range out {
		out[i] = Insert("r"+strconv.Itoa(i+1), map[string]any{"n": i + 1})
	}
	return out
}

// process runs f.Process in the background; cancel stops it, and the channel gives its result.
func process(t *testing.T, f *FakeWatcher, o pgchangestream.ProcessOptions, h pgchangestream.Handler) (<-chan error, context.CancelFunc) {
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- f.Process(ctx, o, h) }()
	return errc, cancel
}

// TestFakeProcessCases runs the shared Process scenarios on the fake; the root package runs the
// same table on a watcher (TestProcessCases).
func TestFakeProcessCases(t *testing.T) {
	for _, c := range processcases.All {
		t.Run(c.Name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := started(t, pgchangestream.Config{}, inserts(c.Events)...)
				run := c.NewRun()
				o := pgchangestream.ProcessOptions{Workers: c.Workers, MaxAttempts: c.MaxAttempts,
					Key: func(ev pgchangestream.EventWithToken) string { return c.Key(id(t, ev)) }}
				errc, cancel := process(t, f, o, func(_ context.Context, ev pgchangestream.EventWithToken) error {
					return run.Handle(id(t, ev))
				})
				defer cancel()
				if c.Stops {
					require.ErrorContains(t, <-errc, c.Err)
				} else {
					time.Sleep(time.Hour) // every retry's backoff is over
					synctest.Wait()
					cancel()
					require.NoError(t, <-errc)
				}
				require.NoError(t, run.Check())
				st := f.Stats()
				require.Equal(t, c.Saved, savedID(t, f), "saved checkpoint")
				require.Equal(t, uint64(c.Saved), st.Acked, "acknowledged deliveries")
				require.Equal(t, c.Handled, st.Process.Handled, "handled")
				require.Equal(t, c.Retries, st.Process.Retries, "retries")
			})
		})
	}
}

// gate holds the handler of each event until the test opens it.
type gate struct {
	mu    sync.Mutex
	gates map[int64]chan struct{}
}

func newGate(ids ...int64) *gate {
	g := &gate{gates: map[int64]chan struct{}{}}
	for _, id := range ids {
		g.gates[id] = make(chan struct{})
	}
	return g
}

// wait blocks until id is opened (ids without a gate pass) or ctx ends.
func (g *gate) wait(ctx context.Context, id int64) error {
	g.mu.Lock()
	c := g.gates[id]
	g.mu.Unlock()
	if c == nil {
		return nil
	}
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gate) open(id int64) { close(g.gates[id]) }

func TestFakeProcessAcknowledgesTheContiguousPrefix(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := started(t, pgchangestream.Config{TableName: "items"}, inserts(6)...)
		g := newGate(1, 2, 3, 4, 5, 6)
		errc, cancel := process(t, f, pgchangestream.ProcessOptions{Workers: 6},
			func(ctx context.Context, ev pgchangestream.EventWithToken) error { return g.wait(ctx, id(t, ev)) })
		synctest.Wait()
		require.Equal(t, 6, f.Stats().Process.BusyWorkers)
		g.open(2)
		g.open(3)
		synctest.Wait()
		require.Empty(t, f.Acked(), "2 and 3 finished, but 1 has not")
		require.Equal(t, int64(0), savedID(t, f))
		g.open(1)
		g.open(5)
		synctest.Wait()
		require.Equal(t, []string{"1", "2", "3"}, f.Acked(), "the prefix 1..3, not 5 past the running 4")
		require.Equal(t, int64(3), savedID(t, f))
		require.Equal(t, 2, f.Stats().Process.InFlight, "4 and 6 run")
		require.Empty(t, f.Marks(), "Process acknowledges without MarkProcessed")
		g.open(4)
		g.open(6)
		synctest.Wait()
		require.Equal(t, int64(6), savedID(t, f))
		cancel()
		require.NoError(t, <-errc)
		require.Equal(t, uint64(6), f.Stats().Process.Handled)
	})
}

func TestFakeProcessKeepsPerKeyOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Records a, b, a, b, a, ...: the default key is the changed row.
		var changes []Change
		for i := range 10 {
			changes = append(changes, Update(string(rune('a'+i%2)), nil, map[string]any{"v": i}))
		}
		f := started(t, pgchangestream.Config{TableName: "items"}, changes...)
		var mu sync.Mutex
		seen := map[string][]int64{}
		errc, cancel := process(t, f, pgchangestream.ProcessOptions{Workers: 4},
			func(_ context.Context, ev pgchangestream.EventWithToken) error {
				n := id(t, ev)
				time.Sleep(time.Duration(10-n) * time.Millisecond) // earlier events are slower
				mu.Lock()
				defer mu.Unlock()
				k := pgchangestream.DocumentKey(ev)
				seen[k] = append(seen[k], n)
				return nil
			})
		time.Sleep(time.Second)
		synctest.Wait()
		cancel()
		require.NoError(t, <-errc)
		require.Equal(t, map[string][]int64{"items/a": {1, 3, 5, 7, 9}, "items/b": {2, 4, 6, 8, 10}}, seen)
		require.Equal(t, 5, f.Stats().Process.LongestKeyQueue)
	})
}

func TestFakeProcessParksAndRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := started(t, pgchangestream.Config{ClientName: "billing", TableName: "items"}, inserts(3)...)
		var mu sync.Mutex
		broken := true
		errc, cancel := process(t, f, pgchangestream.ProcessOptions{MaxAttempts: 2, OnFailure: pgchangestream.ParkOnFailure},
			func(_ context.Context, ev pgchangestream.EventWithToken) error {
				mu.Lock()
				defer mu.Unlock()
				if id(t, ev) == 2 && broken {
					return errors.New("no such account")
				}
				return nil
			})
		defer cancel()
		time.Sleep(time.Second)
		synctest.Wait()
		require.Equal(t, int64(3), savedID(t, f), "the parked event is finished: the mark passes it")
		parked := f.Parked()
		require.Len(t, parked, 1)
		p := parked[0]
		require.Equal(t, pgchangestream.ParkedEvent{ID: p.ID, Client: "billing", Key: "items/r2", Table: "items",
			ChangelogID: 2, Event: p.Event, Error: "no such account", Attempts: 2, ParkedAt: p.ParkedAt}, p)
		require.Equal(t, uint64(1), f.Stats().Process.Parked)

		require.ErrorIs(t, f.RetryParked(p.ID+1), pgchangestream.ErrNotParked)
		require.NoError(t, f.RetryParked(p.ID))
		time.Sleep(pgchangestream.DefaultParkedPollInterval)
		synctest.Wait()
		require.Equal(t, "no such account", f.Parked()[0].Error, "a failed rerun is parked again")
		require.False(t, f.Parked()[0].RetryRequested)

		mu.Lock()
		broken = false
		mu.Unlock()
		require.NoError(t, f.RetryParked(p.ID))
		time.Sleep(pgchangestream.DefaultParkedPollInterval)
		synctest.Wait()
		require.Empty(t, f.Parked(), "a successful rerun leaves the table")
		require.Equal(t, uint64(3), f.Stats().Process.Handled)
		cancel()
		require.NoError(t, <-errc)
	})
}

func TestFakeProcessBlocksAKeyUntilReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Records a, b, a, b: 1 of a fails, so 3 of a is parked behind it, while b goes on.
		f := started(t, pgchangestream.Config{TableName: "items"},
			Insert("a", nil), Insert("b", nil), Update("a", nil, map[string]any{"v": 1}), Update("b", nil, map[string]any{"v": 1}))
		var mu sync.Mutex
		broken := true
		var ran []int64
		errc, cancel := process(t, f, pgchangestream.ProcessOptions{Workers: 2, MaxAttempts: 1, OnFailure: pgchangestream.BlockOnFailure},
			func(_ context.Context, ev pgchangestream.EventWithToken) error {
				mu.Lock()
				defer mu.Unlock()
				ran = append(ran, id(t, ev))
				if id(t, ev) == 1 && broken {
					return errors.New("bad")
				}
				return nil
			})
		defer cancel()
		time.Sleep(time.Second)
		synctest.Wait()
		parked := f.Parked()
		require.Len(t, parked, 2)
		require.Equal(t, []int64{1, 3}, []int64{parked[0].ChangelogID, parked[1].ChangelogID})
		require.True(t, parked[0].Blocking && parked[1].Blocking)
		require.NotContains(t, ran, int64(3), "the key's later event is parked without running")
		require.Equal(t, int64(4), savedID(t, f))

		mu.Lock()
		broken, ran = false, nil
		mu.Unlock()
		require.NoError(t, f.RetryParked(parked[1].ID))
		time.Sleep(pgchangestream.DefaultParkedPollInterval)
		synctest.Wait()
		require.Empty(t, f.Parked())
		mu.Lock()
		require.Equal(t, []int64{1, 3}, ran, "releasing the key reruns its parked events in order")
		mu.Unlock()
		cancel()
		require.NoError(t, <-errc)
	})
}

func TestFakeProcessDropParked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := started(t, pgchangestream.Config{}, inserts(1)...)
		errc, cancel := process(t, f, pgchangestream.ProcessOptions{MaxAttempts: 1, OnFailure: pgchangestream.ParkOnFailure},
			func(context.Context, pgchangestream.EventWithToken) error { return errors.New("bad") })
		synctest.Wait()
		cancel()
		require.NoError(t, <-errc)
		p := f.Parked()
		require.Len(t, p, 1)
		require.NoError(t, f.DropParked(p[0].ID))
		require.Empty(t, f.Parked())
		require.ErrorIs(t, f.DropParked(p[0].ID), pgchangestream.ErrNotParked)
	})
}

func TestFakeProcessShutdownGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := started(t, pgchangestream.Config{TableName: "items"}, inserts(2)...)
		cancelled := make(chan struct{})
		errc, cancel := process(t, f, pgchangestream.ProcessOptions{Workers: 2, GracePeriod: 5 * time.Second},
			func(ctx context.Context, ev pgchangestream.EventWithToken) error {
				if id(t, ev) == 1 {
					time.Sleep(time.Second) // finishes within the grace period
					return nil
				}
				<-ctx.Done() // never finishes by itself
				close(cancelled)
				return ctx.Err()
			})
		synctest.Wait()
		stop := time.Now()
		cancel()
		require.NoError(t, <-errc)
		require.Equal(t, 5*time.Second, time.Since(stop), "Process waited for the grace period")
		<-cancelled
		require.Equal(t, []string{"1"}, f.Acked(), "the event finished in the grace period is acknowledged, the cancelled one not")
		require.Equal(t, int64(1), savedID(t, f))
		require.Zero(t, f.Stats().Process.InFlight)
	})
}

func TestFakeProcessEndsWithEventsAndSavesFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := NewFakeWatcher(pgchangestream.Config{})
		f.Push(inserts(3)...)
		f.Start(t.Context())
		f.FailSaves(errors.New("disk full"))
		f.CloseWhenDelivered()
		err := f.Process(t.Context(), pgchangestream.ProcessOptions{}, func(context.Context, pgchangestream.EventWithToken) error { return nil })
		require.ErrorContains(t, err, "disk full", "the final save's error")
		require.Equal(t, []string{"1", "2", "3"}, f.Acked(), "the acknowledgement is kept")
		f.FailSaves(nil)
		require.NoError(t, f.MarkProcessed(t.Context(), nil))
		require.Equal(t, int64(3), savedID(t, f), "the next save includes it")
	})
}

func TestFakeProcessRefusesBadCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ok := func(context.Context, pgchangestream.EventWithToken) error { return nil }
		unstarted := NewFakeWatcher(pgchangestream.Config{})
		require.ErrorContains(t, unstarted.Process(t.Context(), pgchangestream.ProcessOptions{}, ok), "not started")
		f := started(t, pgchangestream.Config{})
		require.ErrorIs(t, f.Process(t.Context(), pgchangestream.ProcessOptions{Workers: 4, MaxInFlight: 2}, ok), pgchangestream.ErrInvalidConfig)
		require.ErrorIs(t, f.Process(t.Context(), pgchangestream.ProcessOptions{}, nil), pgchangestream.ErrInvalidConfig)
		errc, cancel := process(t, f, pgchangestream.ProcessOptions{}, ok)
		synctest.Wait()
		require.ErrorIs(t, f.Process(t.Context(), pgchangestream.ProcessOptions{}, ok), errProcessRunning)
		cancel()
		require.NoError(t, <-errc)
	})
}
