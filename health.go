package pgchangestream

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

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

// lagLocked is the lag at now: the age of the oldest row not yet acknowledged or not yet read,
// measured from its changed_at, 0 when nothing is pending and the last read found no more rows.
// Rows not yet read are newer than the cursor, so while the reader is behind, the cursor's
// changed_at bounds their age from above. mu must be held.
func (w *Watcher) lagLocked(now time.Time, caughtUp bool) time.Duration {
	var oldest time.Time
	if p, ok := w.ring.MinPredecessor(); ok {
		oldest = p.ChangedAt
	} else if !caughtUp && w.loaded {
		oldest = w.cursor.ChangedAt
	}
	if oldest.IsZero() || !oldest.Before(now) {
		return 0
	}
	return now.Sub(oldest)
}
