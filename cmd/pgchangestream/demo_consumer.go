package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// demoClient is the client name of the demo's consumer.
const demoClient = "pgchangestream-demo"

// demoConsumer is the demo's consumer: one watcher at a time (an incarnation, like one process
// of a service), which it crashes and replaces. It records every delivery it receives.
type demoConsumer struct {
	dsn    string
	admin  *sql.DB // for reading the saved token; outlives the incarnations
	logger *slog.Logger

	mu   sync.Mutex
	seen map[int64]int        // deliveries received per changelog id; guarded by mu
	cur  *incarnation         // guarded by mu; nil when stopped
	last pgchangestream.Stats // the stats of the last incarnation stopped; guarded by mu

	delivered, acked, ackErrors atomic.Uint64
}

// incarnation is one consumer process: its own pool, watcher and consuming goroutine.
type incarnation struct {
	db     *sql.DB
	w      *pgchangestream.Watcher
	cancel context.CancelFunc
	done   chan struct{} // closed when the consuming goroutine returns

	// unacked holds the ids received and not yet acknowledged (saved) when the consuming
	// goroutine returned; read only after done is closed.
	unacked []int64
}

func newDemoConsumer(dsn string, admin *sql.DB, logger *slog.Logger) *demoConsumer {
	return &demoConsumer{dsn: dsn, admin: admin, logger: logger, seen: map[int64]int{}}
}

// start starts a new incarnation: a hybrid-mode watcher that resumes after the saved token.
func (c *demoConsumer) start(ctx context.Context) (*pgchangestream.Watcher, error) {
	db, _, err := openDB(c.dsn)
	if err != nil {
		return nil, err
	}
	w, err := pgchangestream.New(pgchangestream.Config{
		DB: db, ConnString: c.dsn, ClientName: demoClient, TableName: demoTable,
		Mode: pgchangestream.ModeHybrid, Logger: c.logger,
	})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	ictx, cancel := context.WithCancel(ctx)
	inc := &incarnation{db: db, w: w, cancel: cancel, done: make(chan struct{})}
	w.Start(ictx)
	go c.consume(ictx, inc)
	c.mu.Lock()
	c.cur = inc
	c.mu.Unlock()
	return w, nil
}

// The consumer acknowledges a watermark, the newest event received, every demoAckEvery events,
// and once no event has arrived for demoAckIdle: it works in batches, as consumers that save
// fewer checkpoints do. Between two acknowledgements it holds deliveries unacknowledged, which a
// crash leaves pending, so that the restart delivers them again.
const (
	demoAckEvery = 20
	demoAckIdle  = time.Second
)

// consume records every delivery and acknowledges them in batches, in order, until ctx ends or
// the watcher stops.
func (c *demoConsumer) consume(ctx context.Context, inc *incarnation) {
	defer close(inc.done)
	events := inc.w.Events()
	idle := time.NewTimer(demoAckIdle)
	idle.Stop()
	defer idle.Stop()
	var (
		last    []byte  // the token of the newest event received
		unacked []int64 // the ids received since the last acknowledgement that was saved
	)
	defer func() { inc.unacked = unacked }()
	// An acknowledgement runs to its end even when a crash comes during it, so that what the
	// crash left unacknowledged is known exactly: a save cancelled mid-statement may still have
	// committed.
	ack := func() {
		if err := inc.w.MarkProcessed(context.WithoutCancel(ctx), last); err != nil {
			// Kept in memory; the next acknowledgement saves it.
			c.ackErrors.Add(1)
			c.logger.Warn("acknowledgement not saved", "token", string(last), "error", err)
			return
		}
		c.acked.Add(uint64(len(unacked)))
		unacked = unacked[:0]
	}
	for {
		var ev pgchangestream.EventWithToken
		var ok bool
		select {
		case <-ctx.Done():
			return
		case <-idle.C:
			ack()
			continue
		case ev, ok = <-events:
		}
		if !ok {
			return
		}
		id, err := strconv.ParseInt(string(ev.ResumeToken), 10, 64)
		if err != nil {
			c.logger.Error("delivery with an invalid token", "token", ev.ResumeToken)
			continue
		}
		c.mu.Lock()
		c.seen[id]++
		c.mu.Unlock()
		c.delivered.Add(1)
		last, unacked = ev.ResumeToken, append(unacked, id)
		if len(unacked) < demoAckEvery {
			idle.Reset(demoAckIdle)
			continue
		}
		idle.Stop()
		ack()
	}
}

// waitStarted waits until w, a new client's first watcher, has loaded its start position (it
// saves it at once).
func waitStarted(ctx context.Context, w *pgchangestream.Watcher, timeout time.Duration) error {
	return waitWatcher(ctx, w, timeout, "save its start position", func() bool {
		return w.Stats().CheckpointWrites > 0
	})
}

// waitReading waits until w has read the changelog once. A watcher listens before its first
// read, so from then on it handles the NOTIFY of every commit.
func waitReading(ctx context.Context, w *pgchangestream.Watcher, timeout time.Duration) error {
	return waitWatcher(ctx, w, timeout, "read the changelog", func() bool {
		lastEmpty, _ := w.LagState()
		return w.Stats().Delivered > 0 || !lastEmpty.IsZero()
	})
}

// waitWatcher polls until done reports true, for at most timeout; what says what the consumer
// failed to do then.
func waitWatcher(parent context.Context, w *pgchangestream.Watcher, timeout time.Duration, what string,
	done func() bool) error {
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !done() {
		select {
		case <-ctx.Done():
			if err := w.Err(); err != nil {
				return fmt.Errorf("consumer did not start: %w", err)
			}
			if parent.Err() != nil {
				return interrupted(parent)
			}
			return fmt.Errorf("consumer did not %s within %v", what, timeout)
		case <-tick.C:
		}
	}
	return nil
}

// crashReport is what a crash left behind.
type crashReport struct {
	saved   pgchangestream.Position // the last certified delivery in the token table: the restart resumes from it
	unacked int                     // deliveries received and not acknowledged: delivered again
}

// crash stops the current incarnation as a crash would: the consuming goroutine stops where it
// is, the watcher's Start context is cancelled with no Flush, and its pool is closed, so
// nothing more is saved. Close runs only to release the watcher's goroutines: its final save
// fails on the closed pool, as it would in a crashed process. crash then reports the position
// left in the token table, from which the next incarnation resumes, and the deliveries the
// incarnation had not acknowledged, which the next incarnation delivers again.
func (c *demoConsumer) crash(ctx context.Context) (crashReport, error) {
	c.mu.Lock()
	inc := c.cur
	c.cur = nil
	c.mu.Unlock()
	if inc == nil {
		return crashReport{}, errors.New("no consumer running")
	}
	inc.cancel()
	<-inc.done
	_ = inc.db.Close()
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	_ = inc.w.Close(closeCtx) // its final save fails: the pool is closed
	c.keepStats(inc)
	saved, err := savedPosition(ctx, c.admin)
	if err != nil {
		return crashReport{}, err
	}
	return crashReport{saved: saved, unacked: len(inc.unacked)}, nil
}

// stop closes the current incarnation cleanly: Close stops the watcher and saves the final
// position, then the consuming goroutine ends with the Events channel.
func (c *demoConsumer) stop(ctx context.Context) error {
	c.mu.Lock()
	inc := c.cur
	c.cur = nil
	c.mu.Unlock()
	if inc == nil {
		return nil
	}
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	err := inc.w.Close(closeCtx)
	inc.cancel()
	<-inc.done
	c.keepStats(inc)
	return errors.Join(err, inc.db.Close())
}

// keepStats records the stats of a stopped incarnation for stats.
func (c *demoConsumer) keepStats(inc *incarnation) {
	st := inc.w.Stats()
	c.mu.Lock()
	c.last = st
	c.mu.Unlock()
}

// stats returns the current incarnation's stats, or the last one's when none runs.
func (c *demoConsumer) stats() pgchangestream.Stats {
	c.mu.Lock()
	inc, last := c.cur, c.last
	c.mu.Unlock()
	if inc == nil {
		return last
	}
	return inc.w.Stats()
}

// covers reports whether every id in ids was delivered at least once.
func (c *demoConsumer) covers(ids []int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !slices.ContainsFunc(ids, func(id int64) bool { return c.seen[id] == 0 })
}

// deliveries returns a copy of the deliveries per changelog id.
func (c *demoConsumer) deliveries() map[int64]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int64]int, len(c.seen))
	for id, n := range c.seen {
		out[id] = n
	}
	return out
}

// savedPosition reads the demo client's saved position from the token table.
func savedPosition(ctx context.Context, db *sql.DB) (pgchangestream.Position, error) {
	var (
		p  pgchangestream.Position
		ts sql.NullTime // the demo's watchers always write it
	)
	err := db.QueryRowContext(ctx, `SELECT (resume_token->>'eventID')::bigint, (resume_token->>'timestamp')::timestamptz
		FROM resume_tokens WHERE client_name = $1`, demoClient).Scan(&p.ID, &ts)
	if err != nil {
		return p, fmt.Errorf("read the saved position: %w", err)
	}
	p.ChangedAt = ts.Time.UTC()
	return p, nil
}
