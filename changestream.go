package pgchangestream

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgchangestream/pgchangestream/internal/pending"
)

// Retry timing, and how many read ids are remembered to tell late rows from rows already read.
const (
	readRetryMin   = 50 * time.Millisecond
	readRetryMax   = 5 * time.Second
	loadRetryMin   = 100 * time.Millisecond
	loadRetryMax   = 10 * time.Second
	recentCapacity = 16384
)

// Stats are counters of a [Watcher], for metrics and tests.
type Stats struct {
	Delivered, Filtered, Acked, Evicted uint64
	// Pending is the number of deliveries tracked until acknowledged.
	Pending int
	// FloorActive is true while evicted deliveries hold the checkpoint back.
	FloorActive                        bool
	CheckpointWrites, CheckpointErrors uint64
	// Checkpoint is the position last saved (or loaded).
	Checkpoint Position
	// Cursor is the newest position read.
	Cursor Position
	// LoadErrors and ReadErrors count failed loads of the start position and failed changelog
	// reads; LastError is the last failure of any operation, at LastErrorAt.
	LoadErrors, ReadErrors uint64
	LastError              error
	LastErrorAt            time.Time
	// ListenUp is true while the LISTEN connection is connected.
	ListenUp bool
	// Lag is the age of the oldest row not yet acknowledged or not yet read, from its
	// changed_at; 0 when caught up (see [Watcher.LagState]).
	Lag time.Duration
	// Active is false while an exclusive watcher waits as a standby (see [Config.Exclusive]).
	Active bool
}

// Watcher streams the rows of one table's changelog as events. Create it with [New], then call
// [Watcher.Start]; read [Watcher.Events]; acknowledge with [Watcher.MarkProcessed]; stop with
// [Watcher.Close].
type Watcher struct {
	cfg    Config              // immutable after New
	cfgErr error               // immutable; set only by NewPostgreSQLChangeStreamWatcher
	log    *slog.Logger        // immutable
	q      queries             // immutable
	listen *pgconn.Config      // immutable; nil when not listening
	events chan EventWithToken // sent on and closed by the reader goroutine only (or by Close before Start)
	wake   chan struct{}       // capacity 1; listener → reader: read now
	ready  chan struct{}       // closed by the listener after its first connect attempt
	primed signal              // fired after the first read, or when stopping before (see Ready)
	wg     sync.WaitGroup      // reader, listener, saver and prefetch goroutines
	health health              // failures and their counters; safe for concurrent use
	excl   exclusive           // the exclusive lock; see exclusive.go

	// Lifecycle, guarded by lifeMu.
	lifeMu  sync.Mutex
	started bool
	closed  bool
	cancel  context.CancelFunc // cancels the goroutines' context
	stopErr error              // why the reader stopped, when not because of Close

	// skipFree is set by the load when the changelog has the txid column: reads follow snapshot
	// deltas and NOTIFY only wakes the reader. Written once by the reader goroutine before its
	// first read, read by the listener.
	skipFree atomic.Bool

	// Delivery state, guarded by mu. Nothing slow happens while mu is held.
	mu             sync.Mutex
	loaded         bool // cursor holds the loaded position; checkpoints may be computed
	cursor         Position
	seq            uint64
	ring           *pending.Ring[Position]
	filtered       uint64
	acked          uint64
	evicted        uint64
	savedMirror    Position // copy of saved for Stats
	lastEmptyBatch time.Time
	lastEventRead  time.Time

	// The processed-flag marker (marker.go): its own lock, and its goroutine.
	mark marker

	// Checkpoint state, guarded by ckMu, which serializes compute-and-save.
	ckMu     sync.Mutex
	saved    Position
	hasSaved bool

	// The last background save failure, returned once, guarded by errMu: not ckMu, so that an
	// acknowledgement in batched mode never waits for a save it did not ask for.
	errMu sync.Mutex
	bgErr error

	// Hints from NOTIFY payloads, guarded by hintMu (listener appends, reader takes).
	hintMu    sync.Mutex
	hints     []int64
	hintsLost bool

	// Counters, atomic: added by their writers, read by Stats from any goroutine.
	delivered atomic.Uint64 // added by the reader after each completed send
	ckWrites  atomic.Uint64 // added under ckMu (and by load) after each successful save
	ckErrors  atomic.Uint64 // added under ckMu after each failed save

	// Reader goroutine only.
	recent      *recentIDs
	batch       []changelogRow // the rows being delivered
	spare       []changelogRow // the other buffer; owned by the prefetch while one runs
	next        *nextBatch     // the prefetch of the next batch, if one was started
	floorNoted  bool
	legacyNoted bool // the legacy changelog was reported (by the load, which the reader runs)
}

// New validates cfg, fills its defaults and returns a watcher. It does not touch the database.
func New(cfg Config) (*Watcher, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	w := newWatcher(cfg)
	if cfg.ConnString != "" && cfg.Mode != ModePolling {
		pc, err := pgconn.ParseConfig(cfg.ConnString)
		if err != nil {
			return nil, fmt.Errorf("%w: Config.ConnString: %v", ErrInvalidConfig, err)
		}
		w.setListenConfig(pc)
	} else if cfg.Mode == ModeHybrid {
		w.log.Warn("hybrid mode without Config.ConnString: polling only")
	}
	return w, nil
}

// NewPostgreSQLChangeStreamWatcher is the constructor of the watcher this package replaces, with
// its defaults (10ms polls, 100-event buffer) and its documents (for the table health_events,
// fullDocument is the row's "document" object; see [Config.DocumentField]); an unknown mode
// falls back to polling. Invalid arguments do not panic: the watcher reports them through
// [Watcher.Err] and MarkProcessed, and its Events channel closes at Start.
func NewPostgreSQLChangeStreamWatcher(db *sql.DB, clientName, tableName, connString string, mode Mode) *Watcher {
	switch mode {
	case ModePolling, ModeNotify, ModeHybrid:
	default:
		slog.Warn("pgchangestream: unknown mode, using polling", "mode", mode, "client", clientName)
		mode = ModePolling
	}
	w, err := New(Config{DB: db, ClientName: clientName, TableName: tableName, ConnString: connString, Mode: mode,
		DocumentField: legacyDocumentField(tableName)})
	if err != nil {
		w = newWatcher(Config{ClientName: clientName, TableName: tableName, Mode: mode}.withDefaults())
		w.cfgErr = err
	}
	return w
}

func newWatcher(cfg Config) *Watcher {
	return &Watcher{
		cfg:    cfg,
		log:    cfg.Logger.With("client", cfg.ClientName, "table", cfg.TableName),
		q:      buildQueries(cfg),
		events: make(chan EventWithToken, cfg.BufferSize),
		wake:   make(chan struct{}, 1),
		ready:  make(chan struct{}),
		mark:   marker{wake: make(chan struct{}, 1)},
		ring:   pending.New(cfg.MaxPending, Position.predecessor),
		recent: newRecentIDs(recentCapacity),
		batch:  make([]changelogRow, 0, cfg.BatchSize),
		spare:  make([]changelogRow, 0, cfg.BatchSize),
		health: health{listenCritical: cfg.Mode == ModeNotify},
	}
}

// Events returns the channel of deliveries. It is closed when the watcher stops: after Close, or
// when Start's context ends ([Watcher.Err] says why).
func (w *Watcher) Events() <-chan EventWithToken { return w.events }

// Start loads the saved token and starts the reader (and, in notify and hybrid modes, the LISTEN
// connection) in the background. Cancelling ctx stops the watcher as Close does, but without the
// final checkpoint save. Calling Start again, or after Close, does nothing.
func (w *Watcher) Start(ctx context.Context) {
	if !w.start(ctx) {
		w.log.Warn("Start called twice, or after Close: ignored")
	}
}

// start launches the goroutines under lifeMu; it reports false if the watcher was already
// started or closed.
func (w *Watcher) start(ctx context.Context) bool {
	w.lifeMu.Lock()
	defer w.lifeMu.Unlock()
	if w.started || w.closed {
		return false
	}
	w.started = true
	if w.cfgErr != nil {
		w.stopErr = w.cfgErr
		close(w.events)
		w.primed.fire()
		return true
	}
	ctx, w.cancel = context.WithCancel(ctx)
	w.wg.Add(2)
	go w.run(ctx)
	go w.saveLoop(ctx)
	if !w.cfg.DisableProcessedFlag {
		w.wg.Add(1)
		w.mark.running.Store(true)
		go w.markLoop(ctx)
	}
	if w.listen != nil {
		w.wg.Add(1)
		go w.listenLoop(ctx)
	} else {
		close(w.ready)
	}
	return true
}

// Close stops reading, waits for the watcher's goroutines (bounded by ctx), closes the LISTEN
// connection and the Events channel, then saves the checkpoint if it changed. Deliveries that
// were not acknowledged stay pending, so the saved token never passes them. Calling Close again
// returns nil. MarkProcessed and Flush keep working after Close.
func (w *Watcher) Close(ctx context.Context) error {
	w.lifeMu.Lock()
	if w.closed {
		w.lifeMu.Unlock()
		return nil
	}
	w.closed = true
	started, cancel := w.started, w.cancel
	w.lifeMu.Unlock()
	defer w.excl.release() // Config.Exclusive: a standby takes over after the final save
	if !started {
		close(w.events)
		w.primed.fire()
		return nil
	}
	if cancel == nil { // configuration error: nothing runs
		return nil
	}
	cancel()
	done := make(chan struct{})
	go func() {
		w.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("pgchangestream: close: waiting for goroutines: %w", ctx.Err())
	}
	if err := w.holdUnhandledLateRows(ctx); err != nil {
		return fmt.Errorf("pgchangestream: close: %w", err)
	}
	if err := w.Flush(ctx); err != nil {
		return err
	}
	if err := w.markSaved(ctx); err != nil { // what the marker had not got to
		w.log.Warn("cannot set the processed flag at Close; it lags the saved token", "error", err)
	}
	return nil
}

// Err reports why Events was closed: nil while running and after Close, the context's error when
// Start's context ended, or a configuration error.
func (w *Watcher) Err() error {
	w.lifeMu.Lock()
	defer w.lifeMu.Unlock()
	switch {
	case w.cfgErr != nil:
		return w.cfgErr
	case w.closed:
		return nil
	}
	return w.stopErr
}

// Stats returns the watcher's counters.
func (w *Watcher) Stats() Stats {
	caughtUp := w.health.isCaughtUp()
	w.mu.Lock()
	defer w.mu.Unlock()
	s := Stats{
		Delivered:        w.delivered.Load(),
		Filtered:         w.filtered,
		Acked:            w.acked,
		Evicted:          w.evicted,
		Pending:          w.ring.Len(),
		FloorActive:      w.ring.HasFloor(),
		CheckpointWrites: w.ckWrites.Load(),
		CheckpointErrors: w.ckErrors.Load(),
		Checkpoint:       w.savedMirror,
		Cursor:           w.cursor,
		Lag:              w.lagLocked(time.Now(), caughtUp),
		Active:           w.excl.isActive(),
	}
	w.health.fill(&s)
	return s
}

// LagState returns when a read last found nothing new, and the changed_at of the newest row
// read. Zero times mean "not yet". [Stats].Lag is the lag itself: the age of the oldest row not
// yet acknowledged or read, measured from its changed_at (the start of the transaction that
// wrote it), 0 when caught up.
func (w *Watcher) LagState() (lastEmptyBatch, lastEventRead time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastEmptyBatch, w.lastEventRead
}

// run is the reader goroutine: the only sender on events, which it closes when it exits.
func (w *Watcher) run(ctx context.Context) {
	defer w.wg.Done()
	defer close(w.events)
	defer w.primed.fire() // stopped before the first read
	defer func() {
		w.lifeMu.Lock()
		if w.stopErr == nil {
			w.stopErr = context.Cause(ctx)
		}
		w.lifeMu.Unlock()
	}()
	if !w.becomeActive(ctx) { // Config.Exclusive: wait as a standby for the lock
		return
	}
	if err := w.loadWithRetry(ctx); err != nil {
		if ctx.Err() == nil {
			w.lifeMu.Lock()
			w.stopErr = err
			w.lifeMu.Unlock()
		}
		return
	}
	w.checkTableName(ctx)
	select { // LISTEN before the first read, so nothing committed in between goes unnoticed
	case <-w.ready:
	case <-ctx.Done():
		return
	}
	retry := backoff{min: readRetryMin, max: readRetryMax}
	for {
		full, err := w.readOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			w.primed.fire()
		}
		var wait time.Duration
		switch {
		case err != nil:
			w.health.fail(opRead, err)
			wait = retry.next()
			w.log.Warn("changelog read failed; retrying from the same position", "error", err, "retry_in", wait)
		case full:
			w.health.readOK(true)
			retry.reset()
			continue
		default:
			w.health.readOK(false)
			retry.reset()
			wait = w.pollWait()
		}
		if !w.sleep(ctx, wait) {
			return
		}
	}
}

// readOnce reads one batch after the cursor and delivers it. On a legacy changelog, when the
// read reached the end of the visible rows, it then recovers late rows named by NOTIFY. full
// reports a full batch.
func (w *Watcher) readOnce(ctx context.Context) (full bool, err error) {
	if w.skipFree.Load() {
		n, err := w.readBatch(ctx)
		return err == nil && n == w.cfg.BatchSize, err
	}
	hints := w.takeHints()
	n, err := w.readBatch(ctx)
	if err != nil || n == w.cfg.BatchSize {
		w.returnHints(hints)
		return err == nil, err
	}
	for i, id := range hints {
		if err := w.recoverLateRow(ctx, id); err != nil {
			w.returnHints(hints[i:])
			return false, err
		}
	}
	return false, nil
}

// pollWait is how long to wait for a NOTIFY after a short read; 0 means no timer.
func (w *Watcher) pollWait() time.Duration {
	switch {
	case w.listen == nil:
		return w.cfg.PollInterval
	case w.cfg.Mode == ModeHybrid:
		return jitter(w.cfg.FallbackPollInterval)
	default:
		return 0
	}
}

// sleep waits for d (forever when d is 0), a wake-up or the end of ctx. It returns false when
// ctx ended.
func (w *Watcher) sleep(ctx context.Context, d time.Duration) bool {
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-w.wake:
	case <-timeout:
	}
	return true
}

// readBatch reads the rows after the cursor and delivers them in order. After a full batch it
// starts reading the next one before delivering this one, so the query and the decoding of
// events overlap; the prefetched batch is used only if the cursor ends exactly where it starts.
// On an upgraded changelog a read at the start of a delta first takes the delta's end snapshot,
// and a short batch ends the delta (or the legacy part of a switch-over).
func (w *Watcher) readBatch(ctx context.Context) (int, error) {
	w.mu.Lock()
	from := w.cursor
	w.mu.Unlock()
	if from.atDeltaStart() {
		var (
			end pgSnapshot
			err error
		)
		if end, err = w.currentSnapshot(ctx); err != nil {
			return 0, fmt.Errorf("read changelog: take snapshot: %w", err)
		}
		if emptyDelta(from.span.base, end) {
			w.noteEmptyRead()
			return 0, nil
		}
		from = from.withEnd(end)
	}
	fresh := true
	if p := w.next; p != nil {
		w.next = nil
		<-p.done
		if p.err == nil && p.from.Compare(from) == 0 {
			w.batch, w.spare, fresh = p.rows, w.batch, false
		} else {
			w.spare = p.rows
		}
	}
	if fresh {
		var err error
		if w.batch, err = w.readPage(ctx, from, w.batch[:0]); err != nil {
			return 0, fmt.Errorf("read changelog: %w", err)
		}
	}
	n := len(w.batch)
	if n == 0 {
		w.noteEmptyRead()
	}
	if n == w.cfg.BatchSize {
		w.next = w.prefetch(ctx, rowPosition(from, &w.batch[n-1]))
	}
	for i := range w.batch {
		row := &w.batch[i]
		if err := w.deliver(ctx, row, rowPosition(from, row), false); err != nil {
			return i, err
		}
	}
	if n < w.cfg.BatchSize && from.span != nil {
		w.endSpan(from)
	}
	return n, nil
}

// noteEmptyRead records that a read found nothing new.
func (w *Watcher) noteEmptyRead() {
	w.mu.Lock()
	w.lastEmptyBatch = time.Now()
	w.mu.Unlock()
}

// nextBatch is a read of the next batch running while the current one is delivered.
type nextBatch struct {
	from Position
	done chan struct{} // closed when rows and err are set
	rows []changelogRow
	err  error
}

// prefetch starts reading the batch after from into the spare buffer.
func (w *Watcher) prefetch(ctx context.Context, from Position) *nextBatch {
	p := &nextBatch{from: from, done: make(chan struct{})}
	buf := w.spare[:0]
	w.spare = nil // owned by the prefetch until it is done
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer close(p.done)
		p.rows, p.err = w.readPage(ctx, from, buf)
	}()
	return p
}

// query runs a changelog query and reads its rows into buf; withXid reads the txid column that
// delta reads add.
func (w *Watcher) query(ctx context.Context, q string, buf []changelogRow, withXid bool, args ...any) ([]changelogRow, error) {
	rows, err := w.cfg.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return buf, err
	}
	return scanRows(rows, buf, withXid)
}

// deliver is the one path every row takes: filter, then (one locked step) register the delivery
// as pending and advance the cursor, then send. A send abandoned because ctx ended stays pending.
// A late row can sit behind the token already saved (saved while its transaction was still
// open): the token is then saved again, backward, before the send, so that a crash replays it.
func (w *Watcher) deliver(ctx context.Context, row *changelogRow, pos Position, late bool) error {
	ev, pending, behindSaved := w.register(row, pos, late)
	if !pending {
		return nil
	}
	if behindSaved {
		if err := w.saveInBackground(ctx, false); err != nil {
			w.log.Warn("cannot move the saved token back behind a late row; the next save retries", "id", row.ID, "error", err)
		}
	}
	select {
	case w.events <- EventWithToken{Event: ev, ResumeToken: formatToken(row.ID)}:
		w.delivered.Add(1)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// register builds the row's event and runs the filter, then, in one locked step, records the
// delivery at pos as pending and advances the cursor (a filtered row only advances the cursor).
// pending is false for a filtered row; behindSaved reports a late row that sits behind the
// token already saved.
func (w *Watcher) register(row *changelogRow, pos Position, late bool) (ev Event, pending, behindSaved bool) {
	ev, err := w.event(row)
	if err != nil { // the event still has its id, operation, time and key: deliver it, don't stall
		w.log.Error("cannot decode changelog row; delivering it without documents", "id", row.ID, "error", err)
	}
	if pos.span == nil {
		w.recent.add(row.ID)
	}
	if w.cfg.Filter != nil && !w.cfg.Filter(ev) {
		w.mu.Lock()
		w.advanceLocked(pos)
		w.filtered++
		w.mu.Unlock()
		return ev, false, false
	}
	w.mu.Lock()
	w.seq++
	evicted := w.ring.Push(w.seq, row.ID, pos)
	if evicted {
		w.evicted++
	}
	w.advanceLocked(pos)
	behindSaved = late && pos.predecessor().Before(w.savedMirror)
	w.mu.Unlock()
	if evicted && !w.floorNoted {
		w.floorNoted = true
		w.log.Warn("more unacknowledged deliveries than Config.MaxPending; the oldest now hold the checkpoint through a floor",
			"max_pending", w.cfg.MaxPending)
	}
	return ev, true, behindSaved
}

// advanceLocked moves the cursor forward to pos (never back). mu must be held.
func (w *Watcher) advanceLocked(pos Position) {
	if w.cursor.Before(pos) {
		w.cursor = pos
	}
	if pos.ChangedAt.After(w.lastEventRead) {
		w.lastEventRead = pos.ChangedAt
	}
}
