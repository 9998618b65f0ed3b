package backoff

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

func TestSleepWaitsOrStopsWithTheContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if !Sleep(t.Context(), time.Second) || time.Since(start) != time.Second {
			t.Fatalf("Sleep returned after %v, want true after 1s", time.Since(start))
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start = time.Now()
		if Sleep(ctx, time.Minute) || time.Since(start) != time.Second {
			t.Fatalf("Sleep returned after %v, want false when the context ends after 1s", time.Since(start))
		}
	})
}
