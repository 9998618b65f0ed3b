package procrun

import (
	"container/heap"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/watermark"
)

// keyState is one key's queue and state. Guarded by dispatcher.mu.
type keyState[E any] struct {
	name    string
	queue   []*Job[E] // FIFO; the head is the job running or waiting for its backoff
	running bool      // a job of the key is at a worker
	backoff bool      // the head failed and waits for its retry (for ever once stopping)
	inReady bool      // the key is in dispatcher.ready
	// blocked: under Block, a parked event holds the key: its deliveries are parked without
	// running. blockEpoch is the poll epoch when it was blocked (see applyPoll).
	blocked    bool
	blockEpoch uint64
	releasing  bool // a release job (loading the key's parked events) is queued or running
	// deferred counts the queue's deferred deliveries, the one being restored included: while
	// it is not 0 the key's new deliveries are deferred too, so a full event never waits behind
	// a deferred one (and a deferred head always finds full events of other keys able to run).
	deferred int
}

// jobKind is what a worker does with a job.
type jobKind int

const (
	runJob     jobKind = iota // run the handler
	parkJob                   // park without running (its key is blocked)
	releaseJob                // load the key's parked events to rerun them
)

type task[E any] struct {
	kind      jobKind
	job       *Job[E]
	restoring bool // the job is deferred: the worker restores it first
}

// outcome is what became of a task.
type outcome int

const (
	finished   outcome = iota // done: finish it (handled, or parked)
	retryIt                   // failed, attempts left: back off, then run again
	failed                    // failed MaxAttempts under Stop, or fatally (Fatal)
	blockKey                  // parked under Block (or a blocking rerun reparked): finish it and block the key
	loaded                    // a release job's parked events are in reruns
	unrestored                // the restore of a deferred job failed: back off, then try again
	abandoned                 // the stop came first: not finished
)

type result[E any] struct {
	task    task[E]
	outcome outcome
	reruns  []Parked[E]
}

// pollResult is one look at the dead-letter store.
type pollResult[E any] struct {
	epoch    uint64
	released []Parked[E]
	blocked  []string
}

// dispatcher holds the scheduling state. The fields below mu are guarded by it: the dispatcher
// goroutine (loop) takes it to queue deliveries, end backoffs, apply polls and stop; a worker
// takes it to apply its result and take its next task (complete). The fields above it are set
// by newDispatcher and never change.
type dispatcher[E any] struct {
	o      Options
	h      Hooks[E]
	jobCtx context.Context
	work   chan task[E]  // tasks for idle workers; capacity Workers, never more tasks than idle workers
	kick   chan struct{} // workers → dispatcher goroutine: the state changed, look again (capacity 1)
	polls  chan uint64   // dispatcher → poller: look now (capacity 1)
	polled chan pollResult[E]

	mu    sync.Mutex
	keys  map[string]*keyState[E]
	ready []*keyState[E] // keys with a queued job, none running, not in backoff; FIFO
	// restoreWait: ready keys whose head is deferred, set aside while MaxInFlight full events
	// are held; they are served first when there is room, and no event is taken meanwhile.
	restoreWait []*keyState[E]
	backoffs    backoffHeap[E]
	mark        *watermark.Mark[E]
	seq         uint64
	inFlight    int            // deliveries taken from the source and not finished
	deferred    int            // of those, the deferred ones not being restored
	busy        int            // tasks handed out (queued in work or running) and not completed
	reruns      map[int64]bool // parked ids queued or running as reruns
	epoch       uint64         // polls asked for
	polling     bool           // a poll is outstanding
	stopping    bool           // no more events are taken, no retries and no polls (set by loop or by complete)
	graceOver   bool           // stopping and the grace period is over: nothing more runs
	err         error

	// heldLoaded: under Block, the held keys were loaded, at ownership generation heldGen
	// (Hooks.Owner). Dispatcher goroutine only (Run's, before and in loop).
	heldLoaded bool
	heldGen    uint64
}

func newDispatcher[E any](o Options, h Hooks[E], jobCtx context.Context) *dispatcher[E] {
	return &dispatcher[E]{
		o: o, h: h, jobCtx: jobCtx,
		work:   make(chan task[E], o.Workers),
		kick:   make(chan struct{}, 1),
		polls:  make(chan uint64, 1),
		polled: make(chan pollResult[E], 1),
		keys:   map[string]*keyState[E]{},
		mark:   watermark.New[E](),
		reruns: map[int64]bool{},
	}
}

func (d *dispatcher[E]) key(name string) *keyState[E] {
	k := d.keys[name]
	if k == nil {
		k = &keyState[E]{name: name}
		d.keys[name] = k
	}
	return k
}

// loop is the dispatcher goroutine's body (it runs on Run's goroutine). It takes deliveries,
// ends backoffs, polls the dead-letter store and stops the run; workers hand themselves their
// next tasks (complete) and kick it when they changed the state, so that it looks again whether
// to take events, when the next backoff ends and whether the run is over.
func (d *dispatcher[E]) loop(ctx context.Context, src <-chan E, cancelJobs, stopPoll context.CancelFunc) error {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var tick <-chan time.Time
	if d.o.Policy != Stop {
		t := time.NewTicker(d.o.PollInterval)
		defer t.Stop()
		tick = t.C
	}
	done := ctx.Done()
	graceTimer := time.NewTimer(time.Hour)
	graceTimer.Stop()
	defer graceTimer.Stop()
	var grace <-chan time.Time
	for {
		d.mu.Lock()
		if d.stopping && grace == nil { // stopped here, or by a failure a worker applied
			done, tick = nil, nil
			stopPoll()
			graceTimer.Reset(d.o.Grace)
			grace = graceTimer.C
		}
		var tasks []task[E]
		if !d.graceOver { // stopping: what was taken still runs during the grace period
			tasks = d.handOut(nil)
		}
		if d.stopping && d.busy == 0 && (d.graceOver || len(d.ready) == 0) {
			close(d.work) // the workers are idle: they exit
			d.mu.Unlock()
			return d.err
		}
		var in <-chan E
		if d.canTake() {
			in = src
		}
		var wake <-chan time.Time
		if len(d.backoffs) > 0 && !d.stopping {
			timer.Reset(time.Until(d.backoffs[0].at))
			wake = timer.C
		}
		d.mu.Unlock()
		d.send(tasks)
		select {
		case ev, ok := <-in:
			var name string
			held := true
			if ok {
				held = d.heldCurrent(ctx)
				name = d.h.Key(ev) // the caller's function: not under mu
			}
			// A worker may have stopped the run (a failure) since this select began: what
			// arrives then is not taken, so it is never finished, as if the source had
			// waited (the watcher delivers it again after a restart); no backoff ends and no
			// poll starts after the stop.
			d.mu.Lock()
			switch {
			case !ok || !held: // the source closed, or ctx ended while loading the held keys
				d.stop(nil)
			case !d.stopping:
				d.take(name, ev)
			}
			d.mu.Unlock()
		case <-d.kick:
		case <-wake:
			d.mu.Lock()
			if !d.stopping {
				d.endBackoffs()
			}
			d.mu.Unlock()
		case <-tick:
			d.mu.Lock()
			ask := !d.polling && !d.stopping
			if ask {
				d.polling = true
				d.epoch++
			}
			epoch := d.epoch
			d.mu.Unlock()
			if ask {
				d.polls <- epoch // never blocks: one poll at a time, and the poller takes each ask
			}
		case p := <-d.polled:
			d.mu.Lock()
			d.polling = false
			if !d.stopping {
				d.applyPoll(p)
			}
			d.mu.Unlock()
		case <-done:
			d.mu.Lock()
			d.stop(nil)
			d.mu.Unlock()
		case <-grace:
			d.mu.Lock()
			d.graceOver = true
			d.mu.Unlock()
			cancelJobs()
		}
	}
}

// heldCurrent makes sure, under Block, that the held keys were loaded under the run's current
// ownership (Hooks.Owner) before an event is taken: a key held by an event parked by another
// owner, whose events this run gained, holds them here too. It returns false when ctx ended
// first. Dispatcher goroutine only.
func (d *dispatcher[E]) heldCurrent(ctx context.Context) bool {
	if d.o.Policy != Block {
		return true
	}
	if gen, _ := d.h.Owner(); d.heldLoaded && gen == d.heldGen {
		return true
	}
	return d.loadHeld(ctx)
}

// loadHeld reads the held keys from the store, trying again while it fails, and holds each (see
// hold); it returns false when ctx ended first. Dispatcher goroutine only.
func (d *dispatcher[E]) loadHeld(ctx context.Context) bool {
	gen, _ := d.h.Owner() // before the read: a later gain loads again
	keys, ok := retry(ctx, d.o.Delay, d.h, func() ([]string, error) { return d.h.Store.BlockedKeys(ctx) })
	if !ok {
		return false
	}
	d.mu.Lock()
	for _, name := range keys {
		d.hold(d.key(name))
	}
	d.mu.Unlock()
	d.heldLoaded, d.heldGen = true, gen
	return true
}

// hold blocks k, a key the store holds, unless it is blocked already or being released here (a
// release job, or the reruns it loaded, are queued or running): the release unblocks it, and its
// parked rows stay blocking until their reruns end. mu must be held.
func (d *dispatcher[E]) hold(k *keyState[E]) {
	if k.blocked || k.releasing || slices.ContainsFunc(k.queue, func(j *Job[E]) bool { return j.Parked > 0 }) {
		return
	}
	k.blocked, k.blockEpoch = true, d.epoch
}

// stop stops the run with err (nil: ctx ended or the source closed), unless it is stopping
// already; the loop then stops polling and starts the grace period.
func (d *dispatcher[E]) stop(err error) {
	if !d.stopping {
		d.stopping, d.err = true, err
	}
}

// complete applies a worker's result and, if a ready key can run, hands its head to the same
// worker (ok), so that a busy run needs no trip through the dispatcher goroutine per event. It
// hands other ready keys to idle workers and kicks the dispatcher goroutine.
func (d *dispatcher[E]) complete(r result[E]) (next task[E], ok bool) {
	d.mu.Lock()
	d.busy--
	if err := d.apply(r); err != nil {
		d.stop(err)
	}
	var tasks []task[E]
	if !d.graceOver {
		next, ok = d.next()
		tasks = d.handOut(nil)
	}
	d.h.Stats.Busy.Store(int64(d.busy))
	d.mu.Unlock()
	d.send(tasks)
	select {
	case d.kick <- struct{}{}:
	default: // a kick is pending: the loop looks at everything
	}
	return next, ok
}

// full is the number of full (not deferred) deliveries held: taken and not finished, or being
// restored.
func (d *dispatcher[E]) full() int { return d.inFlight - d.deferred }

// canTake reports whether the dispatcher reads the source: not stopping, fewer than MaxInFlight
// full events, fewer than MaxDeferred deferred ones, and no deferred head waiting for room.
func (d *dispatcher[E]) canTake() bool {
	return !d.stopping && d.full() < d.o.MaxInFlight && len(d.restoreWait) == 0 &&
		(d.h.Defer == nil || d.deferred < d.o.MaxDeferred)
}

// take queues a delivery from the source under its key's name, deferred if the key holds
// MaxKeyQueue full events or deferred ones.
func (d *dispatcher[E]) take(name string, ev E) {
	d.seq++
	k := d.key(name)
	j := &Job[E]{Ev: ev, Key: k.name, Seq: d.seq}
	if d.h.Defer != nil && (k.deferred > 0 || len(k.queue) >= d.o.MaxKeyQueue) {
		j.Ev, j.Deferred = d.h.Defer(ev), true
		k.deferred++
		d.setDeferred(d.deferred + 1)
	}
	d.mark.Add(d.seq, j.Ev)
	d.inFlight++
	d.h.Stats.InFlight.Store(int64(d.inFlight))
	d.enqueue(k, j)
}

func (d *dispatcher[E]) setDeferred(n int) {
	d.deferred = n
	d.h.Stats.Deferred.Store(int64(n))
}

func (d *dispatcher[E]) enqueue(k *keyState[E], j *Job[E]) {
	k.queue = append(k.queue, j)
	d.h.Stats.noteQueue(k.name, len(k.queue))
	d.makeReady(k)
}

// makeReady puts k in the ready FIFO if it has work and nothing holds it.
func (d *dispatcher[E]) makeReady(k *keyState[E]) {
	if len(k.queue) > 0 && !k.running && !k.backoff && !k.inReady {
		k.inReady = true
		d.ready = append(d.ready, k)
	}
}

// handOut appends to tasks the head jobs of ready keys for the workers not running a task,
// which the caller sends (send) once it released mu. mu must be held.
func (d *dispatcher[E]) handOut(tasks []task[E]) []task[E] {
	for {
		t, ok := d.next()
		if !ok {
			return tasks
		}
		tasks = append(tasks, t)
	}
}

// send hands tasks to idle workers. It never blocks: each task counts in busy, and busy <=
// Workers (the capacity of work) means that as many workers are not running a task, each
// waiting for one in work or on its way there (complete found nothing for it). The run cannot
// end before they are sent: it ends only when busy is 0.
func (d *dispatcher[E]) send(tasks []task[E]) {
	for _, t := range tasks {
		d.work <- t
	}
}

// next takes the head job of the next ready key as a task, if a worker is free for it. A
// deferred head is restored on the worker and counts as a full event from now on.
func (d *dispatcher[E]) next() (task[E], bool) {
	if d.busy >= d.o.Workers {
		return task[E]{}, false
	}
	k := d.nextReady()
	if k == nil {
		return task[E]{}, false
	}
	k.inReady = false
	j := k.queue[0]
	kind := runJob
	switch {
	case j.Seq == 0 && j.Parked == 0:
		kind = releaseJob
	case k.blocked && j.Seq > 0:
		kind = parkJob
	}
	if j.Deferred {
		d.setDeferred(d.deferred - 1)
	}
	k.running = true
	d.busy++
	d.h.Stats.Busy.Store(int64(d.busy))
	return task[E]{kind: kind, job: j, restoring: j.Deferred}, true
}

// nextReady returns the next key to dispatch, nil if none: a key waiting to restore when there
// is room for a full event, else the ready FIFO's first key that can run now (keys whose head
// needs room that is not there are set aside in restoreWait).
func (d *dispatcher[E]) nextReady() *keyState[E] {
	if len(d.restoreWait) > 0 && d.full() < d.o.MaxInFlight {
		return popFront(&d.restoreWait)
	}
	for len(d.ready) > 0 {
		k := popFront(&d.ready)
		if k.queue[0].Deferred && d.full() >= d.o.MaxInFlight {
			d.restoreWait = append(d.restoreWait, k)
			continue
		}
		return k
	}
	return nil
}

func popFront[T any](q *[]*T) *T {
	x := (*q)[0]
	(*q)[0] = nil
	*q = (*q)[1:]
	return x
}

// apply takes a worker's result; it returns the failure that stops the run, if any (ignored
// when the run is stopping already).
func (d *dispatcher[E]) apply(r result[E]) error {
	j := r.task.job
	k := d.keys[j.Key]
	k.running = false
	if r.task.restoring {
		if j.Deferred { // not restored: deferred again
			d.setDeferred(d.deferred + 1)
		} else {
			k.deferred--
		}
	}
	switch r.outcome {
	case retryIt, unrestored:
		k.backoff = true
		if d.stopping { // no retries after the stop: the key stays held, the event unfinished
			break
		}
		n := j.restoreFails
		if r.outcome == retryIt {
			n = j.Attempts
			d.h.Stats.Retries.Add(1)
		}
		heap.Push(&d.backoffs, backoffEntry[E]{at: time.Now().Add(d.o.Delay(n)), key: k})
	case failed:
		return &Failure[E]{Key: j.Key, Ev: j.Ev, Attempts: j.Attempts, Err: j.LastErr}
	case finished:
		d.finish(k)
	case blockKey:
		d.finish(k)
		d.block(k)
	case loaded:
		d.pop(k)
		k.releasing, k.blocked = false, false
		var jobs []*Job[E]
		for _, p := range r.reruns {
			if !d.reruns[p.ID] {
				d.reruns[p.ID] = true
				jobs = append(jobs, &Job[E]{Ev: p.Ev, Key: k.name, Parked: p.ID, Blocking: p.Blocking})
			}
		}
		k.queue = append(jobs, k.queue...)
	case abandoned:
	}
	d.makeReady(k)
	d.dropIdle(k)
	return nil
}

// finish ends the head job of k: a delivery joins the mark, a rerun leaves the rerun set.
func (d *dispatcher[E]) finish(k *keyState[E]) {
	j := d.pop(k)
	if j.Parked > 0 {
		delete(d.reruns, j.Parked)
		return
	}
	d.inFlight--
	d.h.Stats.InFlight.Store(int64(d.inFlight))
	if last, advanced := d.mark.Finish(j.Seq); advanced {
		d.h.Advance(last)
	}
}

func (d *dispatcher[E]) pop(k *keyState[E]) *Job[E] {
	j := k.queue[0]
	k.queue[0] = nil
	k.queue = k.queue[1:]
	return j
}

// block blocks k and drops its queued reruns (they stay parked, and run on the next release).
func (d *dispatcher[E]) block(k *keyState[E]) {
	k.blocked, k.blockEpoch = true, d.epoch
	kept := k.queue[:0]
	for _, j := range k.queue {
		if j.Parked > 0 {
			delete(d.reruns, j.Parked)
			continue
		}
		kept = append(kept, j)
	}
	clear(k.queue[len(kept):])
	k.queue = kept
}

// dropIdle forgets a key with nothing queued and nothing holding it, so memory follows the keys
// with work, not every key ever seen.
func (d *dispatcher[E]) dropIdle(k *keyState[E]) {
	if len(k.queue) == 0 && !k.running && !k.backoff && !k.blocked && !k.releasing {
		delete(d.keys, k.name)
	}
}

// endBackoffs makes the keys whose backoff ended ready again.
func (d *dispatcher[E]) endBackoffs() {
	now := time.Now()
	for len(d.backoffs) > 0 && !d.backoffs[0].at.After(now) {
		k := heap.Pop(&d.backoffs).(backoffEntry[E]).key
		k.backoff = false
		d.makeReady(k)
	}
}

// applyPoll queues released parked events and unblocks keys an operator dropped.
func (d *dispatcher[E]) applyPoll(p pollResult[E]) {
	for _, r := range p.released {
		k := d.key(r.Key)
		switch {
		case d.reruns[r.ID] || k.releasing:
		case r.Blocking: // release the key: load all its parked events first
			k.releasing = true
			at := 0
			if k.running || k.backoff { // the head is taken: the release goes right after it
				at = 1
			}
			k.queue = slices.Insert(k.queue, at, &Job[E]{Key: k.name})
			d.makeReady(k)
		case k.blocked: // runs with the key's release
		default:
			d.reruns[r.ID] = true
			d.enqueue(k, &Job[E]{Ev: r.Ev, Key: k.name, Parked: r.ID})
		}
		d.dropIdle(k)
	}
	still := make(map[string]bool, len(p.blocked))
	for _, name := range p.blocked {
		still[name] = true
	}
	for _, k := range d.keys {
		// A key blocked since the poll was asked for may not be in its answer yet.
		if k.blocked && !k.releasing && k.blockEpoch < p.epoch && !still[k.name] {
			k.blocked = false
			d.dropIdle(k)
		}
	}
}

// pollLoop is the poller goroutine: it looks at the store when the dispatcher asks.
func (d *dispatcher[E]) pollLoop(ctx context.Context) {
	failures := 0 // polls failed in a row
	defer func() { d.h.storeRecovered(failures) }()
	for {
		var epoch uint64
		select {
		case <-ctx.Done():
			return
		case epoch = <-d.polls:
		}
		p := pollResult[E]{epoch: epoch}
		var err error
		_, owns := d.h.Owner() // a standby, or an owner no more, looks at nothing
		if owns {
			if p.released, err = d.h.Store.Released(ctx, d.o.MaxInFlight); err == nil {
				p.blocked, err = d.h.Store.BlockedKeys(ctx)
			}
		}
		if err != nil || !owns { // the next tick looks again; epoch 0 unblocks nothing
			p = pollResult[E]{}
			failures++
			d.h.storeFailed(err, failures)
		} else {
			d.h.storeRecovered(failures)
			failures = 0
		}
		d.polled <- p // never blocks: one poll at a time, and its answer is taken before the next
	}
}

type backoffEntry[E any] struct {
	at  time.Time
	key *keyState[E]
}

// backoffHeap is a min-heap of keys waiting for a retry, by time.
type backoffHeap[E any] []backoffEntry[E]

func (h backoffHeap[E]) Len() int           { return len(h) }
func (h backoffHeap[E]) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h backoffHeap[E]) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *backoffHeap[E]) Push(x any)        { *h = append(*h, x.(backoffEntry[E])) }
func (h *backoffHeap[E]) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
