package marker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// Marker timing: at most one pass per markInterval, so the saves of a busy consumer share a
// pass (and a commit) instead of doubling them, and each pass marks thousands of rows
// rather than hundreds (about three times cheaper per row: every marked row is rewritten with
// an entry in each index); backoff after a failed pass. The flag lags the token by about
// markInterval, which its one reader, the old cleanup_changelog(days), does not notice.
const (
	markInterval = 100 * time.Millisecond
	markRetryMin = 100 * time.Millisecond
	// RetryMax is the longest wait of the marker goroutine between failed passes.
	RetryMax = 10 * time.Second

	// markStatements bounds the statements of a pass that run at once (each on a connection
	// of Config.DB), markChunk is the fewest rows each one marks.
	markStatements = 2
	markChunk      = 1000

	// CatchUpPage is how many rows a page of the catch-up after a load marks at most.
	CatchUpPage = 5 * markStatements * markChunk
)

// Saved is what the watcher has saved, as a pass reads it: at once, under the watcher's
// delivery lock.
type Saved struct {
	// Position is the saved position; a pass marks up to it.
	Position position.Position
	// Loaded says Position holds the loaded or a saved position (the load ran).
	Loaded bool
	// Switched is the span of an in-place switch-over (seq 0, its snapshot as base), which the
	// watcher's reader records when it switches; nil if it did not switch.
	Switched *position.Span
}

// Report is how the marker reports its passes to the watcher's health and logs.
type Report struct {
	// Passed is called after each pass that succeeds.
	Passed func()
	// Panicked is called with what a pass (or one of its statements) panicked with; it
	// returns the error the pass fails with.
	Panicked func(r any) error
	// Retrying is called when a pass of the marker goroutine failed with err; the goroutine
	// retries in wait.
	Retrying func(err error, wait time.Duration)
	// Resumed is called after each pass of the marker goroutine that succeeds.
	Resumed func()
}

// Config is what a Marker needs.
type Config struct {
	DB             *sql.DB
	ChangelogTable string // the changelog (not quoted): the statements' table, and messages
	TableName      string // the table whose rows are marked (the rows' table_name)
	Logger         *slog.Logger
	// Saved returns what the watcher has saved. The marker calls it with its own lock held: it
	// must not wait for a marking pass.
	Saved  func() Saved
	Report Report
}

// Marker sets the legacy processed flag of the changelog rows the watcher's saved token
// certifies. Create it with New; Start runs its goroutine, Stop ends it.
type Marker struct {
	cfg Config     // immutable
	q   Statements // immutable

	mu     sync.Mutex        // serializes marking; guards marked and ok. Held across a marking pass (its query and statements); taken after the watcher's ckMu (by the load), before its mu.
	marked position.Position // the rows this position certifies are marked
	ok     bool              // marked is set (by the load)

	// loaded is the position the load (or a rewind) set marked to, while the rows it certifies
	// have not all been checked for the flag (catchUp); nil once they have. caughtUp is the
	// legacy key (changed_at, id) of the last row checked so far. Both guarded by mu.
	loaded   *position.Position
	caughtUp position.Position

	wake    chan struct{} // capacity 1: a save happened
	running atomic.Bool   // the marker goroutine runs; saves wake it instead of marking

	// Lifecycle, guarded by lifeMu.
	lifeMu  sync.Mutex
	cancel  context.CancelFunc // ends the marker goroutine; nil until Start
	stopped chan struct{}      // closed when the marker goroutine returns
}

// New returns the marker cfg describes. It marks nothing until SetMarked.
func New(cfg Config) *Marker {
	return &Marker{cfg: cfg, q: NewStatements(cfg.ChangelogTable), wake: make(chan struct{}, 1)}
}

// Start runs the marker goroutine until ctx ends or Stop: from here on, AfterSave only wakes
// it. It returns an error if the marker was started before.
func (m *Marker) Start(ctx context.Context) error {
	m.lifeMu.Lock()
	defer m.lifeMu.Unlock()
	if m.cancel != nil {
		return errors.New("marker: started twice")
	}
	ctx, m.cancel = context.WithCancel(ctx)
	m.stopped = make(chan struct{})
	m.running.Store(true)
	go m.run(ctx)
	return nil
}

// Stop ends the marker goroutine and waits for it; AfterSave then marks at once again. It does
// nothing if the marker was not started.
func (m *Marker) Stop() {
	m.lifeMu.Lock()
	cancel, stopped := m.cancel, m.stopped
	m.lifeMu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-stopped
}

// HoldPasses makes saves only wake the marker, as while its goroutine runs, without starting
// it: for tests that run the passes themselves (Pass), at the times they choose.
func (m *Marker) HoldPasses() { m.running.Store(true) }

// run is the marker goroutine: after each wake-up it marks what the saves certified, at most
// once per markInterval, retrying with backoff while that fails.
func (m *Marker) run(ctx context.Context) {
	defer close(m.stopped)
	defer m.running.Store(false) // set by Start
	retry := backoff.Backoff{Min: markRetryMin, Max: RetryMax}
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
		}
		err := m.Pass(ctx)
		if err == nil {
			retry.Reset()
			m.cfg.Report.Resumed()
			if !backoff.Sleep(ctx, markInterval) { // saves meanwhile wake the next pass
				return
			}
			continue
		}
		if ctx.Err() != nil {
			return
		}
		wait := retry.Next()
		m.cfg.Report.Retrying(err, wait)
		if !backoff.Sleep(ctx, wait) {
			return
		}
		m.Wake()
	}
}

// Wake asks the marker for a pass, coalescing with one already asked for.
func (m *Marker) Wake() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// AfterSave has the rows certified by a save marked: by the marker goroutine when it runs,
// otherwise (before Start, after Stop or after Start's context ended) at once.
func (m *Marker) AfterSave(ctx context.Context) {
	if m.running.Load() {
		m.Wake()
		return
	}
	if err := m.Pass(ctx); err != nil {
		m.cfg.Logger.Warn("cannot set the processed flag; the next save retries", "error", err)
	}
}

// Pass runs a marking pass, turning a panic in it into a failed pass (reported by the watcher's
// health until a pass succeeds): the flag may lag, so marking goes on.
func (m *Marker) Pass(ctx context.Context) (err error) {
	defer m.recover(func(e error) { err = e })
	if err = m.markSaved(ctx); err == nil {
		m.cfg.Report.Passed()
	}
	return err
}

// recover reports a panic of the goroutine that defers it, and hands then its error.
func (m *Marker) recover(then func(error)) {
	if r := recover(); r != nil {
		then(m.cfg.Report.Panicked(r))
	}
}

// Marked returns the position whose certified rows are marked.
func (m *Marker) Marked() position.Position {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.marked
}

// markSaved sets the processed flag of the rows the saved token certifies that are not marked
// yet: after a load, first those of the loaded token (catchUp).
func (m *Marker) markSaved(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.catchUp(ctx); err != nil {
		return fmt.Errorf("set the processed flag in changelog %s of the rows the loaded token certifies: %w", m.cfg.ChangelogTable, err)
	}
	s := m.cfg.Saved()
	target := s.Position
	if !s.Loaded || !m.ok {
		return nil
	}
	prev := m.marked
	if prev.Span == nil && target.Span != nil && s.Switched != nil {
		// The watcher switched over in place since this pass last ran. In the switch-over's form
		// the rows marked certify no more than before, and marking goes on from its snapshot.
		prev.Span = s.Switched
	}
	if !prev.Before(target) {
		// Equal, or the token moved back behind a late row: mark from there on next time.
		m.marked = target
		return nil
	}
	q, args := m.q.MarkStatement(m.cfg.TableName, prev, target)
	ids, err := m.certifiedIDs(ctx, q, args)
	if err == nil {
		err = m.markIDs(ctx, ids)
	}
	if err != nil {
		return fmt.Errorf("set the processed flag in changelog %s: %w", m.cfg.ChangelogTable, err)
	}
	m.marked = target
	return nil
}

// certifiedIDs runs the selection q of the rows a pass marks, returning their ids in ascending
// order, each once (Switch's two parts can both select a row).
func (m *Marker) certifiedIDs(ctx context.Context, q string, args []any) ([]int64, error) {
	rows, err := m.cfg.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// markIDs sets the processed flag of the rows ids (ascending). From 2 × markChunk rows on, it
// splits them into markStatements statements of contiguous ids that run at once, on goroutines
// of their own: a marked row is rewritten with an entry in each index, so one statement keeps a
// single server core busy, and rows apart are rewritten without waiting for each other. If a
// statement fails, the others keep what they marked: the flag may lag, and the next pass marks
// the rest.
func (m *Marker) markIDs(ctx context.Context, ids []int64) error {
	mark := func(ids []int64) error {
		_, err := m.cfg.DB.ExecContext(ctx, m.q.MarkIDs, changelog.Array(ids))
		return err
	}
	n := min(markStatements, len(ids)/markChunk)
	if n <= 1 {
		if len(ids) == 0 {
			return nil
		}
		return mark(ids)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			defer m.recover(func(e error) { errs[i] = e })
			errs[i] = mark(ids[len(ids)*i/n : len(ids)*(i+1)/n])
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// SetMarked records p, the loaded token, as where marking goes on from, and has the marker
// catch up on the rows p certifies. The load calls it once the watcher's saved position is p.
// The watcher's mu must not be held.
func (m *Marker) SetMarked(p position.Position) {
	m.mu.Lock()
	m.marked, m.ok = p, true
	m.loaded, m.caughtUp = &p, position.Position{}
	m.mu.Unlock()
	m.Wake()
}

// catchUp marks the rows of the table that the loaded token certifies and that are not marked:
// those a crash left unmarked after the saves before it, or all of them the first time a client
// marks. Only rows the saved token certifies too are marked, should it have moved back behind a
// late row since. Each page selects, through the partial index of the rows not marked, the next
// rows in (changed_at, id) order that both certify, and marks them; a failed page is selected
// again by the next pass. So the catch-up reads the table's rows not marked, once: on a changelog
// whose rows are marked it costs about what it marks. mu must be held.
func (m *Marker) catchUp(ctx context.Context) error {
	if m.loaded == nil {
		return nil
	}
	saved := m.cfg.Saved().Position // the load set it before the loaded position: see SetMarked
	for m.loaded != nil {
		q, args := m.q.CatchUpStatement(m.cfg.TableName, *m.loaded, saved, m.caughtUp)
		ids, last, err := m.catchUpPage(ctx, q, args)
		if err == nil {
			err = m.markIDs(ctx, ids)
		}
		if err != nil {
			return err
		}
		if len(ids) < CatchUpPage {
			m.loaded = nil
		}
		m.caughtUp = last
	}
	return nil
}

// catchUpPage runs the selection q of a page of the catch-up, returning the ids in ascending
// order and the legacy key (changed_at, id) of the last row.
func (m *Marker) catchUpPage(ctx context.Context, q string, args []any) (ids []int64, last position.Position, err error) {
	rows, err := m.cfg.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, position.Position{}, err
	}
	defer rows.Close()
	for rows.Next() {
		if err := rows.Scan(&last.ID, &last.ChangedAt); err != nil {
			return nil, position.Position{}, err
		}
		ids = append(ids, last.ID)
	}
	if err := rows.Err(); err != nil {
		return nil, position.Position{}, err
	}
	slices.Sort(ids)
	return ids, last, nil
}
