package pgchangestream

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/admin"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/stretchr/testify/require"
)

// ownedRow is one row of items whose events the tests of this file follow: its first event (the
// insert) fails while the row is poisoned; every successful run of one of its events is
// recorded with the watcher that ran it. With a gate, a run first says it entered and waits for
// the gate to open (it fails if its context ends first).
type ownedRow struct {
	t       *testing.T
	e       *liveEnv
	id      string // the row's id (a uuid)
	rangeNo int    // its range

	mu       sync.Mutex
	poisoned bool
	ran      []rowRun // successful runs, in the order they ended
	running  int      // handlers of the row running now
	overlaps int      // runs that started while another ran
	gate     chan struct{}
	entered  chan string // with a gate: the watcher of each run that entered it
}

// rowRun is one successful run of one of the row's events.
type rowRun struct {
	by string
	id int64
}

// newOwnedRow picks a row id whose range is in [lo, hi) (it writes nothing yet); the row starts
// poisoned.
func newOwnedRow(t *testing.T, e *liveEnv, lo, hi int) *ownedRow {
	r := &ownedRow{t: t, e: e, poisoned: true}
	require.NoError(t, e.db.QueryRow(`SELECT u, `+changelog.Quote(changelog.UnitFunction("datastore_changelog"))+`(u) / $3
		FROM (SELECT gen_random_uuid()::text AS u FROM generate_series(1, 10000)) AS g
		WHERE `+changelog.Quote(changelog.UnitFunction("datastore_changelog"))+`(u) / $3 >= $1 AND `+
		changelog.Quote(changelog.UnitFunction("datastore_changelog"))+`(u) / $3 < $2 LIMIT 1`, lo, hi, unitsPerRange).Scan(&r.id, &r.rangeNo))
	return r
}

// write inserts the row (n is 0) or updates it, and returns the changelog id of the change.
func (r *ownedRow) write(n int) int64 {
	r.t.Helper()
	if n == 0 {
		_, err := r.e.db.Exec(`INSERT INTO items (id, n) VALUES ($1::uuid, 0)`, r.id)
		require.NoError(r.t, err)
	} else {
		_, err := r.e.db.Exec(`UPDATE items SET n = $2 WHERE id = $1::uuid`, r.id, n)
		require.NoError(r.t, err)
	}
	var id int64
	require.NoError(r.t, r.e.db.QueryRow(`SELECT max(id) FROM datastore_changelog WHERE record_id::text = $1`, r.id).Scan(&id))
	var rangeNo int
	require.NoError(r.t, r.e.db.QueryRow(`SELECT `+changelog.UnitExpression("datastore_changelog")+` / $2 FROM datastore_changelog WHERE id = $1`,
		id, unitsPerRange).Scan(&rangeNo))
	require.Equal(r.t, r.rangeNo, rangeNo, "the row's change is not in the range picked")
	return id
}

// handler is the Process handler of watcher name: events of other rows succeed unrecorded.
func (r *ownedRow) handler(name string) Handler {
	return func(ctx context.Context, ev EventWithToken) error {
		if dk, _ := ev.Event["documentKey"].(map[string]any); dk["_id"] != r.id {
			return nil
		}
		r.mu.Lock()
		if r.poisoned && ev.Event["operationType"] == "insert" {
			r.mu.Unlock()
			return errPoison
		}
		r.running++
		if r.running > 1 {
			r.overlaps++
		}
		gate, entered := r.gate, r.entered
		r.mu.Unlock()
		var err error
		if gate != nil {
			entered <- name
			select {
			case <-gate:
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.running--
		if err == nil {
			r.ran = append(r.ran, rowRun{by: name, id: tokenID(r.t, ev)})
		}
		return err
	}
}

// cure makes the row's events succeed from now on; with gated, each run waits for openGate.
func (r *ownedRow) cure(gated bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.poisoned = false
	if gated {
		r.gate, r.entered = make(chan struct{}), make(chan string, 16)
	}
}

func (r *ownedRow) openGate() { close(r.gate) }

func (r *ownedRow) runs() []rowRun {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ran)
}

// ownerProcess runs Process with opts and the row's handler on a watcher of its own; stop
// cancels Process, requires it to end without an error, and closes the watcher.
type ownerProcess struct {
	w    *Watcher
	stop func()
}

func startOwnerProcess(t *testing.T, e *liveEnv, cfg Config, rows []*ownedRow, name string, opts ProcessOptions) *ownerProcess {
	w := e.start(cfg)
	errc, cancel := startProcess(t, w, opts, func(ctx context.Context, ev EventWithToken) error {
		for _, r := range rows {
			if err := r.handler(name)(ctx, ev); err != nil {
				return err
			}
		}
		return nil
	})
	return &ownerProcess{w: w, stop: func() {
		cancel()
		require.NoError(t, <-errc)
		require.NoError(t, w.Close(context.Background()))
	}}
}

// ownsRange reports whether w reads (Shared) or delivers (Exclusive) the events of range n.
func ownsRange(w *Watcher, n int) bool {
	st := w.Stats()
	if st.Shared.Member != 0 {
		return slices.Contains(st.Shared.Ranges, n)
	}
	return st.Active
}

// heldKeyMove is a way the events of a row move from watcher "a" to watcher "b" of client "c":
// start returns the two running Process on cfg's watchers, a owning the rows of ranges [lo, hi)
// and b, if shared, those of [32, 64); move moves them to b.
type heldKeyMove struct {
	name   string
	lo, hi int
	shared bool
	start  func(t *testing.T, e *liveEnv, rows []*ownedRow, opts ProcessOptions) (a, b *ownerProcess)
	move   func(t *testing.T, e *liveEnv, a, b *ownerProcess)
}

// sharedConfig is the config of the Shared members of this file: from the beginning, with a
// lease short enough that hand-overs take well under liveWait and long enough that no lease
// lapses on a loaded machine.
func sharedConfig(e *liveEnv, mode Mode) Config {
	cfg := e.config(mode)
	cfg.Shared, cfg.SharedLease, cfg.StartFromBeginning = true, 3*time.Second, true
	return cfg
}

// sharedPairProcess starts Shared members a and b with Process, split in halves: a owns ranges
// [0, 32).
func sharedPairProcess(t *testing.T, e *liveEnv, rows []*ownedRow, opts ProcessOptions) (a, b *ownerProcess) {
	cfg := sharedConfig(e, ModePolling)
	a = startOwnerProcess(t, e, cfg, rows, "a", opts)
	waitFor(t, func() bool { return len(a.w.Stats().Shared.Ranges) == SharedRanges }, "the first member takes every range")
	b = startOwnerProcess(t, e, cfg, rows, "b", opts)
	waitFor(t, func() bool {
		return len(a.w.Stats().Shared.Ranges) == SharedRanges/2 && len(b.w.Stats().Shared.Ranges) == SharedRanges/2
	}, "the two members split the ranges")
	return a, b
}

// joinThird starts a third Shared member of client "c", without Process: with three members, a
// owns ranges [0, 21), b [21, 42) and the new one [42, 64).
func joinThird(t *testing.T, e *liveEnv) *Watcher {
	c := e.start(sharedConfig(e, ModePolling))
	waitFor(t, func() bool { return len(c.Stats().Shared.Ranges) == SharedRanges-SharedRanges*2/3 }, "the third member takes its ranges")
	return c
}

var heldKeyMoves = []heldKeyMove{
	{name: "exclusive fail-over", lo: 0, hi: SharedRanges,
		start: func(t *testing.T, e *liveEnv, rows []*ownedRow, opts ProcessOptions) (a, b *ownerProcess) {
			cfg := e.config(ModeHybrid)
			cfg.Exclusive, cfg.StartFromBeginning = true, true
			a = startOwnerProcess(t, e, cfg, rows, "a", opts)
			waitFor(t, func() bool { return a.w.Stats().Active }, "the first watcher takes the lock")
			b = startOwnerProcess(t, e, cfg, rows, "b", opts)
			return a, b
		},
		move: func(t *testing.T, e *liveEnv, a, b *ownerProcess) { a.stop() }},
	{name: "shared member leaves", lo: 0, hi: SharedRanges / 2, shared: true, start: sharedPairProcess,
		move: func(t *testing.T, e *liveEnv, a, b *ownerProcess) { a.stop() }},
	{name: "shared hand-over", lo: SharedRanges / 3, hi: SharedRanges / 2, shared: true, start: sharedPairProcess,
		move: func(t *testing.T, e *liveEnv, a, b *ownerProcess) { joinThird(t, e) }},
}

// TestLiveHeldKeyFollowsItsEvents: a row's first event fails under BlockOnFailure on watcher a
// and holds its key; then the row's events move to watcher b, whose Process started (and, if
// shared, handled an event of another row) before the key was held: by an exclusive fail-over,
// a Shared member leaving, or a Shared hand-over to a member joining. b parks the key's later
// events without running them, and once the key is released runs them all, in order.
func TestLiveHeldKeyFollowsItsEvents(t *testing.T) {
	t.Parallel()
	for _, m := range heldKeyMoves {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			e := newLive(t)
			r, other := newOwnedRow(t, e, m.lo, m.hi), newOwnedRow(t, e, SharedRanges/2, SharedRanges)
			other.cure(false)
			opts := ProcessOptions{OnFailure: BlockOnFailure, MaxAttempts: 1, ParkedPollInterval: 20 * time.Millisecond}
			a, b := m.start(t, e, []*ownedRow{r, other}, opts)
			if m.shared { // b's Process loads the held keys before it takes this event
				other.write(0)
				waitFor(t, func() bool { return len(other.runs()) == 1 }, "b handles an event")
				require.Equal(t, "b", other.runs()[0].by)
			}
			want := []int64{r.write(0)}
			waitFor(t, func() bool { return len(e.listParked()) == 1 }, "the first event is parked and holds its key")
			require.Empty(t, r.runs())
			m.move(t, e, a, b)
			waitFor(t, func() bool { return ownsRange(b.w, r.rangeNo) }, "b takes the row's events over")
			want = append(want, r.write(1), r.write(2))
			waitFor(t, func() bool { return len(e.listParked())+len(r.runs()) == len(want) },
				"b parks or runs the key's later events")
			require.Empty(t, r.runs(), "b ran events of a held key before its release")
			ps := e.listParked()
			require.Equal(t, want, parkedIDs(ps))
			r.cure(false)
			require.NoError(t, admin.RetryParked(context.Background(), e.db, "c", ps[0].ID, admin.Options{}))
			waitFor(t, func() bool { return len(e.listParked()) == 0 }, "the release runs the key's events")
			require.Equal(t, []rowRun{{"b", want[0]}, {"b", want[1]}, {"b", want[2]}}, r.runs(),
				"the released key's events run on b, in order")
			b.stop()
		})
	}
}

// TestLiveExclusiveStandbyRunsNoRerun: a parked event released while the active watcher's
// Process is stopped is not run by a standby's Process, which polls nothing; the active
// watcher runs it, once, when its Process runs again.
func TestLiveExclusiveStandbyRunsNoRerun(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	r := newOwnedRow(t, e, 0, SharedRanges)
	opts := ProcessOptions{OnFailure: ParkOnFailure, MaxAttempts: 1, ParkedPollInterval: 20 * time.Millisecond}
	cfg := e.config(ModeHybrid)
	cfg.Exclusive, cfg.StartFromBeginning = true, true
	active := e.start(cfg)
	waitFor(t, func() bool { return active.Stats().Active }, "the first watcher takes the lock")
	errc, cancel := startProcess(t, active, opts, r.handler("active"))
	standby := startOwnerProcess(t, e, cfg, []*ownedRow{r}, "standby", opts)
	first := r.write(0)
	waitFor(t, func() bool { return len(e.listParked()) == 1 }, "the event is parked")
	cancel()
	require.NoError(t, <-errc)
	r.cure(false)
	require.NoError(t, admin.RetryParked(context.Background(), e.db, "c", e.listParked()[0].ID, admin.Options{}))
	time.Sleep(25 * opts.ParkedPollInterval) // polls of the standby after the release
	require.Empty(t, r.runs(), "the standby ran the released event")
	require.Len(t, e.listParked(), 1)
	require.False(t, standby.w.Stats().Active)
	errc, cancel = startProcess(t, active, opts, r.handler("active"))
	waitFor(t, func() bool { return len(e.listParked()) == 0 }, "the active watcher runs the released event")
	cancel()
	require.NoError(t, <-errc)
	// Once, by the watcher holding the lock (the standby only if a lock check of the active one
	// timed out on a loaded machine and it took over).
	owner := "active"
	if standby.w.Stats().Active {
		owner = "standby"
	}
	require.Equal(t, []rowRun{{owner, first}}, r.runs(), "active: %v; standby: %v", active.Err(), standby.w.Err())
	standby.stop()
}

// TestLiveSharedHandOverWaitsForAReleasedEvent: member a runs a released parked event again,
// and its range is to move to member b (a third member joins) while the rerun runs: a gives the
// range up only once the rerun ended, so b never runs the event, and it never runs twice at once.
func TestLiveSharedHandOverWaitsForAReleasedEvent(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	r := newOwnedRow(t, e, SharedRanges/3, SharedRanges/2)
	opts := ProcessOptions{Workers: 2, OnFailure: ParkOnFailure, MaxAttempts: 1, ParkedPollInterval: 20 * time.Millisecond}
	a, b := sharedPairProcess(t, e, []*ownedRow{r}, opts)
	first := r.write(0)
	waitFor(t, func() bool { return len(e.listParked()) == 1 }, "the event is parked")
	r.cure(true)
	require.NoError(t, admin.RetryParked(context.Background(), e.db, "c", e.listParked()[0].ID, admin.Options{}))
	require.Equal(t, "a", receiveName(t, r.entered), "the range owner runs the released event")
	joinThird(t, e)
	// b's coordinator looks at the split every fifth of the lease and b polls every 20ms: had a
	// released the range, b would have claimed it and started the event within this wait.
	select {
	case name := <-r.entered:
		t.Fatalf("%s ran the released event while a still ran it", name)
	case <-time.After(2 * time.Second):
	}
	require.False(t, ownsRange(b.w, r.rangeNo), "a gave the range up while its rerun ran")
	r.openGate()
	waitFor(t, func() bool { return len(e.listParked()) == 0 }, "the rerun ends")
	waitFor(t, func() bool { return ownsRange(b.w, r.rangeNo) }, "then the range moves to b")
	time.Sleep(25 * opts.ParkedPollInterval) // polls of b after it took the range over
	require.Equal(t, []rowRun{{"a", first}}, r.runs())
	r.mu.Lock()
	require.Zero(t, r.overlaps)
	r.mu.Unlock()
	a.stop()
	b.stop()
}

// receiveName receives one name from ch within liveWait.
func receiveName(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case name := <-ch:
		return name
	case <-time.After(liveWait):
		t.Fatal("no handler entered")
		return ""
	}
}

// TestLiveSharedLeaveEndsARunningRerun: member a runs a released parked event again when it is
// closed and leaves the members: the rerun's context ends at once (not after Process's grace
// period), the event is not parked again, and member b, which takes the range over, runs it,
// never while a still does.
func TestLiveSharedLeaveEndsARunningRerun(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	r := newOwnedRow(t, e, 0, SharedRanges/2)
	opts := ProcessOptions{OnFailure: ParkOnFailure, MaxAttempts: 1, ParkedPollInterval: 20 * time.Millisecond, GracePeriod: time.Hour}
	a, b := sharedPairProcess(t, e, []*ownedRow{r}, opts)
	first := r.write(0)
	waitFor(t, func() bool { return len(e.listParked()) == 1 }, "the event is parked")
	r.cure(true)
	require.NoError(t, admin.RetryParked(context.Background(), e.db, "c", e.listParked()[0].ID, admin.Options{}))
	require.Equal(t, "a", receiveName(t, r.entered), "the range owner runs the released event")
	require.NoError(t, a.w.Close(context.Background()))
	require.Equal(t, "b", receiveName(t, r.entered), "the member taking the range over runs the released event")
	r.openGate()
	waitFor(t, func() bool { return len(e.listParked()) == 0 }, "b's rerun ends")
	// b may also be handed the event again as a delivery (at-least-once); a never finishes it.
	runs := r.runs()
	require.NotEmpty(t, runs)
	for _, run := range runs {
		require.Equal(t, rowRun{"b", first}, run, "runs: %v", runs)
	}
	r.mu.Lock()
	require.Zero(t, r.overlaps, "b ran the event while a still did")
	r.mu.Unlock()
	a.stop()
	b.stop()
}

// TestLiveExOwnerStartsNoHandler: an exclusive watcher whose lock session ends while a handler
// runs and two more events wait for a worker starts no handler once it knows it lost the lock:
// its successor delivers those events again.
func TestLiveExOwnerStartsNoHandler(t *testing.T) {
	t.Parallel()
	e, w := startActiveExclusive(t)
	var (
		mu      sync.Mutex
		started []int64
	)
	entered, gate := make(chan struct{}), make(chan struct{})
	errc, cancel := startProcess(t, w, ProcessOptions{Workers: 1}, func(ctx context.Context, ev EventWithToken) error {
		mu.Lock()
		started = append(started, tokenID(t, ev))
		first := len(started) == 1
		mu.Unlock()
		if first {
			close(entered)
			<-gate
		}
		return nil
	})
	defer cancel()
	ids := e.insert(3)
	<-entered
	waitFor(t, func() bool { return w.Stats().Process.InFlight == len(ids) }, "Process takes the other events")
	e.terminate(e.lockHolder())
	waitFor(t, func() bool { return errors.Is(w.Err(), ErrExclusiveLost) }, "the watcher finds its lock lost")
	close(gate)
	select {
	case err := <-errc:
		require.ErrorIs(t, err, ErrExclusiveLost)
	case <-time.After(liveWait):
		t.Fatal("Process did not stop")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, ids[:1], started, "a watcher that lost its lock started handlers")
}

// TestLiveSharedHandOverInTheMiddleOfARelease: member a releases a held key (its two parked
// events run again, in order) and the key's range is to move to member b while the first runs:
// the hand-over waits for it, a leaves the rest of the release to b, and b runs the key's other
// parked event, then its new one, in order.
func TestLiveSharedHandOverInTheMiddleOfARelease(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	r := newOwnedRow(t, e, SharedRanges/3, SharedRanges/2)
	opts := ProcessOptions{OnFailure: BlockOnFailure, MaxAttempts: 1, ParkedPollInterval: 20 * time.Millisecond}
	a, b := sharedPairProcess(t, e, []*ownedRow{r}, opts)
	want := []int64{r.write(0), r.write(1)}
	waitFor(t, func() bool { return len(e.listParked()) == 2 }, "the key's events are parked")
	r.cure(true)
	require.NoError(t, admin.RetryParked(context.Background(), e.db, "c", e.listParked()[0].ID, admin.Options{}))
	require.Equal(t, "a", receiveName(t, r.entered), "the range owner releases the key")
	joinThird(t, e)
	waitFor(t, func() bool {
		a.w.sh.rerunMu.Lock()
		defer a.w.sh.rerunMu.Unlock()
		return a.w.sh.handing
	}, "a starts handing the range over")
	r.openGate()
	waitFor(t, func() bool { return ownsRange(b.w, r.rangeNo) }, "the range moves to b")
	want = append(want, r.write(2))
	waitFor(t, func() bool { return len(r.runs()) == len(want) }, "the key's events run")
	require.Equal(t, []rowRun{{"a", want[0]}, {"b", want[1]}, {"b", want[2]}}, r.runs())
	require.Empty(t, e.listParked())
	a.stop()
	b.stop()
}

// TestLiveExOwnerHandlerContextEnds: the context of a handler running on an exclusive watcher
// ends when the watcher finds its lock lost, not at the end of Process's grace period.
func TestLiveExOwnerHandlerContextEnds(t *testing.T) {
	t.Parallel()
	e, w := startActiveExclusive(t)
	entered := make(chan struct{})
	errc, cancel := startProcess(t, w, ProcessOptions{GracePeriod: time.Hour}, func(ctx context.Context, ev EventWithToken) error {
		close(entered)
		<-ctx.Done()
		return ctx.Err()
	})
	defer cancel()
	e.insert(1)
	<-entered
	e.terminate(e.lockHolder())
	select {
	case err := <-errc:
		require.ErrorIs(t, err, ErrExclusiveLost)
	case <-time.After(liveWait):
		t.Fatal("the handler's context did not end when the lock was lost")
	}
}

// startActiveExclusive starts an exclusive polling watcher from the beginning on a new live
// environment and waits until it holds the client's lock.
func startActiveExclusive(t *testing.T) (*liveEnv, *Watcher) {
	t.Helper()
	e := newLive(t)
	cfg := e.config(ModePolling)
	cfg.Exclusive, cfg.StartFromBeginning = true, true
	w := e.start(cfg)
	waitFor(t, func() bool { return w.Stats().Active }, "the watcher takes the lock")
	return e, w
}
