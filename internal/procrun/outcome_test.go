package procrun

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// A run step that finds its event done already (ErrDone) finishes it without counting it as
// handled, and a rerun that finds it so leaves the dead-letter table too.
func TestDoneFinishesWithoutHandling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t)
		store := &fakeStore{}
		r.fail = func(e tev, attempt int) error {
			switch {
			case e.n == 2:
				return fmt.Errorf("claimed before: %w", ErrDone)
			case e.n == 3 && attempt <= 3:
				return errBoom
			case e.n == 3:
				return ErrDone
			}
			return nil
		}
		o := opts(2, 100)
		o.Policy = Park
		errc, cancel := r.start(o, store)
		r.feed(tev{"a", 1}, tev{"b", 2}, tev{"c", 3})
		time.Sleep(10 * time.Second)
		synctest.Wait()
		require.Equal(t, 3, r.lastAdvanced(), "a done event is finished")
		require.Equal(t, uint64(1), r.stats.Handled.Load())
		require.Equal(t, uint64(1), r.stats.Done.Load())
		require.Equal(t, []int{3}, store.parked())

		store.release(3)
		time.Sleep(o.PollInterval)
		synctest.Wait()
		require.Empty(t, store.parked(), "a rerun found done leaves the table")
		require.Equal(t, uint64(2), r.stats.Done.Load())
		require.Equal(t, uint64(1), r.stats.Handled.Load())
		cancel()
		synctest.Wait()
		require.NoError(t, requireStopped(t, errc))
	})
}

// A Fatal error stops the run at its first attempt, under every policy: it is neither retried
// nor parked.
func TestFatalStopsAtOnce(t *testing.T) {
	for _, p := range []Policy{Stop, Park, Block} {
		synctest.Test(t, func(t *testing.T) {
			r := newRig(t)
			store := &fakeStore{}
			r.fail = failOn(2, Fatal(errBoom))
			o := opts(2, 100)
			o.Policy = p
			errc, cancel := r.start(o, store)
			defer cancel()
			r.feed(tev{"a", 1}, tev{"b", 2})
			time.Sleep(time.Minute)
			synctest.Wait()
			requireFailure(t, errc, errBoom, 2)
			require.Equal(t, 1, r.attemptsOf(2), "policy %d: not retried", p)
			require.Empty(t, store.parked(), "policy %d: not parked", p)
			require.Zero(t, r.stats.Retries.Load())
		})
	}
}
