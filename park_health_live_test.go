package pgchangestream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A park that keeps failing (here: the dead-letter table is renamed away) shows in Health and
// Stats().LastError from its first failed try, naming the event and its key, and clears once the
// park succeeds; the event is parked then, and nothing is lost.
func TestLiveFailingParkShowsInHealth(t *testing.T) {
	inEachSchemaState(t, func(t *testing.T, e *liveEnv) {
		ids := e.insert(3)
		poison := ids[1]
		_, err := e.db.Exec(`ALTER TABLE datastore_changelog_parked RENAME TO parked_away`)
		require.NoError(t, err)
		w := e.start(procConfig(e))
		opts := ProcessOptions{Workers: 2, OnFailure: ParkOnFailure, MaxAttempts: 1, ParkedPollInterval: 50 * time.Millisecond,
			Key: func(ev EventWithToken) string { return "key-" + string(ev.ResumeToken) }}
		errc, cancel := startProcess(t, w, opts, func(_ context.Context, ev EventWithToken) error {
			if string(ev.ResumeToken) == fmt.Sprint(poison) {
				return errors.New("poison")
			}
			return nil
		})
		require.Eventually(t, func() bool {
			h := w.Health()
			return h != nil && strings.Contains(h.Error(), fmt.Sprintf(`dead-letter table: pgchangestream: park event %d of key "key-%d"`, poison, poison))
		}, liveWait, 10*time.Millisecond, "Health: %v", w.Health())
		require.ErrorContains(t, w.Stats().LastError, "dead-letter table")
		_, err = e.db.Exec(`ALTER TABLE parked_away RENAME TO datastore_changelog_parked`)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return w.Health() == nil }, liveWait, 10*time.Millisecond, "Health: %v", w.Health())
		require.Equal(t, []int64{poison}, parkedIDs(e.listParked()))
		cancel()
		require.NoError(t, <-errc)
	})
}

// A key PostgreSQL's text cannot store (a NUL byte) is not retried forever: Process stops with
// an error naming the event and the key, and the event stays unacknowledged.
func TestLiveUnstorableKeyStopsProcess(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	ids := e.insert(2)
	w := e.start(procConfig(e))
	opts := ProcessOptions{Workers: 1, OnFailure: ParkOnFailure, MaxAttempts: 1,
		Key: func(ev EventWithToken) string { return "a\x00" + string(ev.ResumeToken) }}
	err := w.Process(t.Context(), opts, func(context.Context, EventWithToken) error { return errors.New("poison") })
	require.ErrorContains(t, err, fmt.Sprintf(`park event %d of key "a\x00%d": the key holds a NUL byte`, ids[0], ids[0]))
	require.Empty(t, e.listParked())
	require.Less(t, e.savedToken("c").ID, ids[0], "the event is not acknowledged")
}
