// Package backoff holds the waits of the library's loops.
package backoff

import (
	"context"
	"time"
)

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
