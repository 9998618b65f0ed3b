// Package backoff holds the capped, jittered exponential backoff and the one cancellable sleep
// that every retrying or polling loop of the watcher uses.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is a capped exponential backoff with jitter: the first wait is Min, each next one
// twice the last, at most Max, each changed by [Jitter]. Its zero state (and [Backoff.Reset])
// starts again at Min.
type Backoff struct {
	Min, Max time.Duration
	cur      time.Duration // the last wait before jitter; 0 before the first
}

// Next returns the next wait.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.Min
	} else {
		b.cur = min(2*b.cur, b.Max)
	}
	return Jitter(b.cur)
}

// Reset starts the backoff again at Min, after a success.
func (b *Backoff) Reset() { b.cur = 0 }

// Delays returns the wait before try n+1 after n failures: Backoff's capped, jittered doubling
// from lo to hi.
func Delays(lo, hi time.Duration) func(n int) time.Duration {
	return func(n int) time.Duration {
		b := Backoff{Min: lo, Max: hi}
		for range min(n, 64) - 1 {
			b.Next()
		}
		return b.Next()
	}
}

// Jitter returns d changed by a random amount of up to a fifth either way.
func Jitter(d time.Duration) time.Duration {
	if d < 5 {
		return d
	}
	return d - d/5 + rand.N(2*d/5)
}

// Sleep waits for d or the end of ctx; it returns false when ctx ended.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
