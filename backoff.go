package pgchangestream

import (
	"context"
	"math/rand/v2"
	"time"

	waits "github.com/pgchangestream/pgchangestream/internal/backoff"
)

// backoff is a capped exponential backoff with jitter.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	return jitter(b.cur)
}

func (b *backoff) reset() { b.cur = 0 }

// jitter returns d changed by a random amount of up to a fifth either way.
func jitter(d time.Duration) time.Duration {
	if d < 5 {
		return d
	}
	return d - d/5 + rand.N(2*d/5)
}

// sleepCtx waits for d or the end of ctx; it returns false when ctx ended.
func sleepCtx(ctx context.Context, d time.Duration) bool { return waits.Sleep(ctx, d) }
