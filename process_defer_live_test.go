package pgchangestream

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A deferred event, read again by id when it is next of its key, is handed over with the same
// document as the delivery a Process that defers nothing hands over: inserts, updates (with
// their updateDescription) and deletes.
func TestLiveDeferredEventsHaveTheDeliveredDocument(t *testing.T) {
	e := newLive(t)
	e.insertBulk(30)
	_, err := e.db.Exec(`UPDATE items SET n = n + 100 WHERE n % 3 = 0`)
	require.NoError(t, err)
	_, err = e.db.Exec(`DELETE FROM items WHERE n % 5 = 0`)
	require.NoError(t, err)
	var total int
	require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog WHERE table_name = $1`, liveTable).Scan(&total))

	// run processes every row with one key for all and returns the events handed over, by id,
	// and the most deferred events held at once.
	run := func(client string, maxDeferred int) (map[string]Event, int64) {
		cfg := e.config(ModePolling)
		cfg.ClientName, cfg.StartFromBeginning = client, true
		w := e.start(cfg)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var mu sync.Mutex
		got := map[string]Event{}
		var mostDeferred int64
		handle := func(_ context.Context, ev EventWithToken) error {
			time.Sleep(time.Millisecond) // the key's queue grows behind the running event
			mu.Lock()
			defer mu.Unlock()
			got[string(ev.ResumeToken)] = ev.Event
			mostDeferred = max(mostDeferred, w.procStats.Deferred.Load())
			if len(got) == total {
				cancel()
			}
			return nil
		}
		o := ProcessOptions{Workers: 4, MaxKeyQueue: 1, MaxDeferred: maxDeferred, Key: func(EventWithToken) string { return "one" }}
		require.NoError(t, w.Process(ctx, o, handle))
		mu.Lock()
		defer mu.Unlock()
		return got, mostDeferred
	}
	plain, plainDeferred := run("plain", 0)
	deferring, mostDeferred := run("deferring", 64*DefaultProcessMaxInFlight)
	require.Len(t, plain, total)
	require.Zero(t, plainDeferred)
	require.Greater(t, mostDeferred, int64(total/2), "most events were deferred")
	require.Equal(t, plain, deferring, "restored events are the delivered ones")
}
