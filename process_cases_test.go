package pgchangestream

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/processcases"
)

// TestProcessCases runs the shared Process scenarios on a watcher; the test kit's fake runs the
// same table (pgchangestreamtest's TestFakeProcessCases).
func TestProcessCases(t *testing.T) {
	for _, c := range processcases.All {
		t.Run(c.Name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFakeDB(testConfig(Config{}))
				f.insert("t", t0, c.Events)
				w := startOn(t, t.Context(), f, Config{StartFromBeginning: true})
				run := c.NewRun()
				o := ProcessOptions{Workers: c.Workers, MaxAttempts: c.MaxAttempts,
					Key: func(ev EventWithToken) string { return c.Key(tokenID(t, ev)) }}
				errc, cancel := startProcess(t, w, o, func(_ context.Context, ev EventWithToken) error {
					return run.Handle(tokenID(t, ev))
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
				st := w.Stats()
				require.Equal(t, c.Saved, f.token(t, "c").ID, "saved checkpoint")
				require.Equal(t, uint64(c.Saved), st.Acked, "acknowledged deliveries")
				require.Equal(t, c.Handled, st.Process.Handled, "handled")
				require.Equal(t, c.Retries, st.Process.Retries, "retries")
				closeWatcher(t, w)
			})
		})
	}
}
