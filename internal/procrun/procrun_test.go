package procrun

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// Each test runs in a synctest bubble: time is virtual, and the bubble fails the test if a
// goroutine the engine started is still blocked after the test's function returns.

func TestPerKeyOrderAndMutualExclusion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		rng := rand.New(rand.NewPCG(1, 2))
		r.handle = func(_ context.Context, e tev) { time.Sleep(time.Duration(e.n*7%10) * time.Millisecond) }
		errc, cancel := r.start(opts(8, 50), nil)
		evs := events(1, 600, func(int) string { return fmt.Sprint("k", rng.IntN(20)) })
		r.feed(evs...)
		time.Sleep(time.Minute)
		synctest.Wait()
		want := map[string][]int{}
		for _, e := range evs {
			want[e.key] = append(want[e.key], e.n)
		}
		for k, ns := range want {
			require.Equal(t, ns, r.ranOf(k), "key %s: every event once, in delivery order", k)
		}
		require.Equal(t, 600, r.lastAdvanced(), "the mark reaches the last event")
		require.True(t, slices.IsSorted(r.advancedAll()), "the mark only moves forward")
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
		require.Equal(t, uint64(600), r.stats.Handled.Load())
	})
}

func TestWorkersRunAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		var now, most atomic.Int64
		hold := make(chan struct{})
		r.handle = func(context.Context, tev) {
			n := now.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-hold
			now.Add(-1)
		}
		errc, cancel := r.start(opts(4, 100), nil)
		r.feed(events(1, 12, func(i int) string { return fmt.Sprint("k", i%6) })...)
		synctest.Wait()
		require.Equal(t, int64(4), most.Load(), "Workers handlers run at once, no more")
		require.Equal(t, int64(4), r.stats.Busy.Load())
		close(hold)
		synctest.Wait()
		require.Equal(t, 12, r.lastAdvanced())
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}

func TestBackPressureWithHotKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		hold := make(chan struct{})
		r.handle = func(_ context.Context, e tev) {
			if e.n == 1 {
				<-hold
			}
		}
		o := opts(2, 10)
		errc, cancel := r.start(o, nil)
		var sent atomic.Int64
		go func() { // one hot key: every event of key "hot" waits behind event 1
			for _, e := range events(1, 100, func(int) string { return "hot" }) {
				r.src <- e
				sent.Add(1)
			}
		}()
		synctest.Wait()
		require.Equal(t, int64(o.MaxInFlight), sent.Load(), "the engine stops taking events at MaxInFlight")
		require.Equal(t, int64(o.MaxInFlight), r.stats.InFlight.Load())
		n, key := r.stats.Longest()
		require.Equal(t, o.MaxInFlight, n)
		require.Equal(t, "hot", key)
		close(hold)
		synctest.Wait()
		require.Equal(t, int64(100), sent.Load())
		require.Equal(t, 100, r.lastAdvanced())
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}

func TestRetryHoldsOnlyTheFailingKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.fail = func(e tev, attempt int) error {
			if e.n == 1 && attempt < 3 {
				return errBoom
			}
			return nil
		}
		errc, cancel := r.start(opts(1, 100), nil)
		start := time.Now()
		r.feed(tev{"bad", 1}, tev{"bad", 2}, tev{"good", 3}, tev{"good", 4})
		synctest.Wait()
		require.Equal(t, []int{3, 4}, r.ranOf("good"), "other keys flow while bad backs off")
		require.Empty(t, r.ranOf("bad"), "bad's later event waits for its first")
		require.Equal(t, 0, r.lastAdvanced(), "nothing is acknowledged past the failing event")
		time.Sleep(time.Second - time.Since(start) - time.Millisecond)
		synctest.Wait()
		require.Equal(t, 1, r.attemptsOf(1), "backoff: no retry before Delay(1)")
		time.Sleep(3 * time.Second) // Delay(1) + Delay(2)
		synctest.Wait()
		require.Equal(t, []int{1, 2}, r.ranOf("bad"))
		require.Equal(t, 4, r.lastAdvanced())
		require.Equal(t, uint64(2), r.stats.Retries.Load())
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}

func TestStopPolicyReturnsTheFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.fail = failOn(2, errBoom)
		errc, cancel := r.start(opts(2, 100), nil)
		defer cancel()
		r.feed(tev{"a", 1}, tev{"b", 2}, tev{"a", 3})
		time.Sleep(time.Minute)
		synctest.Wait()
		f := requireFailure(t, errc, errBoom, 2)
		require.Equal(t, "b", f.Key)
		require.Equal(t, 3, f.Attempts)
		require.Equal(t, 3, r.attemptsOf(2))
		require.Equal(t, 1, r.lastAdvanced(), "the failed event is not acknowledged, nor anything after it")
	})
}

func TestGracePeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		var cancelledAfter atomic.Int64
		var stopAt time.Time
		r.handle = func(ctx context.Context, e tev) {
			switch e.n {
			case 1: // finishes within the grace period
				time.Sleep(5 * time.Second)
				require.NoError(t, ctx.Err(), "the handler's ctx lives during the grace period")
			case 2: // does not finish: its ctx is cancelled at the end of the grace period
				<-ctx.Done()
				cancelledAfter.Store(int64(time.Since(stopAt)))
			}
		}
		r.fail = failOn(2, context.Canceled)
		errc, cancel := r.start(opts(2, 100), nil)
		r.feed(tev{"a", 1}, tev{"b", 2}, tev{"a", 3})
		synctest.Wait()
		stopAt = time.Now()
		cancel()
		require.NoError(t, <-errc) // virtual time runs through the grace period
		require.Equal(t, int64(10*time.Second), time.Since(stopAt).Nanoseconds(), "the stop waited the grace period")
		require.Equal(t, int64(10*time.Second), cancelledAfter.Load())
		require.Equal(t, []int{1}, r.advancedAll(), "the finished handler is acknowledged, the unfinished one (and what follows it) is not")
		require.Equal(t, 1, r.attemptsOf(3), "what was taken still runs during the grace period")
	})
}

func TestSourceClosedEndsTheRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		errc, cancel := r.start(opts(2, 100), nil)
		defer cancel()
		r.feed(tev{"a", 1})
		synctest.Wait()
		close(r.src)
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
		require.Equal(t, 1, r.lastAdvanced())
	})
}

func TestParkPolicy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		store := &fakeStore{failPark: 2}
		r.fail = failOn(1, errBoom)
		o := opts(2, 100)
		o.Policy = Park
		errc, cancel := r.start(o, store)
		r.feed(tev{"a", 1}, tev{"a", 2}, tev{"b", 3})
		time.Sleep(3 * time.Second) // three attempts: the park fails twice
		synctest.Wait()
		require.Equal(t, []int{3}, r.ranOf("b"))
		require.Empty(t, r.ranOf("a"), "the key waits while its event cannot be parked")
		require.Equal(t, 0, r.lastAdvanced(), "an event that is not parked yet is not finished")
		time.Sleep(3 * time.Second) // the park's retries (Delay 1, then 2)
		synctest.Wait()
		require.Equal(t, []int{1}, store.parked())
		require.Equal(t, []int{2}, r.ranOf("a"), "the key goes on")
		require.Equal(t, 3, r.lastAdvanced(), "a parked event is finished")
		require.Equal(t, uint64(1), r.stats.Parked.Load())

		store.release(1) // an operator asks for a rerun, which now succeeds
		r.mu.Lock()
		r.fail = nil
		r.mu.Unlock()
		time.Sleep(o.PollInterval)
		synctest.Wait()
		require.Equal(t, []int{2, 1}, r.ranOf("a"), "the released event ran once")
		require.Empty(t, store.parked(), "and left the table")
		require.Equal(t, 3, r.lastAdvanced(), "a rerun is not a delivery")
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}

// TestFatalStoreErrorStopsTheRun: a park refused with Fatal (a former owner's, fenced off) is
// not retried: the run stops with its error, the event unfinished, under Park as under Stop.
func TestFatalStoreErrorStopsTheRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		errFenced := errors.New("fenced off")
		store := &fakeStore{parkErr: Fatal(errFenced)}
		r.fail = failOn(2, errBoom)
		o := opts(1, 100)
		o.Policy = Park
		errc, cancel := r.start(o, store)
		defer cancel()
		r.feed(tev{"a", 1}, tev{"a", 2}, tev{"a", 3})
		time.Sleep(time.Minute)
		synctest.Wait()
		requireFailure(t, errc, errFenced, 2)
		require.Equal(t, []string{"park"}, store.callList(), "the refused park is not retried")
		require.Equal(t, 1, r.lastAdvanced(), "the event whose park was refused is not finished")
		require.Equal(t, []int{1}, r.ranOf("a"), "its key's later events do not run")
	})
}

func TestBlockPolicyParksTheKeyUntilReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		store := &fakeStore{}
		var failing atomic.Bool
		failing.Store(true)
		r.fail = func(e tev, _ int) error {
			if e.n == 1 && failing.Load() {
				return errBoom
			}
			return nil
		}
		o := opts(2, 100)
		o.Policy = Block
		errc, cancel := r.start(o, store)
		r.feed(tev{"a", 1}, tev{"a", 2}, tev{"b", 3}, tev{"a", 4})
		time.Sleep(4 * time.Second)
		synctest.Wait()
		require.Equal(t, []int{1, 2, 4}, store.parked(), "the failed event and every later one of its key")
		require.Equal(t, 3, r.attemptsOf(1))
		require.Zero(t, r.attemptsOf(2)+r.attemptsOf(4), "later events of a blocked key do not run")
		require.Equal(t, []int{3}, r.ranOf("b"))
		require.Equal(t, 4, r.lastAdvanced(), "parked events are finished")

		// Released while the handler still fails: the rerun is reparked and the key blocked again.
		store.release(1)
		time.Sleep(o.PollInterval + 3*time.Second)
		synctest.Wait()
		require.Equal(t, 6, r.attemptsOf(1))
		require.Zero(t, r.attemptsOf(2)+r.attemptsOf(4), "the later reruns stay parked")
		require.Equal(t, []int{1, 2, 4}, store.parked())
		r.feed(tev{"a", 5})
		synctest.Wait()
		require.Zero(t, r.attemptsOf(5), "the key is blocked again")
		require.Equal(t, []int{1, 2, 4, 5}, store.parked())

		failing.Store(false)
		store.release(1)
		time.Sleep(o.PollInterval)
		synctest.Wait()
		require.Equal(t, []int{1, 2, 4, 5}, r.ranOf("a"), "the key's parked events reran in order")
		require.Empty(t, store.parked())
		r.feed(tev{"a", 6})
		synctest.Wait()
		require.Equal(t, []int{1, 2, 4, 5, 6}, r.ranOf("a"), "the key is unblocked")
		require.Equal(t, 6, r.lastAdvanced())
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}

func TestBlockedKeysSurviveARestartAndAnOperatorDrop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		store := &fakeStore{}
		require.NoError(t, store.Park(context.Background(), &Job[tev]{Key: "a", Ev: tev{"a", 0}}, true))
		o := opts(2, 100)
		o.Policy = Block
		errc, cancel := r.start(o, store)
		r.feed(tev{"a", 1}, tev{"b", 2})
		synctest.Wait()
		require.Zero(t, r.attemptsOf(1), "a key blocked before the start stays blocked")
		require.Equal(t, []int{0, 1}, store.parked())

		require.NoError(t, store.Finish(context.Background(), 1)) // an operator drops the parked events
		require.NoError(t, store.Finish(context.Background(), 2))
		time.Sleep(o.PollInterval)
		synctest.Wait()
		r.feed(tev{"a", 3})
		synctest.Wait()
		require.Equal(t, []int{3}, r.ranOf("a"), "a key with no blocking parked event is unblocked")
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}

func TestParkNeedsAStore(t *testing.T) {
	r := newRig(t)
	o := opts(1, 1)
	o.Policy = Park
	require.Error(t, Run(context.Background(), o, r.src, r.hooks(nil)))
}

func TestStopRunsWhatWasTakenWithinTheGracePeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.handle = func(context.Context, tev) { time.Sleep(time.Second) }
		r.fail = func(tev, int) error { return nil }
		o := opts(1, 100)
		o.Grace = 2500 * time.Millisecond
		errc, cancel := r.start(o, nil)
		r.feed(events(1, 5, func(int) string { return "hot" })...)
		cancel()
		require.NoError(t, <-errc)
		require.Equal(t, 3, r.lastAdvanced(), "the events run within the grace period are acknowledged")
		require.Equal(t, []int{1, 2, 3}, r.ranOf("hot"), "none starts after it")
	})
}

func TestNoRetryAfterTheStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		r.handle = func(context.Context, tev) { time.Sleep(time.Second) }
		r.fail = func(tev, int) error { return errBoom }
		errc, cancel := r.start(opts(1, 100), nil)
		r.feed(tev{"a", 1})
		cancel() // the handler is running; it fails within the grace period
		require.NoError(t, <-errc)
		require.Equal(t, 1, r.attemptsOf(1), "a failure after the stop is not retried")
		require.Zero(t, r.lastAdvanced())
		require.Zero(t, r.stats.InFlight.Load(), "the gauges are of the run in progress")
	})
}

func TestReleaseWhileTheKeyIsParking(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		store := &fakeStore{}
		var failing atomic.Bool
		failing.Store(true)
		r.fail = func(e tev, _ int) error {
			if e.n == 1 && failing.Load() {
				return errBoom
			}
			return nil
		}
		o := opts(2, 100)
		o.Policy = Block
		errc, cancel := r.start(o, store)
		r.feed(tev{"a", 1})
		time.Sleep(4 * time.Second)
		synctest.Wait()
		require.Equal(t, []int{1}, store.parked())

		gate := make(chan struct{})
		store.mu.Lock()
		store.parkGate = gate
		store.mu.Unlock()
		r.feed(tev{"a", 2}) // parked without running; the park waits at the gate
		failing.Store(false)
		store.release(1)
		time.Sleep(o.PollInterval) // the release comes while the key's park runs
		synctest.Wait()
		store.mu.Lock()
		store.parkGate = nil
		store.mu.Unlock()
		close(gate)
		synctest.Wait()
		require.Equal(t, []int{1, 2}, r.ranOf("a"), "the release waited for the park, then reran both in order")
		require.Empty(t, store.parked())
		require.Equal(t, 2, r.lastAdvanced())
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}
