package pgchangestream

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

func TestEphemeralNeverWritesTheTokenTable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFakeDB(testConfig(Config{}))
		ids := f.insert("t", t0, 3)
		w := startOn(t, t.Context(), f, Config{Ephemeral: true, StartFromBeginning: true})
		require.Equal(t, ids, receive(t, w, 3))
		require.NoError(t, w.MarkProcessed(context.Background(), tok(ids[2])))
		time.Sleep(3 * DefaultIdleCheckpointInterval)
		closeWatcher(t, w)
		require.Empty(t, f.savedPositions())
		require.Empty(t, f.tokens, "not even the start position")
		require.Zero(t, w.Stats().CheckpointWrites)

		f.tokens["c"] = string(position.EncodeToken(rowPos(f, ids[0]), "t"))
		w = startOn(t, t.Context(), f, Config{Ephemeral: true})
		require.Equal(t, ids[1:], receive(t, w, 2), "a saved token is read")
		closeWatcher(t, w)
		require.Empty(t, f.savedPositions())
	})
}
