package pgchangestream

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLiveParkIsFencedForAFormerOwner: a watcher whose handler fails for good after a later
// owner took its event over parks nothing: Process stops with ErrFenced and the dead-letter
// table stays empty, so no stale row is left for an operator to run again. The takeover happens
// while the handler runs, as for a process paused past its lock or lease: an exclusive client's
// owner epoch moves on; a Shared member's range is given to another member.
func TestLiveParkIsFencedForAFormerOwner(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		config   func(*Config)
		takeOver string
	}{
		{"exclusive", func(c *Config) { c.Exclusive = true },
			`UPDATE resume_tokens SET owner_epoch = owner_epoch + 1 WHERE client_name = 'c'`},
		// A lease long enough that the member looks at the ranges again only after the test.
		{"shared", func(c *Config) { c.Shared, c.SharedLease = true, MaxSharedLease },
			`UPDATE datastore_changelog_ranges SET owner = NULL WHERE client_name = 'c'`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newLive(t)
			cfg := procConfig(e)
			tc.config(&cfg)
			w := e.start(cfg)
			if cfg.Shared {
				require.Eventually(t, func() bool { return len(w.Stats().Shared.Ranges) == SharedRanges }, liveWait, 10*time.Millisecond)
			}
			entered, gate := make(chan struct{}), make(chan struct{})
			handle := func(ctx context.Context, ev EventWithToken) error {
				close(entered)
				<-gate
				return errors.New("poison")
			}
			opts := ProcessOptions{OnFailure: ParkOnFailure, MaxAttempts: 1}
			errc, cancel := startProcess(t, w, opts, handle)
			defer cancel()
			e.insert(1)
			select {
			case <-entered:
			case <-time.After(liveWait):
				t.Fatal("the handler did not run")
			}
			_, err := e.db.Exec(tc.takeOver)
			require.NoError(t, err)
			close(gate)
			select {
			case err := <-errc:
				require.ErrorIs(t, err, ErrFenced)
			case <-time.After(liveWait):
				t.Fatal("Process did not stop")
			}
			require.Empty(t, e.listParked(), "the former owner parked the event")
		})
	}
}
