package backoff

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// requireJittered checks that got is base changed by at most a fifth either way.
func requireJittered(t *testing.T, base, got time.Duration) {
	t.Helper()
	require.GreaterOrEqual(t, got, base-base/5, "base %s", base)
	require.Less(t, got, base+base/5, "base %s", base)
}

func TestBackoffDoublesUpToMaxAndResets(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	for range 2 {
		for _, base := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
			requireJittered(t, base*time.Millisecond, b.Next())
		}
		b.Reset()
	}
}

func TestDelays(t *testing.T) {
	delay := Delays(100*time.Millisecond, 30*time.Second)
	for n, base := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond,
		5: 1600 * time.Millisecond, 10: 30 * time.Second, 1000: 30 * time.Second} {
		requireJittered(t, base, delay(n))
	}
}

func TestJitter(t *testing.T) {
	for _, d := range []time.Duration{0, 1, 4} {
		require.Equal(t, d, Jitter(d), "too short to change")
	}
	seen := map[time.Duration]bool{}
	for range 100 {
		got := Jitter(time.Second)
		requireJittered(t, time.Second, got)
		seen[got] = true
	}
	require.Greater(t, len(seen), 1, "the waits differ")
}

func TestSleepWaitsTheWholeDuration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		require.True(t, Sleep(t.Context(), 5*time.Second))
		require.Equal(t, 5*time.Second, time.Since(start))
	})
}

func TestSleepEndsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		start := time.Now()
		time.AfterFunc(2*time.Second, cancel)
		require.False(t, Sleep(ctx, time.Hour))
		require.Equal(t, 2*time.Second, time.Since(start), "it returns when ctx ends")

		require.False(t, Sleep(ctx, time.Hour), "an ended ctx does not wait")
		require.Equal(t, 2*time.Second, time.Since(start))
	})
}
