package pgchangestream

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// watermarkConsumer is a consumer that works out of order: one dispatcher numbers deliveries in
// receive order and hands them to workers, which finish them in any order; every finish
// acknowledges the contiguous watermark (the newest delivery with every earlier one finished).
type watermarkConsumer struct {
	mu        sync.Mutex // guards the fields below
	order     []int64    // ids in receive order
	finished  []bool     // by receive number
	done      map[int64]bool
	watermark int // receive numbers below it are finished
	acked     int // acknowledgements that returned
}

func newWatermarkConsumer() *watermarkConsumer {
	return &watermarkConsumer{done: map[int64]bool{}}
}

// run consumes w's events until they close; wait returns when the dispatcher and the workers
// have stopped.
func (c *watermarkConsumer) run(t *testing.T, ctx context.Context, w *Watcher, workers int) (wait func()) {
	work := make(chan int)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(work)
		for ev := range w.Events() {
			id, err := strconv.ParseInt(string(ev.ResumeToken), 10, 64)
			if err != nil {
				t.Error(err)
			}
			c.mu.Lock()
			c.order = append(c.order, id)
			c.finished = append(c.finished, false)
			k := len(c.order) - 1
			c.mu.Unlock()
			work <- k
		}
	})
	for range workers {
		wg.Go(func() {
			for k := range work {
				c.mu.Lock()
				c.finished[k] = true
				c.done[c.order[k]] = true
				for c.watermark < len(c.order) && c.finished[c.watermark] {
					c.watermark++
				}
				var ack []byte
				if c.watermark > 0 {
					ack = tok(c.order[c.watermark-1])
				}
				c.mu.Unlock()
				if err := w.MarkProcessed(ctx, ack); err != nil {
					t.Error(err)
				}
				c.mu.Lock()
				c.acked++
				c.mu.Unlock()
			}
		})
	}
	return wg.Wait
}

// isDone reports whether the delivery with this id was finished.
func (c *watermarkConsumer) isDone(id int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done[id]
}

// finishedAll reports whether n deliveries were received, all finished, and every
// acknowledgement of them returned.
func (c *watermarkConsumer) finishedAll(n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.watermark == n && c.acked == n
}

func TestConcurrentDeliveryAndWatermarkAcks(t *testing.T) {
	const n, workers = 2000, 4
	f := newFakeDB(testConfig(Config{}))
	f.insert("t", t0, n/2)
	f.insert("t", t0.Add(time.Second), n/2)
	c := newWatermarkConsumer()
	f.onSave = func(p Position) { // every save: everything at or before it is done
		for _, r := range f.rows {
			if p.ID != 0 && !p.Before(position.Make(r.ChangedAt, r.ID)) && !c.isDone(r.ID) {
				t.Errorf("checkpoint %v passes row %d, which is not done", p, r.ID)
			}
		}
	}
	w := startOn(t, context.Background(), f, Config{StartFromBeginning: true, MaxPending: 256})
	wait := c.run(t, context.Background(), w, workers)
	require.Eventually(t, func() bool { return c.finishedAll(n) }, 30*time.Second, time.Millisecond)
	require.NoError(t, w.MarkProcessed(context.Background(), nil))
	require.Equal(t, rowPos(f, n), f.token(t, "c"))
	require.NoError(t, w.Close(context.Background()))
	wait()
}

func TestConcurrentSavesAreOrdered(t *testing.T) {
	f := newFakeDB(testConfig(Config{}))
	f.insert("t", t0, 200)
	f.saveDelay = 200 * time.Microsecond
	w := startOn(t, context.Background(), f, Config{StartFromBeginning: true, MaxPending: 1000})
	defer closeWatcher(t, w)
	ids := receive(t, w, 200)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.NoError(t, w.MarkProcessed(context.Background(), tok(id)))
		}()
	}
	wg.Wait()
	saves := f.savedPositions()
	for i := 1; i < len(saves); i++ {
		require.False(t, saves[i].Before(saves[i-1]), "save %d (%v) is older than the save before it (%v)", i, saves[i], saves[i-1])
	}
	require.Equal(t, rowPos(f, 200), f.token(t, "c"))
	require.Less(t, len(saves), 200, "concurrent acks share saves")
}
