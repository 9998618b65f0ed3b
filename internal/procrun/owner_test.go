package procrun

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// ownership is a Hooks.Owner the test moves.
type ownership struct {
	gen  atomic.Uint64
	owns atomic.Bool
}

func (o *ownership) get() (uint64, bool) { return o.gen.Load(), o.owns.Load() }

func TestHeldKeysAreLoadedAgainWhenOwnershipIsGained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		var own ownership
		own.owns.Store(true)
		r.owner = own.get
		store := &fakeStore{}
		o := opts(2, 100)
		o.Policy = Block
		errc, cancel := r.start(o, store)
		r.feed(tev{"a", 1})
		synctest.Wait()
		require.Equal(t, []int{1}, r.ranOf("a"))
		// Another owner parked an event of key a, which holds it; then the run gains its events.
		require.NoError(t, store.Park(context.Background(), &Job[tev]{Key: "a", Ev: tev{"a", 0}}, true))
		own.gen.Add(1)
		r.feed(tev{"a", 2}, tev{"b", 3})
		synctest.Wait()
		require.Zero(t, r.attemptsOf(2), "an event of a key held by another owner ran")
		require.Equal(t, []int{0, 2}, store.parked())
		require.Equal(t, []int{3}, r.ranOf("b"))
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}

func TestANonOwnerPollsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		var own ownership
		r.owner = own.get
		store := &fakeStore{}
		require.NoError(t, store.Park(context.Background(), &Job[tev]{Key: "a", Ev: tev{"a", 1}}, false))
		store.release(1)
		o := opts(2, 100)
		o.Policy = Park
		errc, cancel := r.start(o, store)
		time.Sleep(3 * o.PollInterval)
		synctest.Wait()
		require.Zero(t, r.attemptsOf(1), "a standby ran a released event")
		own.owns.Store(true)
		time.Sleep(o.PollInterval)
		synctest.Wait()
		require.Equal(t, []int{1}, r.ranOf("a"), "the owner runs it")
		require.Empty(t, store.parked())
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}

func TestARerunNotOwnedIsDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		store := &fakeStore{}
		for n := 1; n <= 2; n++ {
			require.NoError(t, store.Park(context.Background(), &Job[tev]{Key: "a", Ev: tev{"a", n}}, true))
		}
		var notOwned atomic.Bool
		notOwned.Store(true)
		r.fail = func(e tev, _ int) error {
			if e.n == 1 && notOwned.Load() {
				return ErrNotOwned
			}
			return nil
		}
		o := opts(2, 100)
		o.Policy = Block
		errc, cancel := r.start(o, store)
		store.release(1)
		time.Sleep(o.PollInterval)
		synctest.Wait()
		require.Equal(t, 1, r.attemptsOf(1))
		require.Zero(t, r.attemptsOf(2), "a rerun ran ahead of a dropped one of its key")
		require.Equal(t, []int{1, 2}, store.parked(), "a dropped rerun leaves its parked event as it is")
		r.feed(tev{"a", 3})
		synctest.Wait()
		require.Zero(t, r.attemptsOf(3), "the key is held again")
		require.Equal(t, []int{1, 2, 3}, store.parked(), "a held key's later event is parked")
		notOwned.Store(false)
		time.Sleep(o.PollInterval) // the event is still released: the next poll releases the key
		synctest.Wait()
		require.Equal(t, []int{1, 2, 3}, r.ranOf("a"))
		require.Empty(t, store.parked())
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}
