package pgchangestream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/admin"
	"github.com/pgchangestream/pgchangestream/internal/procface"
	"github.com/stretchr/testify/require"
)

// errPoison is the error of a poison event's handler.
var errPoison = errors.New("poison event")

// poisonRun picks poison events as the engine takes them and fails their handlers while they
// are poisoned; the other events go to the recorder. Events it takes charge of (the poisons,
// and every later event of a key it holds) are recorded here, not by the recorder.
type poisonRun struct {
	t     *testing.T
	rec   *procRecorder
	taken atomic.Int64
	pick  func(n int64, id int64) bool // whether the n-th event taken, id, is a poison
	hold  bool                         // take charge of the poison's key from the poison on

	mu       sync.Mutex
	poisoned map[int64]bool     // poison events whose handler fails
	attempts map[int64]int      // failed attempts, by event
	held     map[string]bool    // keys taken charge of
	given    map[string][]int64 // events taken in charge, per key, in delivery order
	ran      []int64            // events taken in charge whose handler succeeded, in order
}

func newPoisonRun(t *testing.T, rec *procRecorder, pick func(n, id int64) bool) *poisonRun {
	return &poisonRun{t: t, rec: rec, pick: pick, poisoned: map[int64]bool{}, attempts: map[int64]int{},
		held: map[string]bool{}, given: map[string][]int64{}}
}

func (p *poisonRun) key(ev EventWithToken) string {
	id, n := tokenID(p.t, ev), p.taken.Add(1)
	k := p.rec.gave(id)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pick(n, id) {
		p.poisoned[id] = true
		p.held[k] = p.hold
		p.rec.skip(id)
		p.given[k] = append(p.given[k], id)
	} else if p.held[k] {
		p.rec.skip(id)
		p.given[k] = append(p.given[k], id)
	}
	return k
}

func (p *poisonRun) handle(ctx context.Context, ev EventWithToken) error {
	id := tokenID(p.t, ev)
	p.mu.Lock()
	// Taken in charge: the poison, or an event of its key taken after it (an earlier one of the
	// key can still be queued when the poison is taken, and runs first, as any event does).
	poisoned, charged := p.poisoned[id], p.attempts[id] > 0 || slices.Contains(p.given[p.rec.keyOf(id)], id)
	if poisoned {
		p.attempts[id]++
	} else if charged {
		p.ran = append(p.ran, id)
	}
	p.mu.Unlock()
	switch {
	case poisoned:
		return fmt.Errorf("event %d: %w", id, errPoison)
	case charged:
		return nil
	}
	return p.rec.handle(ctx, ev)
}

// cure makes id's handler succeed from now on.
func (p *poisonRun) cure(id int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.poisoned[id] = false
}

// poisons returns the poison events picked so far, in the order they were taken.
func (p *poisonRun) poisons() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int64
	for id := range p.poisoned {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// listParked returns client "c"'s parked events, oldest first.
func (e *liveEnv) listParked() []ParkedEvent {
	e.t.Helper()
	ps, err := admin.ListParked(context.Background(), e.db, "c", admin.Options{})
	require.NoError(e.t, err)
	return ps
}

// parkedIDs returns the changelog ids of parked events, in their order.
func parkedIDs(ps []ParkedEvent) []int64 {
	out := make([]int64, len(ps))
	for i, p := range ps {
		out[i] = p.ChangelogID
	}
	return out
}

// TestLiveProcessStopOnFailure: the 30th event taken always fails. Process returns an error
// wrapping the handler's, naming the key and the token; the saved mark stops before the poison,
// so the next run gives it again (with every event after it in delivery order that was not
// finished), and nothing finished before it is given again.
func TestLiveProcessStopOnFailure(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	rec := newProcRecorder(t)
	rec.keyOf = procKey
	writers := e.startWriters(crashWriters, 2*time.Millisecond)
	var poison atomic.Int64
	opts := procOptions(rec)
	opts.MaxAttempts, opts.RetryMinBackoff, opts.RetryMaxBackoff = 3, 5*time.Millisecond, 20*time.Millisecond
	var taken atomic.Int64
	opts.Key = func(ev EventWithToken) string {
		if taken.Add(1) == 30 {
			poison.Store(tokenID(t, ev))
		}
		return rec.key(ev)
	}
	rec.next()
	w := e.start(procConfig(e))
	err := w.Process(t.Context(), opts, func(ctx context.Context, ev EventWithToken) error {
		if tokenID(t, ev) == poison.Load() {
			return errPoison
		}
		return rec.handle(ctx, ev)
	})
	p := poison.Load()
	require.ErrorIs(t, err, errPoison)
	require.ErrorContains(t, err, fmt.Sprintf("key %q", procKey(p)))
	require.ErrorContains(t, err, "token "+strconv.FormatInt(p, 10))
	require.NoError(t, w.Close(context.Background()))
	writers.stop()
	catchUp(t, e, rec, procOptions(rec), writers)
	rec.check() // the poison, unfinished, is given again; nothing finished before it is
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Equal(t, 2, rec.done[p], "the poison is handled by the next run")
}

// ranEvents returns the events taken in charge that ran successfully, in order.
func (p *poisonRun) ranEvents() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.ran)
}

// parkOpts are the options of the dead-letter tests: 3 attempts, quick retries and polls.
func parkOpts(p *poisonRun, policy FailurePolicy) ProcessOptions {
	opts := procOptions(p.rec)
	opts.Key, opts.OnFailure, opts.ParkedPollInterval = p.key, policy, 100*time.Millisecond
	opts.MaxAttempts, opts.RetryMinBackoff, opts.RetryMaxBackoff = 3, 5*time.Millisecond, 20*time.Millisecond
	return opts
}

// TestLiveProcessParkOnFailure: two poison events of different keys are parked (key, error,
// attempts = MaxAttempts) while their keys and the others go on; RetryParked with a cured
// handler makes the running Process rerun one within a few poll intervals and remove its row;
// DropParked removes the other without a run.
func TestLiveProcessParkOnFailure(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	rec := newProcRecorder(t)
	rec.keyOf = procKey
	var first, second int64 // pick runs in the Key function: on the engine's dispatcher goroutine only
	p := newPoisonRun(t, rec, func(n, id int64) bool {
		switch {
		case n == 30:
			first = id
		case n >= 60 && second == 0 && procKey(id) != procKey(first):
			second = id
		default:
			return false
		}
		return true
	})
	writers := e.startWriters(crashWriters, 2*time.Millisecond)
	opts := parkOpts(p, ParkOnFailure)
	rec.next()
	w := e.start(procConfig(e))
	errc, cancel := startProcess(t, w, opts, p.handle)
	waitFor(t, func() bool { return len(e.listParked()) == 2 }, "two events are parked")
	parked, poisons := e.listParked(), p.poisons()
	require.ElementsMatch(t, poisons, parkedIDs(parked))
	for _, pe := range parked {
		require.Equal(t, procKey(pe.ChangelogID), pe.Key)
		require.Equal(t, "c", pe.Client)
		require.Equal(t, opts.MaxAttempts, pe.Attempts)
		require.Contains(t, pe.Error, fmt.Sprintf("event %d: %s", pe.ChangelogID, errPoison))
		require.False(t, pe.Blocking)
		require.False(t, pe.RetryRequested)
	}
	// The poisons' keys go on with their later events, and the other keys flow.
	handled := rec.handledCount()
	waitFor(t, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for _, pe := range parked { // a key's events are handled in delivery order
			given, h := rec.given[0][pe.Key], rec.handled[0][pe.Key]
			if len(h) == 0 || slices.Index(given, h[len(h)-1]) < slices.Index(given, pe.ChangelogID) {
				return false
			}
		}
		return len(rec.done) >= handled+100
	}, "the poisons' keys and the others go on")

	retried, dropped := parked[0], parked[1]
	p.cure(retried.ChangelogID)
	began := time.Now()
	require.NoError(t, admin.RetryParked(context.Background(), e.db, "c", retried.ID, admin.Options{}))
	waitFor(t, func() bool { return slices.Contains(p.ranEvents(), retried.ChangelogID) }, "the released event reruns")
	rerunAfter := time.Since(began)
	waitFor(t, func() bool { return len(e.listParked()) == 1 }, "the rerun event's row is removed")
	require.NoError(t, admin.DropParked(context.Background(), e.db, "c", dropped.ID, admin.Options{}))
	require.Empty(t, e.listParked())
	writers.stop()
	waitFor(t, func() bool { return rec.handledAll(writers.rows) }, "every other committed row is handled")
	time.Sleep(3 * opts.ParkedPollInterval) // a few polls: the dropped event must not run
	cancel()
	require.NoError(t, <-errc)
	require.Equal(t, []int64{retried.ChangelogID}, p.ranEvents(), "only the retried event reran")
	p.mu.Lock()
	require.Equal(t, opts.MaxAttempts, p.attempts[dropped.ChangelogID], "the dropped event never ran again")
	p.mu.Unlock()
	rec.check()
	require.Less(t, rerunAfter, 3*time.Second, "RetryParked took %v to rerun with a %v poll", rerunAfter, opts.ParkedPollInterval)
	t.Logf("%d rows committed; rerun %v after RetryParked (poll interval %v)", len(writers.rows), rerunAfter, opts.ParkedPollInterval)
}

// givenOf returns the events of key taken in charge, in delivery order.
func (p *poisonRun) givenOf(key string) []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.given[key])
}

// TestLiveProcessBlockOnFailure: the 30th event taken fails and blocks its key: its later
// events are parked behind it without running while other keys flow, also after a restart of
// the watcher and Process. A release while the handler still fails blocks the key again. With
// the handler cured, a release runs the key's parked events in order, then its new events, and
// empties the dead-letter table.
func TestLiveProcessBlockOnFailure(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	rec := newProcRecorder(t)
	rec.keyOf = procKey
	p := newPoisonRun(t, rec, func(n, _ int64) bool { return n == 30 })
	p.hold = true
	opts := parkOpts(p, BlockOnFailure)
	run := func() (stop func()) {
		rec.next()
		w := e.start(procConfig(e))
		errc, cancel := startProcess(t, w, opts, p.handle)
		return func() {
			cancel()
			require.NoError(t, <-errc)
			require.NoError(t, w.Close(context.Background()))
		}
	}
	parkedMore := func(n int, what string) {
		t.Helper()
		waitFor(t, func() bool { return len(e.listParked()) >= n }, what)
		require.Empty(t, p.ranEvents(), "an event of the blocked key ran")
	}
	writers := e.startWriters(crashWriters, 2*time.Millisecond)
	stop := run()
	parkedMore(4, "the poison and later events of its key are parked")
	ps := e.listParked()
	head, key := ps[0], ps[0].Key
	require.Equal(t, p.poisons(), []int64{head.ChangelogID})
	require.True(t, head.Blocking)
	require.Equal(t, opts.MaxAttempts, head.Attempts)
	require.Contains(t, head.Error, errPoison.Error())
	for _, pe := range ps[1:] {
		require.Equal(t, key, pe.Key)
		require.True(t, pe.Blocking)
		require.Equal(t, procface.BlockedKeyError, pe.Error)
		require.Zero(t, pe.Attempts)
	}
	handled := rec.handledCount()
	waitFor(t, func() bool { return rec.handledCount() >= handled+100 }, "the other keys flow")
	stop()

	stop = run()
	parkedMore(len(e.listParked())+3, "after a restart, new events of the blocked key are parked")
	p.mu.Lock()
	attempts := p.attempts[head.ChangelogID]
	p.mu.Unlock()
	require.NoError(t, admin.RetryParked(context.Background(), e.db, "c", head.ID, admin.Options{}))
	waitFor(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.attempts[head.ChangelogID] == attempts+opts.MaxAttempts && !e.listParked()[0].RetryRequested
	}, "the released head reruns and is parked again")
	parkedMore(len(e.listParked())+2, "the key is blocked again")
	writers.stop()
	waitFor(t, func() bool { return rec.handledAll(writers.rows) && len(e.listParked()) == len(p.givenOf(key)) },
		"every committed row is handled or parked")
	ps = e.listParked()
	require.Equal(t, p.givenOf(key), parkedIDs(ps), "the key's events are parked once each, in delivery order")

	p.cure(head.ChangelogID)
	require.NoError(t, admin.RetryParked(context.Background(), e.db, "c", head.ID, admin.Options{}))
	waitFor(t, func() bool { return len(e.listParked()) == 0 }, "the release runs the key's parked events")
	require.Equal(t, parkedIDs(ps), p.ranEvents(), "the parked events ran in order")
	more := e.startWriters(crashWriters, 2*time.Millisecond)
	waitFor(t, func() bool { return more.committed() >= 300 }, "the writers commit")
	more.stop()
	waitFor(t, func() bool { return rec.handledAll(more.rows) && len(p.ranEvents()) == len(p.givenOf(key)) },
		"every new row is handled")
	require.Equal(t, p.givenOf(key)[len(ps):], p.ranEvents()[len(ps):], "then the key's new events ran in order")
	require.Empty(t, e.listParked())
	stop()
	rec.check()
	t.Logf("%d events of the blocked key parked, then run; %d after the release", len(ps), len(p.ranEvents())-len(ps))
}
