package procrun

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// deferRig is a rig whose engine defers: it counts the full events the engine holds (taken or
// restored, and not handled yet) and the restores, and can fail restores.
type deferRig struct {
	*rig
	mu          sync.Mutex
	full, most  int // full events held now, and the most ever
	restores    map[int]int
	failRestore func(ev tev, try int) error
	restoreErrs atomic.Int64
}

func newDeferRig(t *testing.T) *deferRig {
	return &deferRig{rig: newRig(t), restores: map[int]int{}}
}

func (r *deferRig) count(delta int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.full += delta
	r.most = max(r.most, r.full)
}

func (r *deferRig) mostFull() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.most
}

func (r *deferRig) hooks() Hooks[tev] {
	h := r.rig.hooks(nil)
	h.Key = func(e tev) string {
		r.count(1) // called once per event taken, on the full event
		return e.key
	}
	h.Run = func(ctx context.Context, j *Job[tev]) error {
		if j.Ev.key == "" || j.Deferred {
			r.t.Errorf("event %d handed over deferred", j.Ev.n)
		}
		err := r.run(ctx, j)
		if err == nil {
			r.count(-1)
		}
		return err
	}
	h.Defer = func(e tev) tev {
		r.count(-1)
		return tev{n: e.n} // the compact form: no key (the engine keeps it in the job)
	}
	h.Restore = func(_ context.Context, c tev) (tev, error) {
		r.mu.Lock()
		r.restores[c.n]++
		try, fail := r.restores[c.n], r.failRestore
		r.mu.Unlock()
		if c.key != "" {
			r.t.Errorf("event %d restored but not deferred", c.n)
		}
		if fail != nil {
			if err := fail(c, try); err != nil {
				return c, err
			}
		}
		r.count(1)
		return tev{key: keyOf(c.n), n: c.n}, nil
	}
	h.RestoreFailed = func(string, error) { r.restoreErrs.Add(1) }
	return h
}

// keyOf is the key of event n in these tests: "hot" for the first 50, "two" for 101 and 102,
// "c<n>" for the others.
func keyOf(n int) string {
	switch {
	case n <= 50:
		return "hot"
	case n == 101 || n == 102:
		return "two"
	}
	return fmt.Sprint("c", n)
}

func (r *deferRig) start(o Options) (<-chan error, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- Run(ctx, o, r.src, r.hooks()) }()
	return ch, cancel
}

func deferOpts(workers, maxInFlight, maxKeyQueue, maxDeferred int) Options {
	o := opts(workers, maxInFlight)
	o.MaxKeyQueue, o.MaxDeferred = maxKeyQueue, maxDeferred
	return o
}

// feedAsync sends evs in the background and counts the events the engine took.
func (r *deferRig) feedAsync(evs []tev) *atomic.Int64 {
	var sent atomic.Int64
	go func() {
		for _, e := range evs {
			r.src <- e
			sent.Add(1)
		}
	}()
	return &sent
}

func TestDeferKeepsColdKeysFlowingPastAHotKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newDeferRig(t)
		hold := make(chan struct{})
		r.handle = func(_ context.Context, e tev) {
			if e.n == 1 {
				<-hold
			}
		}
		o := deferOpts(4, 10, 2, 100)
		errc, cancel := r.start(o)
		sent := r.feedAsync(events(1, 70, keyOf)) // 50 of the hot key, then 20 cold keys
		synctest.Wait()
		require.Equal(t, int64(70), sent.Load(), "the hot key's events past MaxKeyQueue are deferred, so reading goes on")
		for n := 51; n <= 70; n++ {
			require.Equal(t, []int{n}, r.ranOf(keyOf(n)), "cold event %d ran while the hot key is held", n)
		}
		require.Equal(t, int64(48), r.stats.Deferred.Load(), "the hot key holds MaxKeyQueue full events, the rest deferred")
		require.Equal(t, 0, r.lastAdvanced(), "the mark waits for the hot key's first event")
		close(hold)
		synctest.Wait()
		require.Equal(t, events(1, 50, keyOf), withKeys(r.ranOf("hot")), "the deferred events ran restored, in order")
		require.Equal(t, 70, r.lastAdvanced())
		require.LessOrEqual(t, r.mostFull(), o.MaxInFlight, "full events held never exceed MaxInFlight")
		require.Equal(t, int64(0), r.restoreErrs.Load())
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}

// withKeys turns event numbers into the events keyOf gives them.
func withKeys(ns []int) []tev {
	evs := make([]tev, len(ns))
	for i, n := range ns {
		evs[i] = tev{key: keyOf(n), n: n}
	}
	return evs
}

func TestDeferKeepsPerKeyOrderAndTheBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newDeferRig(t)
		rng := rand.New(rand.NewPCG(3, 4))
		r.handle = func(_ context.Context, e tev) { time.Sleep(time.Duration(e.n*7%10) * time.Millisecond) }
		o := deferOpts(3, 6, 1, 40)
		errc, cancel := r.start(o)
		keys := map[int]string{}
		evs := events(1, 800, func(i int) string { // a skewed spread: key k0 takes about half
			k := "k0"
			if rng.IntN(2) == 0 {
				k = fmt.Sprint("k", rng.IntN(12))
			}
			keys[i] = k
			return k
		})
		r.feed(evs...)
		time.Sleep(time.Hour)
		synctest.Wait()
		want := map[string][]int{}
		for _, e := range evs {
			want[e.key] = append(want[e.key], e.n)
		}
		for k, ns := range want {
			require.Equal(t, ns, r.ranOf(k), "key %s: every event once, in delivery order", k)
		}
		require.Equal(t, 800, r.lastAdvanced())
		require.Positive(t, len(r.restores), "events were deferred")
		require.LessOrEqual(t, r.mostFull(), o.MaxInFlight, "full events held never exceed MaxInFlight")
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}

func TestFailedRestoreIsRetriedAndKeepsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newDeferRig(t)
		r.failRestore = func(e tev, try int) error {
			if e.n == 3 && try <= 2 {
				return errors.New("database down")
			}
			return nil
		}
		var ranAt sync.Map
		hold := make(chan struct{})
		r.handle = func(_ context.Context, e tev) {
			if e.n == 1 {
				<-hold
			}
			ranAt.Store(e.n, time.Now())
		}
		start := time.Now()
		errc, cancel := r.start(deferOpts(2, 10, 1, 100))
		r.feed(events(1, 6, keyOf)...)  // hot: 1 full, 2..6 deferred
		r.feed(events(51, 3, keyOf)...) // cold keys
		close(hold)
		time.Sleep(time.Minute)
		synctest.Wait()
		require.Equal(t, []int{1, 2, 3, 4, 5, 6}, r.ranOf("hot"), "every event once, in order, after the failed restores")
		require.Equal(t, int64(2), r.restoreErrs.Load())
		require.Equal(t, 3, r.restores[3], "tried until the restore worked")
		for n := 1; n <= 6; n++ {
			require.Equal(t, 1, r.attemptsOf(n), "a failed restore is no attempt of the handler")
		}
		at, _ := ranAt.Load(3)
		require.GreaterOrEqual(t, at.(time.Time).Sub(start), 3*time.Second, "backoff of Delay(1) then Delay(2)")
		for n := 51; n <= 53; n++ {
			at, _ := ranAt.Load(n)
			require.Less(t, at.(time.Time).Sub(start), time.Second, "cold key %d did not wait for the failing restore", n)
		}
		require.Equal(t, 53, r.lastAdvanced())
		require.Equal(t, uint64(0), r.stats.Retries.Load())
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}

// TestFatalRestoreStopsTheRun: a deferred event that can never be restored (its row is gone)
// stops the run with the error instead of holding its key, and the mark, for ever.
func TestFatalRestoreStopsTheRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newDeferRig(t)
		gone := errors.New("row gone")
		r.failRestore = func(e tev, _ int) error {
			if e.n == 3 {
				return Fatal(gone)
			}
			return nil
		}
		hold := make(chan struct{})
		r.handle = func(_ context.Context, e tev) {
			if e.n == 1 {
				<-hold
			}
		}
		errc, cancel := r.start(deferOpts(2, 10, 1, 100))
		defer cancel()
		r.feed(events(1, 3, keyOf)...) // hot: 1 full, 2 and 3 deferred
		synctest.Wait()
		require.Equal(t, int64(2), r.stats.Deferred.Load())
		close(hold)
		time.Sleep(time.Minute)
		synctest.Wait()
		requireFailure(t, errc, gone, 3)
		require.Equal(t, 1, r.restores[3], "a fatal restore is not tried again")
		require.Equal(t, []int{1, 2}, r.ranOf("hot"), "the key stops at the event")
		require.Equal(t, 2, r.lastAdvanced())
	})
}

func TestMaxDeferredStopsReading(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newDeferRig(t)
		hold := make(chan struct{})
		r.handle = func(_ context.Context, e tev) {
			if e.n == 1 {
				<-hold
			}
		}
		errc, cancel := r.start(deferOpts(2, 10, 2, 5))
		sent := r.feedAsync(events(1, 50, keyOf))
		synctest.Wait()
		require.Equal(t, int64(7), sent.Load(), "2 full events of the hot key, then 5 deferred: MaxDeferred stops reading")
		require.Equal(t, int64(5), r.stats.Deferred.Load())
		require.Equal(t, int64(7), r.stats.InFlight.Load())
		close(hold)
		synctest.Wait()
		require.Equal(t, int64(50), sent.Load())
		require.Equal(t, withKeys(seq(1, 50)), withKeys(r.ranOf("hot")))
		require.Equal(t, 50, r.lastAdvanced())
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}

func seq(first, last int) []int {
	var ns []int
	for n := first; n <= last; n++ {
		ns = append(ns, n)
	}
	return ns
}

func TestDeferNeedsRestoreAndBounds(t *testing.T) {
	r := newRig(t)
	h := r.hooks(nil)
	h.Defer = func(e tev) tev { return e }
	require.Error(t, Run(context.Background(), deferOpts(1, 1, 1, 1), r.src, h), "no Restore")
	h.Restore = func(_ context.Context, e tev) (tev, error) { return e, nil }
	require.Error(t, Run(context.Background(), deferOpts(1, 1, 0, 1), r.src, h), "no MaxKeyQueue")
}

// A deferred head that becomes ready while MaxInFlight full events are held waits for the next
// room, and no event is taken before it.
func TestDeferredHeadGetsTheNextRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newDeferRig(t)
		var sent *atomic.Int64
		sentAtRestore := int64(-1)
		r.failRestore = func(e tev, try int) error {
			if try == 1 {
				return errors.New("database down")
			}
			sentAtRestore = sent.Load()
			return nil
		}
		hold := map[int]chan struct{}{1: make(chan struct{}), 101: make(chan struct{}), 102: make(chan struct{}),
			103: make(chan struct{})}
		r.handle = func(_ context.Context, e tev) {
			if c, ok := hold[e.n]; ok {
				<-c
			}
		}
		o := deferOpts(3, 3, 2, 100)
		errc, cancel := r.start(o)
		r.feed(events(1, 3, keyOf)...) // 3 is deferred; its first restore fails: 1s of backoff
		close(hold[1])
		synctest.Wait()
		require.Equal(t, 1, r.restores[3])
		// Key two: 101 runs and holds, 102 waits behind it; 103 runs and holds: 3 full events.
		sent = r.feedAsync([]tev{{"two", 101}, {"two", 102}, {"c103", 103}, {"c104", 104}})
		synctest.Wait()
		require.Equal(t, int64(3), sent.Load())
		time.Sleep(2 * time.Second) // the backoff ended: 3 waits for room, with a worker idle
		synctest.Wait()
		require.Equal(t, []int{1, 2}, r.ranOf("hot"))
		// Room for one full event: the restore of 3 takes it, not 104. 102 then runs and holds, so
		// no room opens before the restore ran.
		close(hold[101])
		synctest.Wait()
		require.Equal(t, []int{1, 2, 3}, r.ranOf("hot"))
		require.Equal(t, int64(3), sentAtRestore, "104 waited: the restore took the room")
		close(hold[102])
		synctest.Wait()
		require.Equal(t, []int{101, 102}, r.ranOf("two"))
		close(hold[103])
		synctest.Wait()
		require.Equal(t, int64(4), sent.Load())
		require.LessOrEqual(t, r.mostFull(), o.MaxInFlight)
		require.Equal(t, 104, r.lastAdvanced())
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}
