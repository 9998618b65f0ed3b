package pgchangestreamtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/internal/document"
	"github.com/pgchangestream/pgchangestream/internal/pending"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/internal/procface"
	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

// FakeWatcher is an in-memory [pgchangestream.ChangeStreamWatcher] and
// [pgchangestream.ChangeStreamMetrics] for unit tests of consumers. It keeps the watcher's
// delivery contract with the watcher's own pending ring and positions: acknowledgements are
// cumulative in delivery order, empty and unknown tokens certify nothing, a malformed token is
// an error wrapping [pgchangestream.ErrInvalidToken], a send abandoned by Close stays pending,
// at most MaxPending deliveries are tracked (older ones hold the checkpoint through a floor),
// Close is idempotent and closes Events once, and MarkProcessed works after Close.
//
// A test pushes changes ([FakeWatcher.Push]); once started, the fake delivers them in order, as
// a new client reading the changelog from its beginning. The checkpoint is "saved" in memory:
// [FakeWatcher.Saved] is what the watcher would have written, [FakeWatcher.Acked] the
// deliveries the acknowledgements certified. Filtered progress is saved by MarkProcessed and
// Close only (the watcher also saves it when idle).
//
// [FakeWatcher.MarkProcessedTx] acknowledges in a transaction (a sqlmock or real *sql.Tx) and
// takes effect when the test says the transaction committed: [FakeWatcher.Committed],
// [FakeWatcher.RolledBack] and [FakeWatcher.OpenTxs].
//
// [FakeWatcher.Process] runs the watcher's Process engine on the fake's events, with an
// in-memory dead-letter table ([FakeWatcher.Parked]).
type FakeWatcher struct {
	cfg    pgchangestream.Config // the defaults the kit reads filled; immutable
	events chan pgchangestream.EventWithToken
	wake   chan struct{} // capacity 1: there is something for the sender to do
	done   chan struct{} // closed when the sender goroutine exits

	// Process's logger (immutable), counters and dead-letter table (each safe for concurrent
	// use); processing is set while a Process runs (compare-and-swap by Process).
	log        *slog.Logger
	procStats  procrun.Stats
	parked     *parkedTable
	processing atomic.Bool

	// Guarded by mu, like the watcher's delivery and checkpoint state. Nothing slow happens
	// while it is held.
	mu        sync.Mutex
	ids       ids
	queue     []Change                  // pushed, not read yet
	changelog []pgchangestream.Position // every change pushed
	started   bool
	closed    bool
	drain     bool // close once the queue is delivered
	cancel    context.CancelFunc
	ring      *pending.Ring[pgchangestream.Position]
	cursor    pgchangestream.Position
	seq       uint64
	tokens    []string // the token of each delivery, by seq-1
	certified int      // tokens[:certified] are acknowledged
	marks     []string
	stats     pgchangestream.Stats
	saved     pgchangestream.Position
	hasSaved  bool
	processed pgchangestream.Position // the highest position saved: the processed flag's reach
	saveErr   error
	txAcks    []txAck // MarkProcessedTx acknowledgements whose transaction has not ended, in call order
	savedSeq  uint64  // the seq of the last delivery the saved checkpoint acknowledges
}

var (
	_ pgchangestream.ChangeStreamWatcher = (*FakeWatcher)(nil)
	_ pgchangestream.ChangeStreamMetrics = (*FakeWatcher)(nil)
)

// NewFakeWatcher returns a fake watcher. Of cfg it uses TableName (the events' ns.coll),
// DocumentField, Filter, BufferSize and MaxPending, with the watcher's defaults.
func NewFakeWatcher(cfg pgchangestream.Config) *FakeWatcher {
	cfg = cfg.WithDefaults()
	return &FakeWatcher{
		cfg:    cfg,
		events: make(chan pgchangestream.EventWithToken, cfg.BufferSize),
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
		ring:   pending.New(cfg.MaxPending, pgchangestream.Position.Predecessor),
		log:    cfg.Logger.With("client", cfg.ClientName, "table", cfg.TableName),
		parked: &parkedTable{},
	}
}

// Push appends changes to the changelog. Changes without an ID get the next one, changes
// without a time [DefaultChangedAt]. A started fake delivers them in order; changes pushed
// after Close are never delivered.
func (f *FakeWatcher) Push(changes ...Change) {
	f.mu.Lock()
	for _, c := range changes {
		c = f.ids.fill(c)
		f.queue = append(f.queue, c)
		f.changelog = append(f.changelog, c.position())
	}
	f.mu.Unlock()
	f.poke()
}

// CloseWhenDelivered makes the fake close, as Close does, once every change pushed so far has
// been sent on Events. A consumer that ranges over Events then returns after handling them all,
// so a test can run it without a goroutine.
func (f *FakeWatcher) CloseWhenDelivered() {
	f.mu.Lock()
	f.drain = true
	f.mu.Unlock()
	f.poke()
}

// poke wakes the sender.
func (f *FakeWatcher) poke() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// FailSaves makes every later checkpoint save fail with err (wrapped), as a database error
// does; nil makes saves succeed again. Acknowledgements are kept, so the next successful save
// includes them.
func (f *FakeWatcher) FailSaves(err error) {
	f.mu.Lock()
	f.saveErr = err
	f.mu.Unlock()
}

// Events returns the channel of deliveries. It is closed when the fake stops.
func (f *FakeWatcher) Events() <-chan pgchangestream.EventWithToken { return f.events }

// Start starts delivering. Cancelling ctx stops the fake as Close does, without the final
// save. Calling Start again, or after Close, does nothing.
func (f *FakeWatcher) Start(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.started || f.closed {
		return
	}
	f.started = true
	f.hasSaved = true // a new client saves its start position, the beginning
	ctx, f.cancel = context.WithCancel(ctx)
	go f.run(ctx)
}

// run is the sender: the only goroutine that sends on events, which it closes when it exits.
func (f *FakeWatcher) run(ctx context.Context) {
	defer close(f.done)
	defer close(f.events)
	for {
		c, ok := f.next(ctx)
		if !ok {
			return
		}
		ev, tracked := f.register(c)
		if !tracked {
			continue
		}
		select {
		case f.events <- ev:
			f.mu.Lock()
			f.stats.Delivered++
			f.mu.Unlock()
		case <-ctx.Done(): // an abandoned send: the delivery stays pending
			return
		}
	}
}

// next waits for the next change to deliver. ok is false when ctx ended, or when everything was
// delivered after CloseWhenDelivered: the fake is then closed and its checkpoint saved.
func (f *FakeWatcher) next(ctx context.Context) (c Change, ok bool) {
	for {
		f.mu.Lock()
		if len(f.queue) > 0 {
			c, f.queue = f.queue[0], f.queue[1:]
			f.mu.Unlock()
			return c, true
		}
		if f.drain && !f.closed {
			f.closed = true
			_ = f.saveLocked() // a failure is counted in Stats, and the next MarkProcessed retries
			f.mu.Unlock()
			return Change{}, false
		}
		f.mu.Unlock()
		select {
		case <-f.wake:
		case <-ctx.Done():
			return Change{}, false
		}
	}
}

// register builds the change's event and runs the filter, then, in one locked step, records
// the delivery as pending and advances the cursor (a filtered change only advances the cursor).
func (f *FakeWatcher) register(c Change) (ev pgchangestream.EventWithToken, tracked bool) {
	doc, _, _ := document.Build(c.row(), f.cfg.TableName, document.Options{Field: f.cfg.DocumentField}) // a bad document is delivered without it, as the watcher does
	event := pgchangestream.Event(doc)
	keep := f.cfg.Filter == nil || f.cfg.Filter(event)
	pos := c.position()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cursor.Before(pos) {
		f.cursor = pos
	}
	if !keep {
		f.stats.Filtered++
		return ev, false
	}
	f.seq++
	if f.ring.Push(f.seq, c.ID, pos) {
		f.stats.Evicted++
	}
	token := strconv.FormatInt(c.ID, 10)
	f.tokens = append(f.tokens, token)
	return pgchangestream.EventWithToken{Event: event, ResumeToken: []byte(token)}, true
}

// MarkProcessed acknowledges the earliest pending delivery with this token and every delivery
// before it, then saves the checkpoint if it changed, as [pgchangestream.Watcher.MarkProcessed]
// does.
func (f *FakeWatcher) MarkProcessed(_ context.Context, token []byte) error {
	id, ok, tokenErr := position.ParseToken(token)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.marks = append(f.marks, string(token))
	if ok {
		f.ackLocked(id)
	}
	return errors.Join(tokenErr, f.saveLocked())
}

// ackLocked acknowledges the earliest pending delivery of id and every delivery before it. mu
// must be held.
func (f *FakeWatcher) ackLocked(id int64) {
	before := f.ring.Len()
	if n := f.ring.Ack(id); n > 0 {
		f.stats.Acked += uint64(n)
		// The tracked deliveries are the newest ones: the acknowledged one is number
		// seq-before+n, and every delivery before it is certified too.
		f.certified = int(f.seq) - before + n
	}
}

// saveLocked saves min(cursor, floor, predecessor of every pending delivery) if it differs from
// the last position saved. mu must be held.
func (f *FakeWatcher) saveLocked() error {
	if !f.started {
		return nil
	}
	p := f.checkpointLocked()
	if f.hasSaved && p.Compare(f.saved) == 0 {
		return nil
	}
	if f.saveErr != nil {
		f.stats.CheckpointErrors++
		return fmt.Errorf("pgchangestreamtest: save checkpoint %s: %w", p, f.saveErr)
	}
	f.stats.CheckpointWrites++
	f.storeLocked(p, f.ring.AckedSeq())
	return nil
}

// checkpointLocked returns min(cursor, floor, predecessor of every pending delivery). mu must
// be held.
func (f *FakeWatcher) checkpointLocked() pgchangestream.Position {
	p := f.cursor
	if m, ok := f.ring.MinPredecessor(); ok && m.Before(p) {
		p = m
	}
	return p
}

// storeLocked records p as the saved checkpoint, acknowledging the deliveries up to seq. mu
// must be held.
func (f *FakeWatcher) storeLocked(p pgchangestream.Position, seq uint64) {
	f.saved, f.hasSaved, f.savedSeq = p, true, seq
	if f.processed.Before(p) {
		f.processed = p
	}
}

// Close stops delivering, closes Events, then saves the checkpoint if it changed. Deliveries
// not acknowledged, including a send Close abandoned, stay pending, so the saved position never
// passes them. Calling Close again returns nil; MarkProcessed keeps working after Close.
func (f *FakeWatcher) Close(ctx context.Context) error {
	f.mu.Lock()
	closed, started, cancel := f.closed, f.started, f.cancel
	f.closed = true
	f.mu.Unlock()
	switch {
	case !started && !closed:
		close(f.events)
		return nil
	case !started:
		return nil
	}
	cancel()
	select {
	case <-f.done:
	case <-ctx.Done():
		return fmt.Errorf("pgchangestreamtest: close: %w", ctx.Err())
	}
	if closed {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.saveLocked()
}

// GetUnprocessedEventCount counts the changes pushed with an id above lastProcessedID (the
// cursor's id when empty), as the watcher does: with [pgchangestream.Config.ProcessedFlag],
// those that no saved checkpoint has certified (marked processed); without it, all of them.
func (f *FakeWatcher) GetUnprocessedEventCount(_ context.Context, lastProcessedID string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	after := f.cursor.ID
	if lastProcessedID != "" {
		id, _, err := position.ParseToken([]byte(lastProcessedID))
		if err != nil {
			return 0, fmt.Errorf("pgchangestreamtest: lastProcessedID: %w", err)
		}
		after = id
	}
	flag := f.cfg.ProcessedFlag && !f.cfg.DisableProcessedFlag
	var n int64
	for _, p := range f.changelog {
		if p.ID > after && (!flag || f.processed.Before(p)) {
			n++
		}
	}
	return n, nil
}

// Acked returns the tokens of the deliveries the acknowledgements certified, in delivery order:
// the delivery each MarkProcessed acknowledged and every delivery before it.
func (f *FakeWatcher) Acked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.tokens[:f.certified]...)
}

// Marks returns the tokens passed to MarkProcessed, in call order, including those that
// certified nothing.
func (f *FakeWatcher) Marks() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.marks...)
}

// Saved returns the checkpoint last saved: the position the watcher would have written to the
// token table (resuming reads the changes after it). With consecutive ids, its ID is the
// token of the last delivery certified. ok is false before Start.
func (f *FakeWatcher) Saved() (p pgchangestream.Position, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.saved, f.hasSaved
}

// Stats returns the fake's counters, as [pgchangestream.Watcher.Stats] does.
func (f *FakeWatcher) Stats() pgchangestream.Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.stats
	st.Pending = f.ring.Len()
	st.FloorActive = f.ring.HasFloor()
	st.Checkpoint = f.saved
	st.Cursor = f.cursor
	st.Process = pgchangestream.ProcessStats(procface.StatsOf(&f.procStats))
	return st
}
