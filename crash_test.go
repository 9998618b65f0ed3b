package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var (
	long      = flag.Bool("long", false, "run the long version of the crash trials")
	crashSeed = flag.Uint64("crash.seed", 0, "seed of the crash trials; 0 picks one (it is logged)")
)

// crashWriters is the number of concurrent writer goroutines in the crash trials.
const crashWriters = 4

// TestLiveCrashTrials: contract rules 1, 2, 3, 6 and 14, and the at-least-once promise, under
// watcher crashes at random points. Writers insert continuously from several goroutines (each
// holding its transaction open for a random moment, so commit order and position order differ
// at times); a consumer acks every event, or a contiguous watermark every k events; the watcher
// is crashed by cancelling Start's context without Close or Flush (its pool closed, so nothing
// is saved after the crash), then a new watcher starts for the same client. Each trial checks:
//
//   - the saved token right after the crash is the position the last successful MarkProcessed
//     saved (read from Stats().Checkpoint after each one);
//   - the restarted watcher's first delivery is the first changelog row after the saved token
//     in position order (writers are paused during the restart, so no row commits meanwhile);
//
// and at the end, with the writers stopped and a last watcher run to the newest row, every row
// written was delivered at least once, and after a final ack the saved token is the newest
// row's position.
//
// One exception is the known limit of contract rule 11, rows committed behind the cursor. A
// read can pass row r without returning it only if its snapshot held a row with a later
// position but not r: that row became visible first. So r may be missed only if some row with
// a later position had its commit sent before r's commit returned; the test calls such rows
// "late" (a superset of the rows actually committed behind the cursor). Polling never reads a
// row committed behind the cursor; hybrid mode recovers it through its NOTIFY, unless the
// watcher crashes before handling that NOTIFY and the saved token already passed the row. Late
// rows that were not delivered are counted and logged, not failed; every other row must be
// delivered. Run with -long for more trials; -crash.seed replays a seed's crash points
// (scheduling still varies).
func TestLiveCrashTrials(t *testing.T) {
	trials := 20
	if *long {
		trials = 150
	}
	seed := *crashSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (replay with -crash.seed=%d)", seed, seed)
	i := uint64(0)
	for _, mode := range []Mode{ModePolling, ModeHybrid} {
		for _, ack := range []string{"per-event", "watermark"} {
			i++
			rng := rand.New(rand.NewPCG(seed, i))
			t.Run(string(mode)+"/"+ack, func(t *testing.T) {
				runCrashTrials(t, mode, ack == "watermark", trials, rng)
			})
		}
	}
}

// crashRun is the state of one series of crash trials.
type crashRun struct {
	t         *testing.T
	e         *liveEnv
	cfg       Config
	watermark bool
	rng       *rand.Rand // test goroutine only

	pause   sync.RWMutex // writers hold it (read) across each transaction; the test locks it to pause them
	stopped atomic.Bool  // writers exit

	mu        sync.Mutex
	written   map[int64]faultRow // every row committed
	delivered map[int64]int      // id → deliveries handed to a consumer
	lastSaved Position           // checkpoint after the last successful MarkProcessed, or the loaded one
}

func runCrashTrials(t *testing.T, mode Mode, watermark bool, trials int, rng *rand.Rand) {
	e := newLive(t)
	cfg := e.config(mode)
	cfg.PollInterval = 5 * time.Millisecond
	cfg.StartFromBeginning = true
	r := &crashRun{t: t, e: e, cfg: cfg, watermark: watermark, rng: rng,
		written: map[int64]faultRow{}, delivered: map[int64]int{}}

	ctx, cancel := context.WithCancel(context.Background())
	var writers sync.WaitGroup
	r.pause.Lock() // writers start paused
	paused := true
	var stopGen func() // stops the current generation's consumer; nil when none runs
	defer func() {     // on failure too: nothing may be left waiting
		if stopGen != nil {
			stopGen()
		}
		r.stopped.Store(true)
		if paused {
			r.pause.Unlock()
		}
		cancel()
		writers.Wait()
	}()
	for range crashWriters {
		wrng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		writers.Go(func() { r.write(ctx, wrng) })
	}

	crashes := 0
	for trial := 0; ; trial++ {
		final := trial == trials
		if final { // stop the writers: the last watcher runs to the newest row
			r.stopped.Store(true)
			r.pause.Unlock()
			writers.Wait()
			r.pause.Lock()
		}
		saved, ok := r.savedToken(ctx)
		r.mu.Lock()
		if trial > 0 { // the old watcher's Close saved nothing either
			require.True(t, ok)
			require.Equal(t, r.lastSaved, saved, "trial %d: saved token after releasing the crashed watcher", trial)
		}
		r.lastSaved = saved // what the watcher loads (a new client saves the zero position)
		r.mu.Unlock()
		want := r.firstAfter(ctx, saved)
		c := e.startCrashable(cfg)
		k := 2 + r.rng.IntN(9)
		crashed, first, done := make(chan struct{}), make(chan int64, 1), make(chan struct{})
		stopAt := int64(-1)
		if final {
			rows, err := faultChangelog(ctx, e.db)
			require.NoError(t, err)
			stopAt = rows[len(rows)-1].ID
		}
		go func() {
			defer close(done)
			r.consume(c, k, crashed, first, stopAt)
		}()
		stopGen = func() {
			close(crashed)
			<-done
		}
		select {
		case id := <-first:
			require.Equal(t, want.ID, id, "trial %d: first delivery after restarting from %v", trial, saved)
		case <-time.After(20 * time.Second):
			t.Fatalf("trial %d: no delivery after restarting from %v; stats %+v", trial, saved, c.Stats())
		}
		if final {
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				t.Fatalf("the last watcher did not reach the newest row %d; stats %+v", stopAt, c.Stats())
			}
			stopGen = nil
			r.checkFinal(ctx, c, stopAt, crashes)
			return
		}
		r.pause.Unlock()
		paused = false
		time.Sleep(time.Duration(r.rng.IntN(200_000)) * time.Microsecond) // the crash point
		// The watcher and the consumer die together; an acknowledgement in flight completes.
		c.cancel()
		stopGen()
		stopGen = nil
		c.stop()
		r.pause.Lock() // in-flight transactions commit first
		paused = true
		crashes++
		// Release the old watcher: its pool is closed first, so nothing is written after the
		// crash; a background save already in flight completes (sql.DB.Close waits for it).
		c.crash()
		saved, _ = r.savedToken(ctx)
		r.mu.Lock()
		lastSaved := r.lastSaved
		r.lastSaved = saved
		r.mu.Unlock()
		// The last save is the last successful MarkProcessed's, unless a late row recovered after
		// it moved the token back behind itself (still pending, so it must be replayed), or the
		// idle saver saved the same cursor.
		require.Equal(t, legacyView(c.Stats().Checkpoint), saved, "trial %d: saved token right after the crash vs the watcher's last save", trial)
		require.False(t, lastSaved.Before(saved), "trial %d: saved token %v passes the last MarkProcessed's %v", trial, saved, lastSaved)
	}
}

// write inserts rows until the run stops, recording each commit.
func (r *crashRun) write(ctx context.Context, rng *rand.Rand) {
	for {
		r.pause.RLock()
		if r.stopped.Load() {
			r.pause.RUnlock()
			return
		}
		row, err := faultInsert(ctx, r.e.db, time.Duration(rng.IntN(1500))*time.Microsecond)
		if err == nil {
			r.mu.Lock()
			r.written[row.pos.ID] = row
			r.mu.Unlock()
		}
		r.pause.RUnlock()
		if err != nil {
			if ctx.Err() == nil {
				r.t.Errorf("writer: %v", err)
			}
			return
		}
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond) // pace
	}
}

// consume handles deliveries until crashed is closed (a crashed consumer handles nothing more)
// or the delivery of stopAt: it records each, sends the first id on first, and acks each
// (per-event) or every k-th (watermark), recording the checkpoint after each successful ack.
func (r *crashRun) consume(c *crashable, k int, crashed <-chan struct{}, first chan<- int64, stopAt int64) {
	for n := 1; ; n++ {
		select {
		case <-crashed:
			return
		default:
		}
		var ev EventWithToken
		select {
		case <-crashed:
			return
		case got, ok := <-c.Events():
			if !ok {
				return
			}
			ev = got
		}
		id, err := strconv.ParseInt(string(ev.ResumeToken), 10, 64)
		if err != nil {
			r.t.Errorf("token %q: %v", ev.ResumeToken, err)
			return
		}
		r.mu.Lock()
		r.delivered[id]++
		r.mu.Unlock()
		if n == 1 {
			first <- id
		}
		if !r.watermark || n%k == 0 || id == stopAt {
			if err := c.MarkProcessed(context.Background(), ev.ResumeToken); err != nil {
				r.t.Errorf("MarkProcessed(%d): %v", id, err)
				return
			}
			r.mu.Lock()
			r.lastSaved = legacyView(c.Stats().Checkpoint)
			r.mu.Unlock()
		}
		if id == stopAt {
			return
		}
	}
}

// savedToken reads the client's saved token; ok is false when it has none.
func (r *crashRun) savedToken(ctx context.Context) (p Position, ok bool) {
	var raw string
	err := r.e.db.QueryRowContext(ctx, `SELECT resume_token::text FROM resume_tokens WHERE client_name = $1`, r.cfg.ClientName).Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) {
		return Position{}, false
	}
	require.NoError(r.t, err)
	p, err = decodeToken([]byte(raw))
	require.NoError(r.t, err)
	return legacyView(p), true
}

// firstAfter returns the first changelog row after saved in position order, inserting one when
// there is none. Writers must be paused.
func (r *crashRun) firstAfter(ctx context.Context, saved Position) Position {
	rows, err := faultChangelog(ctx, r.e.db)
	require.NoError(r.t, err)
	for _, p := range rows {
		if saved.Before(p) {
			return p
		}
	}
	row, err := faultInsert(ctx, r.e.db, 0)
	require.NoError(r.t, err)
	r.mu.Lock()
	r.written[row.pos.ID] = row
	r.mu.Unlock()
	return row.pos
}

// checkFinal checks, once the last watcher delivered the newest row, that every row that was
// not late was delivered, and that the final ack saves the newest row's position.
func (r *crashRun) checkFinal(ctx context.Context, c *crashable, newest int64, crashes int) {
	t := r.t
	rows, err := faultChangelog(ctx, r.e.db)
	require.NoError(t, err)
	r.mu.Lock()
	defer r.mu.Unlock()
	require.Len(t, r.written, len(rows), "rows in the changelog vs rows written")
	// firstSentAfter[i]: the earliest commit sent among the rows after rows[i] in position order.
	firstSentAfter := make([]time.Time, len(rows))
	for i := len(rows) - 1; i > 0; i-- {
		sent := r.written[rows[i].ID].commitSent
		firstSentAfter[i-1] = sent
		if i < len(rows)-1 && firstSentAfter[i].Before(sent) {
			firstSentAfter[i-1] = firstSentAfter[i]
		}
	}
	var late, lateMissed, redelivered int
	for i, p := range rows {
		w, ok := r.written[p.ID]
		require.True(t, ok, "row %d in the changelog was not written by the test", p.ID)
		require.Equal(t, w.pos, p)
		isLate := i < len(rows)-1 && firstSentAfter[i].Before(w.commitDone)
		if isLate {
			late++
		}
		if n := r.delivered[p.ID]; n > 0 {
			redelivered += n - 1
			continue
		}
		require.True(t, isLate, "row %d at %v was never delivered, and no row after it was committed before it", p.ID, p)
		lateMissed++
	}
	require.Equal(t, newest, rows[len(rows)-1].ID)
	require.NoError(t, c.MarkProcessed(ctx, tok(newest)))
	want := rows[len(rows)-1]
	got, _ := r.savedToken(ctx)
	require.Equal(t, want, got, "saved token after the final ack")
	require.Equal(t, want, legacyView(c.Stats().Checkpoint))
	t.Logf("%d rows, %d crashes, %d redeliveries; %d rows late, %d of them never delivered",
		len(rows), crashes, redelivered, late, lateMissed)
	if r.cfg.Mode == ModeHybrid && lateMissed > 0 {
		t.Logf("hybrid: %d late rows were lost to a crash before their NOTIFY was handled", lateMissed)
	}
}

// crashable is a watcher with a connection pool of its own, so that it can die like a process:
// its context is cancelled and its pool closed, and no final save reaches the database.
type crashable struct {
	*Watcher
	db     *sql.DB
	cancel context.CancelFunc
	once   sync.Once
}

// startCrashable starts a watcher on its own pool; it is crashed at the end of the test unless
// it was before.
func (e *liveEnv) startCrashable(cfg Config) *crashable {
	e.t.Helper()
	db, err := sql.Open("pgx", e.dsn)
	require.NoError(e.t, err)
	cfg.DB = db
	w, err := New(cfg)
	require.NoError(e.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	w.Start(ctx)
	c := &crashable{Watcher: w, db: db, cancel: cancel}
	e.t.Cleanup(c.crash)
	return c
}

// stop cancels Start's context and discards the deliveries still buffered until Events closes:
// the reader has stopped. The saver and listener goroutines stop on their own soon after.
func (c *crashable) stop() {
	c.cancel()
	for range c.Events() {
	}
}

// crash stops the watcher, then closes its pool and releases its goroutines with Close, whose
// final save fails on the closed pool: nothing is written after the crash. Calls after the
// first do nothing.
func (c *crashable) crash() {
	c.once.Do(func() {
		c.stop()
		_ = c.db.Close()
		_ = c.Close(context.Background()) // the final save fails: the pool is closed
	})
}
