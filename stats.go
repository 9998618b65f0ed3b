package pgchangestream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/internal/procface"
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
	// Rewinds counts the times the watcher went back to its saved token because the server
	// recovered from a crash, failed over or was restored (see [ErrServerRecovered]).
	Rewinds uint64
	// Process are the counters of [Watcher.Process] on this watcher.
	Process ProcessStats
	// Shared describes the membership of a [Config.Shared] watcher; zero otherwise.
	Shared SharedStats
}

// SharedStats describe a [Config.Shared] member.
type SharedStats struct {
	Member int64  // the member's id (from the _member_seq sequence), 0 before it joined
	Name   string // Config.MemberName, or host:pid
	// Ranges are the ranges (0 to SharedRanges-1) the member owns and reads, ascending.
	Ranges []int
	// Floors counts the owned ranges saved ahead of the member's reads (taken over from
	// another member): their rows up to their own position are skipped, and their saved
	// position stays until the member's checkpoint passes it.
	Floors int
	// LeaseValid is false while the member may not deliver: its lease was not renewed in time.
	LeaseValid bool
	// HandOvers counts the hand-overs the member made (ranges released or claimed).
	HandOvers uint64
}

// ProcessStats are the counters of [Watcher.Process]: gauges of the run in progress (0 when
// none runs) and totals over every run of the watcher.
type ProcessStats struct {
	InFlight    int    // events taken from Events and not finished
	Deferred    int    // of InFlight, those kept as a token only (see ProcessOptions.MaxKeyQueue)
	BusyWorkers int    // handlers (or dead-letter calls) running
	Handled     uint64 // handler runs that succeeded, reruns of parked events included
	// AlreadyDone counts the events [Watcher.ProcessTx] finished without calling the handler:
	// their claim found them committed before (or the parked event to rerun was dropped).
	AlreadyDone uint64
	Retries     uint64        // failed attempts that were retried
	Parked      uint64        // events this watcher parked in the dead-letter table
	HandlerTime time.Duration // the sum of the handlers' durations
	// LongestKeyQueue is the longest queue of events of one key seen, and LongestKey its key:
	// a hot key holding up its events shows here.
	LongestKeyQueue int
	LongestKey      string
}

// Stats returns the watcher's counters.
func (w *Watcher) Stats() Stats {
	caughtUp := w.health.isCaughtUp()
	proc := w.processStats()
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
		Rewinds:          w.rewinds.Load(),
		Process:          proc,
	}
	w.health.fill(&s)
	if w.sh != nil {
		v := w.sh.view.Load()
		s.Shared = SharedStats{Member: w.sh.id.Load(), Name: w.sh.name, Ranges: slices.Clone(v.owned), Floors: len(v.floors),
			LeaseValid: w.sh.leaseValid(), HandOvers: w.sh.handOvers.Load()}
	}
	return s
}

func (w *Watcher) processStats() ProcessStats { return ProcessStats(procface.StatsOf(&w.procStats)) }

// LagState returns when a read last found nothing new, and the changed_at of the newest row
// read. Zero times mean "not yet". A read that found nothing of a part of the stream that ends at
// a snapshot taken earlier (the legacy part of a switch-over, a delta loaded with the token),
// after which the next delta is read at once, does not count. [Stats].Lag is the lag itself: the age of the oldest row not
// yet acknowledged or read, measured from its changed_at (the start of the transaction that
// wrote it), 0 when caught up.
func (w *Watcher) LagState() (lastEmptyBatch, lastEventRead time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastEmptyBatch, w.lastEventRead
}

// GetUnprocessedEventCount counts the changelog rows of the watched table after lastProcessedID
// (the cursor's id when empty) that are not marked processed, as the watcher it replaces did.
// Without [Config.ProcessedFlag] it counts every row after that id. The processed flag is shared by
// every client of the table and set in the background, so the count is approximate: for this
// client's exact backlog use [Watcher.Backlog].
func (w *Watcher) GetUnprocessedEventCount(ctx context.Context, lastProcessedID string) (int64, error) {
	if w.cfgErr != nil {
		return 0, w.cfgErr
	}
	var after int64
	if lastProcessedID == "" {
		w.mu.Lock()
		after = w.cursor.ID
		w.mu.Unlock()
	} else {
		id, ok, err := position.ParseToken([]byte(lastProcessedID))
		if err != nil || !ok {
			return 0, fmt.Errorf("pgchangestream: lastProcessedID: %w", err)
		}
		after = id
	}
	var n int64
	if err := w.cfg.DB.QueryRowContext(ctx, w.q.Unprocessed, w.cfg.TableName, after).Scan(&n); err != nil {
		return 0, fmt.Errorf("pgchangestream: count unprocessed events: %w", err)
	}
	return n, nil
}

// Backlog counts the rows of the watched table, visible now, that this client's saved token
// does not certify: what a restart would deliver. Unlike GetUnprocessedEventCount it does not
// read the shared processed flag, so it is exact for this client. It counts rows still in the
// Events channel or not acknowledged, and is 0 only when everything was acknowledged and saved.
func (w *Watcher) Backlog(ctx context.Context) (int64, error) {
	if w.cfgErr != nil {
		return 0, w.cfgErr
	}
	w.mu.Lock()
	saved, loaded := w.savedMirror, w.loaded
	w.mu.Unlock()
	if !loaded {
		return 0, errors.New("pgchangestream: backlog: the saved token is not loaded yet")
	}
	var args changelog.Params
	conds := []string{"c.table_name = " + args.Add(w.cfg.TableName)}
	n, _, _, err := changelog.CountNotCertified(ctx, w.cfg.DB, changelog.Quote(w.cfg.ChangelogTable), saved, conds, args)
	if err != nil {
		return 0, fmt.Errorf("pgchangestream: count backlog in changelog %s: %w", w.cfg.ChangelogTable, err)
	}
	return n, nil
}

// The operations whose failures [Watcher.Health] reports, each naming the object it works on.
const (
	opLoad   = "load start position" // the token table (and the changelog for a new client)
	opRead   = "read changelog"
	opListen = "LISTEN connection"
	opLock   = "exclusive lock"
	opMember = "shared membership"  // the _members and _ranges tables
	opMark   = "set processed flag" // the changelog's legacy flag, after saves
	opSave   = "save checkpoint"    // the token table, inline or in the background
	opSchema = "capture trigger"    // the table's capture trigger and its function (schema_check.go)
	opPark   = "dead-letter table"  // Process's parks, reruns and polls of released events
)

// firstReadTimeout is how long a watcher may work (after Start, or after taking over as the
// exclusive watcher) without completing a read before [Watcher.Health] reports it.
const firstReadTimeout = 30 * time.Second

// failure is an operation failing since a time.
type failure struct {
	op    string
	err   error
	since time.Time
}

// health records what the watcher's goroutines report, for Health and Stats. Its methods are
// safe for concurrent use; it has a lock of its own, so reporting never waits for mu or ckMu.
type health struct {
	listenCritical bool // immutable: notify mode, where events stop while LISTEN is down

	mu         sync.Mutex
	failing    []failure // current failures, one per operation, oldest first
	loadErrors uint64
	readErrors uint64
	lastErr    error
	lastErrAt  time.Time
	listenUp   bool
	working    time.Time // when the watcher began (or took over) reading; zero before
	loadDone   bool      // the start position was loaded since working
	readDone   bool      // a read completed since working
	caughtUp   bool      // the last read found no more rows
	// retrying counts, per operation, the retry loops failing now (failRetry, endRetry): the
	// operation's failure lasts until the last of them ends.
	retrying map[string]int
}

// fail records that op failed with err. The failure lasts until ok(op).
func (h *health) fail(op string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failLocked(op, err)
}

// failRetry records that op failed with err in one of several retry loops that may run at
// once; first says the loop had not failed before. The failure lasts until every loop that
// failed called endRetry.
func (h *health) failRetry(op string, err error, first bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if first {
		if h.retrying == nil {
			h.retrying = map[string]int{}
		}
		h.retrying[op]++
	}
	h.failLocked(op, err)
}

// endRetry records that a retry loop of op that failed ended (it succeeded or gave up).
func (h *health) endRetry(op string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.retrying[op]--; h.retrying[op] > 0 {
		return
	}
	delete(h.retrying, op)
	if i := h.index(op); i >= 0 {
		h.failing = slices.Delete(h.failing, i, i+1)
	}
}

// failLocked is fail with h.mu held.
func (h *health) failLocked(op string, err error) {
	now := time.Now()
	h.lastErr, h.lastErrAt = err, now
	switch op {
	case opLoad:
		h.loadErrors++
	case opRead:
		h.readErrors++
	case opListen:
		h.listenUp = false
	}
	if i := h.index(op); i >= 0 {
		h.failing[i].err = err
		return
	}
	h.failing = append(h.failing, failure{op: op, err: err, since: now})
}

// ok records that op succeeded, ending its failure.
func (h *health) ok(op string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch op {
	case opListen:
		h.listenUp = true
	case opLoad:
		h.loadDone = true
	case opRead:
		h.readDone = true
	}
	if i := h.index(op); i >= 0 {
		h.failing = slices.Delete(h.failing, i, i+1)
	}
}

// index returns the position of op's failure, or -1. h.mu must be held.
func (h *health) index(op string) int {
	return slices.IndexFunc(h.failing, func(f failure) bool { return f.op == op })
}

// startWork records that the watcher begins reading (at Start, or when it becomes the
// exclusive watcher): the first-read timeout runs from here.
func (h *health) startWork() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.working, h.loadDone, h.readDone = time.Now(), false, false
}

// readOK records a completed read; full reports that more rows may follow.
func (h *health) readOK(full bool) {
	h.ok(opRead)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.caughtUp = !full
}

// isCaughtUp reports whether the last read found no more rows.
func (h *health) isCaughtUp() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.caughtUp
}

// err describes the current failures at now, or returns nil.
func (h *health) err(now time.Time) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var msgs []string
	for _, f := range h.failing {
		if f.op == opListen && !h.listenCritical {
			continue // hybrid and polling reads go on without LISTEN
		}
		msgs = append(msgs, fmt.Sprintf("%v (failing for %s)", f.err, roundAge(now.Sub(f.since))))
	}
	if len(msgs) == 0 && !h.working.IsZero() && !h.readDone && now.Sub(h.working) >= firstReadTimeout {
		op := opRead
		if !h.loadDone {
			op = opLoad
		}
		msgs = append(msgs, fmt.Sprintf("%s: not done %s after start, without an error (a query waits for a lock or "+
			"the server, or the LISTEN connection for the server)", op, roundAge(now.Sub(h.working))))
	}
	if len(msgs) == 0 {
		return nil
	}
	return errors.New(strings.Join(msgs, "; "))
}

// fill copies the counters into s.
func (h *health) fill(s *Stats) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s.LoadErrors, s.ReadErrors = h.loadErrors, h.readErrors
	s.LastError, s.LastErrorAt = h.lastErr, h.lastErrAt
	s.ListenUp = h.listenUp
}

// roundAge rounds a duration for messages: whole seconds, or milliseconds under a second.
func roundAge(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}

// Health returns nil while the watcher does its work. Otherwise it describes each current
// failure and how long it has lasted, for example "read changelog: permission denied for table
// datastore_changelog (failing for 12s)". A failure clears when the operation next succeeds.
// Failing checkpoint saves, inline or in the background, are a failure ("save checkpoint"), and
// so is a recovered panic (see [ErrPanic]). So is a trigger function or capture trigger that
// other DDL changed after schema.Install and schema.Capture made them ("capture trigger: trigger
// function public.log_table_changes() is not the one schema.Install installs: ..."; the message
// says what to re-apply): the watcher checks its table's trigger and function at Start and then
// every 30s, so such a change shows within 40s, until a check finds the schema re-applied. A
// call of [Watcher.Process] to its dead-letter table (a park, a rerun's read, the poll of
// released events) that fails is a failure ("dead-letter table") from its first failed try
// until it succeeds: a park that keeps failing, which holds the checkpoint behind its event,
// shows at once and as long as it lasts. Every failure is also [Stats].LastError.
// When nothing failed, it also reports a watcher that has not completed a read within 30s of
// starting (or of taking over as the exclusive watcher), naming the step it is stuck in. In
// hybrid and polling modes a lost LISTEN connection is not a failure (reads go on;
// [Stats].ListenUp shows it); in notify mode it is. A standby waiting for
// the exclusive lock is healthy. Health returns the configuration error of a watcher made by
// [NewPostgreSQLChangeStreamWatcher] with invalid arguments, and nil after Close.
func (w *Watcher) Health() error {
	if w.cfgErr != nil {
		return w.cfgErr
	}
	if w.isClosed() {
		return nil
	}
	return w.health.err(time.Now())
}

// repeatLogInterval is the most often a repeatLog writes a line about the same failure.
const repeatLogInterval = 30 * time.Second

// repeatLog logs the failures of one background operation that retries (a save, a read, a
// reconnect), so that an outage writes a few lines, not one per attempt: the first failure at
// once, then at most one summary per repeatLogInterval ("N more times in the last X", with the
// last error), and one line when the operation succeeds again. It is safe for concurrent use;
// the lines are written after its lock is released.
type repeatLog struct {
	log   *slog.Logger // immutable
	level slog.Level   // immutable
	msg   string       // immutable

	mu      sync.Mutex
	failing bool      // a failure was logged and no success since
	first   time.Time // when the failure began
	last    time.Time // when the last line about it was written
	unseen  int       // failures since that line, not yet logged
	total   int       // failures since the failure began
}

// newRepeatLog returns a repeatLog writing msg at level to log.
func newRepeatLog(log *slog.Logger, level slog.Level, msg string) *repeatLog {
	return &repeatLog{log: log, level: level, msg: msg}
}

// fail records a failure described by args (slog key-value pairs, the error among them): it is
// logged if it is the first, or if the last line is repeatLogInterval old, as a summary.
func (r *repeatLog) fail(args ...any) {
	now := time.Now()
	r.mu.Lock()
	r.total++
	switch {
	case !r.failing:
		r.failing, r.first, r.last, r.unseen = true, now, now, 0
		r.mu.Unlock()
		r.log.Log(context.Background(), r.level, r.msg, args...)
		return
	case now.Sub(r.last) < repeatLogInterval:
		r.unseen++
		r.mu.Unlock()
		return
	}
	n, since := r.unseen+1, now.Sub(r.last)
	r.last, r.unseen = now, 0
	r.mu.Unlock()
	r.log.Log(context.Background(), r.level, r.msg,
		append(args, "repeated", n, "in_last", since.Round(time.Second))...)
}

// ok records a success: after failures, it logs that the operation recovered, with how many
// times it failed and for how long.
func (r *repeatLog) ok() {
	now := time.Now()
	r.mu.Lock()
	if !r.failing {
		r.mu.Unlock()
		return
	}
	total, lasted := r.total, now.Sub(r.first)
	r.failing, r.total, r.unseen = false, 0, 0
	r.mu.Unlock()
	r.log.Info(r.msg+": recovered", "failures", total, "failing_for", lasted.Round(time.Second))
}

// retryReport reports the attempts of a service that retries op with backoff: each failure is a
// Health failure of op and goes to a repeatLog of msg; a success clears both.
type retryReport struct {
	h   *health
	op  string
	log *repeatLog
}

// newRetryReport returns the retryReport of op into h, logging msg to log.
func newRetryReport(h *health, log *slog.Logger, op, msg string) retryReport {
	return retryReport{h: h, op: op, log: newRepeatLog(log, slog.LevelWarn, msg)}
}

// failed records a failed attempt, retried in retryIn.
func (r retryReport) failed(err error, retryIn time.Duration) {
	r.h.fail(r.op, fmt.Errorf("%s: %w", r.op, err))
	r.log.fail("error", err, "retry_in", retryIn)
}

// ok records a successful attempt.
func (r retryReport) ok() {
	r.log.ok()
	r.h.ok(r.op)
}
