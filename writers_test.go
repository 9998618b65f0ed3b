package pgchangestream

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// liveWriters inserts rows into the items table from several goroutines, each transaction held
// open for a random moment so that commit order differs from insert order, until stop.
type liveWriters struct {
	gate    sync.RWMutex // held shared across each transaction; pause holds it exclusively
	stopped atomic.Bool
	wg      sync.WaitGroup

	mu       sync.Mutex
	rows     map[int64]faultRow // every row committed, by changelog id
	errs     int                // failed transactions (a writer retries after a short pause)
	lastErr  error
	maxBlock time.Duration // the longest transaction, less the time it was held open on purpose
}

// startWriters starts n writers on the database, each holding its transactions open for up to
// maxHold. They are stopped at the end of the test if the test did not stop them.
func (e *liveEnv) startWriters(n int, maxHold time.Duration) *liveWriters {
	w := &liveWriters{rows: map[int64]faultRow{}}
	for range n {
		w.wg.Go(func() {
			for w.write(e, maxHold) {
			}
		})
	}
	e.t.Cleanup(w.stop)
	return w
}

// write commits one row, then paces the writer; it returns false once the writers are stopped.
func (w *liveWriters) write(e *liveEnv, maxHold time.Duration) bool {
	w.gate.RLock()
	if w.stopped.Load() {
		w.gate.RUnlock()
		return false
	}
	hold := time.Duration(rand.Int64N(int64(maxHold) + 1))
	began := time.Now()
	row, err := faultInsert(context.Background(), e.db, hold)
	w.gate.RUnlock()
	w.mu.Lock()
	pace := time.Duration(rand.IntN(3000)) * time.Microsecond
	if err != nil {
		w.errs++
		w.lastErr = err
		pace = 20 * time.Millisecond
	} else {
		w.rows[row.pos.ID] = row
		w.maxBlock = max(w.maxBlock, row.commitDone.Sub(began)-hold)
	}
	w.mu.Unlock()
	time.Sleep(pace)
	return true
}

// pause returns once no transaction is in flight; the writers then wait until resume.
func (w *liveWriters) pause() { w.gate.Lock() }

// resume lets paused writers go on.
func (w *liveWriters) resume() { w.gate.Unlock() }

// stop stops the writers and waits for their transactions to end. The writers must not be
// paused. Calls after the first do nothing more.
func (w *liveWriters) stop() {
	w.stopped.Store(true)
	w.wg.Wait()
}

// committed returns the number of rows committed so far.
func (w *liveWriters) committed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.rows)
}

// deliveries counts a consumer's deliveries by changelog id, across watcher runs.
type deliveries struct {
	mu     sync.Mutex
	counts map[int64]int       // id → deliveries
	first  map[int64]time.Time // id → when it was first received
}

func newDeliveries() *deliveries {
	return &deliveries{counts: map[int64]int{}, first: map[int64]time.Time{}}
}

// consume receives w's deliveries on a goroutine of its own until Events closes, recording each
// and acknowledging it (MarkProcessed works after Close, so a delivery read from the buffer
// after a stop is acknowledged too). It returns a function that waits until it has finished;
// at the end of the test w is closed and the goroutine waited for.
func (d *deliveries) consume(t *testing.T, w *Watcher) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.Events() {
			id, err := strconv.ParseInt(string(ev.ResumeToken), 10, 64)
			if err != nil {
				t.Errorf("delivery with token %q: %v", ev.ResumeToken, err)
				continue
			}
			d.mu.Lock()
			d.counts[id]++
			if d.counts[id] == 1 {
				d.first[id] = time.Now()
			}
			d.mu.Unlock()
			if err := w.MarkProcessed(context.Background(), ev.ResumeToken); err != nil {
				t.Errorf("MarkProcessed(%d): %v", id, err)
			}
		}
	}()
	wait = func() { <-done }
	t.Cleanup(func() {
		_ = w.Close(context.Background())
		wait()
	})
	return wait
}

// count returns how many times id was delivered.
func (d *deliveries) count(id int64) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.counts[id]
}

// missing returns the ids never delivered.
func (d *deliveries) missing(ids []int64) []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []int64
	for _, id := range ids {
		if d.counts[id] == 0 {
			out = append(out, id)
		}
	}
	return out
}

// repeated returns the ids delivered more than once.
func (d *deliveries) repeated() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []int64
	for id, n := range d.counts {
		if n > 1 {
			out = append(out, id)
		}
	}
	return out
}

// total returns the number of deliveries.
func (d *deliveries) total() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, c := range d.counts {
		n += c
	}
	return n
}

// requireQuiet fails if anything is delivered within d.
func (d *deliveries) requireQuiet(t *testing.T, within time.Duration) {
	t.Helper()
	n := d.total()
	time.Sleep(within)
	require.Equal(t, n, d.total(), "unexpected deliveries")
}

// requireAll waits up to within until every id of ids was delivered, failing with the ids lost.
func (d *deliveries) requireAll(t *testing.T, ids []int64, within time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for len(d.missing(ids)) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if lost := d.missing(ids); len(lost) > 0 {
		t.Fatalf("%s: %d of %d committed rows were never delivered, among them %v", what, len(lost), len(ids), lost[:min(len(lost), 20)])
	}
}
