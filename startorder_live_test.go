package pgchangestream

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// lagAtFirstDelta is an Observer that sends on at, once, the watcher's last empty read
// ([Watcher.LagState]) as its first delta read ends.
type lagAtFirstDelta struct {
	w    atomic.Pointer[Watcher]
	once atomic.Bool
	at   chan time.Time
}

func (o *lagAtFirstDelta) ObserveRead(_ context.Context, r ReadObservation) {
	if r.From.inDelta() && o.once.CompareAndSwap(false, true) {
		lastEmpty, _ := o.w.Load().LagState()
		o.at <- lastEmpty
	}
}

func (o *lagAtFirstDelta) ObserveSave(context.Context, SaveObservation) {}

// TestLiveStartFromBeginningCatchesUpAfterTheHistory proves, in every mode, that a client
// starting from the beginning of an upgraded changelog, whose history is read in deltas after an
// empty legacy part, does not report an empty read (caught up, as tail --exit-at-end takes it)
// before it has read the history.
func TestLiveStartFromBeginningCatchesUpAfterTheHistory(t *testing.T) {
	runModes(t, allModes, newLive, func(t *testing.T, e *liveEnv, mode Mode) {
		ids := e.insert(3)
		o := &lagAtFirstDelta{at: make(chan time.Time, 1)}
		cfg := e.fromBeginning(mode)
		cfg.Observer = o
		w, err := New(cfg)
		require.NoError(t, err)
		o.w.Store(w)
		w.Start(context.Background())
		t.Cleanup(func() { _ = w.Close(context.Background()) })
		select {
		case lastEmpty := <-o.at:
			require.True(t, lastEmpty.IsZero(), "an empty read was reported at %v, before the history was read", lastEmpty)
		case <-time.After(liveWait):
			t.Fatal("no delta was read")
		}
		require.Equal(t, ids, receiveWithin(t, w, len(ids), liveWait))
	})
}
