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

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/listen"
	"github.com/pgchangestream/pgchangestream/internal/lock"
	"github.com/pgchangestream/pgchangestream/internal/marker"
	"github.com/pgchangestream/pgchangestream/internal/pending"
	"github.com/pgchangestream/pgchangestream/internal/procface"
	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

// Retry timing, and how many read ids are remembered to tell late rows from rows already read.
const (
	readRetryMin   = 50 * time.Millisecond
	readRetryMax   = 5 * time.Second
	loadRetryMin   = 100 * time.Millisecond
	loadRetryMax   = 10 * time.Second
	recentCapacity = 16384
)

// Watcher streams the rows of one table's changelog as events. Create it with [New], then call
// [Watcher.Start]; read [Watcher.Events]; acknowledge with [Watcher.MarkProcessed]; stop with
// [Watcher.Close].
type Watcher struct {
	cfg     Config               // immutable after New
	cfgErr  error                // immutable; set only by NewPostgreSQLChangeStreamWatcher
	log     *slog.Logger         // immutable
	q       changelog.Statements // immutable
	listen  *listen.Listener     // immutable; nil when not listening (internal/listen)
	events  chan EventWithToken  // sent on and closed by the reader goroutine only (or by Close before Start)
	wake    chan struct{}        // capacity 1; listener → reader: read now
	primed  signal               // fired after the first read, or when stopping before (see Ready)
	wg      sync.WaitGroup       // reader, listener, saver, prefetch and lock goroutines
	health  health               // failures and their counters; safe for concurrent use
	excl    exclusive            // the exclusive lock; see exclusive.go
	elector *lock.Elector        // immutable pointer; nil unless Config.Exclusive (exclusive.go)
	sh      *sharedMember        // immutable pointer; nil unless Config.Shared (shared.go)

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

	// The delivery state under mu (pending.go).
	reader

	// The processed-flag marker (internal/marker; glue in checkpoint.go): its own lock, and its goroutine.
	// Immutable pointer; nil unless the watcher sets the processed flag.
	mark *marker.Marker

	// The save state under ckMu (checkpoint.go).
	saver

	// Hints from NOTIFY payloads (listener adds, reader takes); safe for concurrent use.
	hints listen.Hints

	// Counters, atomic: added by their writers, read by Stats from any goroutine.

	// rewindAsked is set by a save (under ckMu) that found the server recovered since its
	// position was read, and cleared by the reader's rewind (under ckMu).
	rewindAsked atomic.Bool
	rewinds     atomic.Uint64 // added by the reader after each rewind; read by Stats

	// processing is set while a Process runs (compare-and-swap by Process). procStats are its
	// counters, kept across runs: atomics and a lock of their own (internal/procrun), written by
	// the running engine, read by Stats.
	processing atomic.Bool
	procStats  procrun.Stats
	// ownGen grows each time the watcher gains events to own (the exclusive lock taken, a Shared
	// member's ranges loaded), before it delivers any of them: Process loads its held keys again
	// (see ownership). Added to by the reader goroutine; read by Process's dispatcher.
	ownGen atomic.Uint64

	// schemaEvery is the interval of the schema checks (schema_check.go), and schemaChecked,
	// if set, is called after each. Both are set before Start (tests shorten and observe them)
	// and read by the schema check goroutine only.
	schemaEvery   time.Duration
	schemaChecked func()
}

// New validates cfg, fills its defaults and returns a watcher. It does not touch the database.
func New(cfg Config) (*Watcher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg, err := cfg.withPipeline()
	if err != nil {
		return nil, err
	}
	w := newWatcher(cfg)
	if cfg.ConnString != "" && cfg.Mode != ModePolling {
		pc, err := pgconn.ParseConfig(cfg.ConnString)
		if err != nil {
			return nil, fmt.Errorf("%w: Config.ConnString: %v", ErrInvalidConfig, err)
		}
		w.listen = w.newListener(pc)
	} else if cfg.Mode == ModeHybrid {
		w.log.Warn("hybrid mode without Config.ConnString: polling only")
	}
	return w, nil
}

// NewPostgreSQLChangeStreamWatcher is the constructor of the watcher this package replaces, with
// its defaults (10ms polls, 100-event buffer) and its documents (for the table health_events,
// fullDocument is the row's "document" object; see [Config.DocumentField]), its update
// descriptions ([Config.StoreClientCompat]) and its legacy processed flag
// ([Config.ProcessedFlag]), which cleanup_changelog(days) reads; an unknown mode falls back to
// polling. Invalid arguments do not panic: the watcher reports them through
// [Watcher.Err] and MarkProcessed, and its Events channel closes at Start.
func NewPostgreSQLChangeStreamWatcher(db *sql.DB, clientName, tableName, connString string, mode Mode) *Watcher {
	switch mode {
	case ModePolling, ModeNotify, ModeHybrid:
	default:
		slog.Warn("pgchangestream: unknown mode, using polling", "mode", mode, "client", clientName)
		mode = ModePolling
	}
	w, err := New(Config{DB: db, ClientName: clientName, TableName: tableName, ConnString: connString, Mode: mode,
		DocumentField: legacyDocumentField(tableName), ProcessedFlag: true, StoreClientCompat: true})
	if err != nil {
		w = newWatcher(Config{ClientName: clientName, TableName: tableName, Mode: mode}.WithDefaults())
		w.cfgErr = err
	}
	return w
}

// eventsCapacity is the capacity of the Events channel: BufferSize, but none for a Shared member,
// whose sends complete only when the consumer takes the event (see Watcher.send).
func eventsCapacity(cfg Config) int {
	if cfg.Shared {
		return 0
	}
	return cfg.BufferSize
}

func newWatcher(cfg Config) *Watcher {
	w := &Watcher{
		cfg:    cfg,
		log:    cfg.Logger.With("client", cfg.ClientName, "table", cfg.TableName),
		q:      statements(cfg),
		events: make(chan EventWithToken, eventsCapacity(cfg)),
		wake:   make(chan struct{}, 1),
		reader: reader{
			ring:   pending.New(cfg.MaxPending, Position.Predecessor),
			recent: listen.NewRecentIDs(recentCapacity),
			batch:  make([]changelogRow, 0, cfg.BatchSize+1), // a delta's first page reads one more
			spare:  make([]changelogRow, 0, cfg.BatchSize+1),
			pager:  deltaPager{pageSize: cfg.BatchSize, maxIDs: changelog.MaxDeltaIDs},
		},
		health: health{listenCritical: cfg.Mode == ModeNotify},

		schemaEvery: schemaCheckInterval,
	}
	w.reader.cfg, w.reader.q, w.reader.log, w.rq = &w.cfg, &w.q, w.log, &w.q.Reads
	if cfg.marksProcessed() {
		w.mark = w.newMarker()
	}
	w.excl.gone, w.excl.markGone = context.WithCancel(context.Background())
	if cfg.Exclusive {
		w.elector = w.newElector()
	}
	if cfg.Shared {
		w.sh = newSharedMember(cfg)
		w.sh.db, w.sh.client, w.sh.log, w.sh.health, w.sh.excl = cfg.DB, cfg.ClientName, w.log, &w.health, &w.excl
	}
	w.saver = saver{rd: &w.reader, cfg: &w.cfg, q: &w.q, log: w.log, health: &w.health, excl: &w.excl, sh: w.sh,
		mark: w.mark, instance: newInstanceID(), fence: w.stopOwning, recovered: w.askRewind, leaveIfDrained: w.leaveIfDrained,
		loseLock: w.loseLock}
	return w
}

// Events returns the channel of deliveries. It is closed when the watcher stops: after Close, or
// when Start's context ends ([Watcher.Err] says why).
func (w *Watcher) Events() <-chan EventWithToken { return w.events }

// Start loads the saved token and starts the reader (and, in notify and hybrid modes, the LISTEN
// connection) in the background. Cancelling ctx stops the watcher as Close does, but without the
// final checkpoint save; a [Config.Shared] member still renews its lease until a running Process
// returns (or Close), so that the events Process finishes meanwhile are saved under it. Calling
// Start again, or after Close, does nothing.
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
	w.wg.Add(3)
	go w.run(ctx)
	go w.saveLoop(ctx)
	go w.schemaCheckLoop(ctx)
	if w.mark != nil {
		_ = w.mark.Start(ctx) // never started before: start runs once
	}
	if w.listen != nil {
		w.wg.Add(1)
		go w.listenLoop(ctx)
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
	if w.sh != nil {
		w.sh.closeRenewal() // the renewals that outlive Start's context end here
	}
	done := make(chan struct{})
	go func() {
		w.wg.Wait()
		if w.mark != nil {
			w.mark.Stop()
		}
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
	if err := w.markPass(ctx); err != nil { // what the marker had not got to
		w.log.Warn("cannot set the processed flag at Close; it lags the saved token", "error", err)
	}
	if w.sh != nil {
		return w.leaveAtClose(ctx)
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

// Ready returns a channel that is closed once the watcher has loaded its saved token and its
// first read has returned without error, with the rows it found sent on [Watcher.Events] (so a
// first read of more rows than [Config.BufferSize] waits for the consumer; a [Config.Shared]
// member's, of any row). It is also closed
// when the watcher stops before that: Close, the end of Start's context, a configuration error
// or a refused start ([Watcher.Err] says which). Tests wait on it instead of polling Stats.
func (w *Watcher) Ready() <-chan struct{} { return w.primed.channel() }

// signal is a channel closed once. Its zero value is ready to use.
type signal struct {
	make, close sync.Once
	ch          chan struct{}
}

func (s *signal) channel() chan struct{} {
	s.make.Do(func() { s.ch = make(chan struct{}) })
	return s.ch
}

// fire closes the channel; later calls do nothing.
func (s *signal) fire() { s.close.Do(func() { close(s.channel()) }) }

// opPanic is the Health failure of a goroutine that stopped the watcher after a panic.
const opPanic = "panic"

// recoverPanic, deferred in a watcher goroutine (or around one step of it), recovers a panic in
// where: it logs it with its stack, reports it as a failure of op, and hands the error to then
// (which stops the watcher, or fails the step). A panic leaves no lock held: the locked
// sections that call code that could panic unlock by defer.
func (w *Watcher) recoverPanic(op, where string, then func(error)) {
	r := recover()
	if r == nil {
		return
	}
	err := w.panicError(where, r)
	w.health.fail(op, err)
	then(err)
}

// panicError logs a recovered panic r in where with its stack, and returns it as an error
// wrapping ErrPanic.
func (w *Watcher) panicError(where string, r any) error {
	return procface.PanicError(w.log, where, r)
}

// stopWith stops the watcher because of err, which Err then reports: its goroutines end and the
// reader closes Events. The saved token stays where the last save put it.
func (w *Watcher) stopWith(err error) {
	w.lifeMu.Lock()
	if w.stopErr == nil {
		w.stopErr = err
	}
	cancel := w.cancel
	w.lifeMu.Unlock()
	if cancel != nil { // nil before Start
		cancel()
	}
}

// The connection defaults of the watcher's own sessions (LISTEN and the exclusive lock).
const (
	listenConnTimeout = 10 * time.Second
	defaultAppName    = "pgchangestream"
)

// newListener returns the LISTEN service (internal/listen) on pc: its notifications wake the
// reader and note id hints; its failures go to Health.
func (w *Watcher) newListener(pc *pgconn.Config) *listen.Listener {
	retrying := newRetryReport(&w.health, w.log, opListen, "LISTEN connection failed; retrying")
	return listen.New(listen.Config{
		Conn:           pc,
		AppName:        defaultAppName,
		ConnectTimeout: listenConnTimeout,
		Channel:        w.cfg.NotifyChannel,
		Table:          w.cfg.TableName,
		Hints:          &w.hints,
		Logger:         w.log,
		NoIDs:          w.skipFree.Load,
		Wake:           w.wakeReader,
		OnConnect:      w.warnOtherWatchers,
		Failed:         retrying.failed,
		Connected:      retrying.ok,
		Lost:           func(err error) { w.health.fail(opListen, fmt.Errorf("%s lost: %w", opListen, err)) },
	})
}

// listenLoop is the listener goroutine: it runs the LISTEN service until ctx ends. A panic in
// it stops the watcher.
func (w *Watcher) listenLoop(ctx context.Context) {
	defer w.wg.Done()
	defer w.recoverPanic(opPanic, "LISTEN connection", w.stopWith)
	w.listen.Run(ctx)
}

// wakeReader asks the reader for a read, coalescing with a wake-up already waiting.
func (w *Watcher) wakeReader() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
