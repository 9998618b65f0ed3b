package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgchangestream/pgchangestream"
)

const (
	// latencyWriters is the number of connections inserting rows in the hybrid and polling
	// runs: enough for the offered rate to be met when each commit waits for a WAL flush.
	latencyWriters = 8
	// latencyWarmup is the number of rows inserted and received before measuring, so that the
	// watcher, its LISTEN connection and the writers' connections are all up.
	latencyWarmup = 20
	// latencyWarmupWait is how long a warm-up row is waited for before the next is inserted.
	latencyWarmupWait = time.Second
	// latencyGrace is how long the consumer keeps waiting for missing events after the last
	// commit.
	latencyGrace = 3 * time.Second
)

// latency is the commit-to-receive latency distribution of one mode, in milliseconds.
type latency struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
	// Events is the number of events measured; OfferedRate the rate the writers achieved.
	Events      int     `json:"events"`
	OfferedRate float64 `json:"offered_rate"`
	// Early counts events received before their writer saw COMMIT return (counted as 0 ms).
	Early int `json:"early"`
	// Missed counts rows committed but not received within latencyGrace after the last
	// commit: in polling mode, rows that commit behind the cursor (a known limit).
	Missed int `json:"missed"`
	// NotifyFloor is the same measure for a bare LISTEN connection on the trigger's channel,
	// run alongside the watcher in notify-driven modes: what the server and the machine allow.
	NotifyFloor *latency `json:"notify_floor,omitempty"`
}

// latencyRun is one latency measurement. Times are durations since base.
type latencyRun struct {
	base     time.Time
	commitAt []time.Duration // by row n; written by the writers
	recvAt   []time.Duration // by row n; written by the consumer
	idOf     []int64         // changelog id of row n; written by the consumer

	notifyMu sync.Mutex
	notifyAt map[int64]time.Duration // by changelog id; written by the floor listener
}

// measureLatency runs a watcher in s.mode on the s.variant schema while s.writers connections
// insert rows into the captured table at rate rows per second for d, one autocommit INSERT
// each; with s.longTx, a transaction holding a transaction id stays open in another database
// of the cluster meanwhile. An event's latency is the time from the moment its writer's COMMIT
// returned to the moment the consumer received the event. The consumer acknowledges every
// event, with checkpoints batched every 100ms. The client is new, so it starts after the newest
// row (at the current snapshot on the upgraded schema, reading in snapshot deltas); its saved
// token is checked for that form at the end.
func measureLatency(ctx context.Context, e *env, s latencySpec, rate int, d time.Duration) (latency, error) {
	mode := s.mode
	db, err := e.newDatabase(ctx, s.variant)
	if err != nil {
		return latency{}, err
	}
	defer db.drop(ctx)
	if s.longTx {
		end, err := openLongTx(ctx, e)
		if err != nil {
			return latency{}, err
		}
		defer end()
	}
	cfg := db.watcherConfig("latency")
	cfg.Mode = mode
	cfg.CheckpointInterval = batchedInterval
	if mode != pgchangestream.ModePolling {
		cfg.ConnString = db.dsn
	}
	w, err := pgchangestream.New(cfg)
	if err != nil {
		return latency{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, d+drainTimeout)
	defer cancel()
	w.Start(ctx)
	defer func() { _ = w.Close(context.WithoutCancel(ctx)) }()

	insert := func(n int) error {
		_, err := db.ExecContext(ctx, `INSERT INTO `+itemsTable+` (n, doc)
			SELECT g, `+docSQL+` FROM (SELECT $1::bigint AS g) s`, n)
		return err
	}
	if err := warmUp(ctx, w, insert); err != nil {
		return latency{}, err
	}

	total := max(1, int(float64(rate)*d.Seconds()))
	r := &latencyRun{
		commitAt: make([]time.Duration, total),
		recvAt:   make([]time.Duration, total),
		idOf:     make([]int64, total),
		notifyAt: map[int64]time.Duration{},
	}
	var stopFloor func() error
	if mode != pgchangestream.ModePolling {
		if stopFloor, err = r.listenFloor(ctx, db.dsn); err != nil {
			return latency{}, err
		}
	}
	r.base = time.Now()
	consumed := make(chan error, 1)
	writersDone := make(chan struct{})
	go func() { consumed <- r.consume(ctx, w, writersDone) }()
	writeErr := r.write(insert, rate, s.writers)
	writeEnd := time.Since(r.base)
	close(writersDone)
	err = errors.Join(writeErr, <-consumed)
	if stopFloor != nil {
		err = errors.Join(err, stopFloor())
	}
	if err == nil {
		err = w.Flush(ctx)
	}
	if err == nil {
		err = db.checkTokenForm(ctx, cfg.ClientName)
	}
	if err != nil {
		return latency{}, err
	}
	l := summarize(r.commitAt, r.recvAt, writeEnd)
	if stopFloor != nil {
		floorAt := make([]time.Duration, total)
		for k, id := range r.idOf {
			floorAt[k] = r.notifyAt[id] // zero (missed) when the id is unknown
		}
		f := summarize(r.commitAt, floorAt, writeEnd)
		l.NotifyFloor = &f
	}
	return l, nil
}

// warmUp inserts rows with negative n until latencyWarmup of them were received. A row
// inserted while the watcher is still looking up the newest row is taken as the start and
// never delivered; in polling mode nothing recovers it, so a row not received within
// latencyWarmupWait is followed by the next one instead of being waited for.
func warmUp(ctx context.Context, w *pgchangestream.Watcher, insert func(n int) error) error {
	for got, n := 0, -1; got < latencyWarmup; n-- {
		if n < -10*latencyWarmup {
			return fmt.Errorf("warm-up: %d of %d rows received", got, latencyWarmup)
		}
		if err := insert(n); err != nil {
			return err
		}
		select {
		case _, ok := <-w.Events():
			if !ok {
				return fmt.Errorf("warm-up: events closed: %v", w.Err())
			}
			got++
		case <-time.After(latencyWarmupWait):
		case <-ctx.Done():
			return fmt.Errorf("warm-up: %w", ctx.Err())
		}
	}
	return nil
}

// write inserts the rows 0..len(commitAt)-1 at rate rows per second with writers connections,
// recording when each COMMIT returned.
func (r *latencyRun) write(insert func(n int) error, rate, writers int) error {
	jobs := make(chan int, len(r.commitAt))
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		writeErr error
	)
	for range writers {
		wg.Go(func() {
			for k := range jobs {
				if err := insert(k); err != nil {
					errOnce.Do(func() { writeErr = fmt.Errorf("insert: %w", err) })
					continue
				}
				r.commitAt[k] = time.Since(r.base)
			}
		})
	}
	interval := time.Second / time.Duration(rate)
	for k := range r.commitAt {
		if wait := time.Until(r.base.Add(time.Duration(k) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		jobs <- k
	}
	close(jobs)
	wg.Wait()
	return writeErr
}

// consume receives the measured events, records when each arrived (by the row's n) and its
// changelog id, and acknowledges each. It returns when all arrived, or latencyGrace after
// writersDone closed; events not received keep a zero recvAt.
func (r *latencyRun) consume(ctx context.Context, w *pgchangestream.Watcher, writersDone <-chan struct{}) error {
	var grace <-chan time.Time
	for got := 0; got < len(r.recvAt); {
		var ev pgchangestream.EventWithToken
		select {
		case <-writersDone:
			writersDone = nil
			grace = time.After(latencyGrace)
			continue
		case <-grace:
			return nil
		case e, ok := <-w.Events():
			if !ok {
				return fmt.Errorf("after %d of %d events: events closed: %v", got, len(r.recvAt), w.Err())
			}
			ev = e
		case <-ctx.Done():
			return fmt.Errorf("after %d of %d events: %w", got, len(r.recvAt), ctx.Err())
		}
		at := time.Since(r.base)
		doc, _ := ev.Event["fullDocument"].(map[string]any)
		n, ok := doc["n"].(float64)
		if !ok {
			return fmt.Errorf("event %s has no fullDocument.n", ev.ResumeToken)
		}
		if k := int(n); k >= 0 && k < len(r.recvAt) && r.recvAt[k] == 0 {
			r.recvAt[k] = at
			r.idOf[k], _ = strconv.ParseInt(string(ev.ResumeToken), 10, 64)
			got++
		}
		if err := w.MarkProcessed(ctx, ev.ResumeToken); err != nil {
			return err
		}
	}
	return nil
}

// listenFloor opens a bare LISTEN connection on the trigger's channel that records when each
// notification arrives. stop closes it.
func (r *latencyRun) listenFloor(ctx context.Context, dsn string) (stop func() error, err error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		at := time.Since(r.base)
		var p struct {
			ID int64 `json:"id"`
		}
		if json.Unmarshal([]byte(n.Payload), &p) == nil {
			r.notifyMu.Lock()
			r.notifyAt[p.ID] = at
			r.notifyMu.Unlock()
		}
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("floor listener: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgchangestream.DefaultNotifyChannel).ReadAll(); err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("floor listener: %w", err)
	}
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		for {
			if err := conn.WaitForNotification(lctx); err != nil {
				if lctx.Err() != nil {
					err = nil
				}
				done <- err
				return
			}
		}
	}()
	return func() error {
		cancel()
		err := <-done
		_ = conn.Close(context.WithoutCancel(ctx))
		r.notifyMu.Lock() // the callback ran on the listener goroutine, now finished
		defer r.notifyMu.Unlock()
		return err
	}, nil
}

// summarize computes the latency distribution of the events received (recvAt not zero).
func summarize(commitAt, recvAt []time.Duration, writeEnd time.Duration) latency {
	ms := make([]float64, 0, len(commitAt))
	var l latency
	for k := range commitAt {
		if recvAt[k] == 0 {
			l.Missed++
			continue
		}
		d := recvAt[k] - commitAt[k]
		if d < 0 {
			l.Early++
			d = 0
		}
		ms = append(ms, float64(d)/float64(time.Millisecond))
	}
	l.OfferedRate = float64(len(commitAt)) / writeEnd.Seconds()
	if len(ms) == 0 {
		return l
	}
	slices.Sort(ms)
	pick := func(q float64) float64 { return ms[int(q*float64(len(ms)-1))] }
	l.P50, l.P99, l.Max = pick(0.50), pick(0.99), ms[len(ms)-1]
	l.Events = len(ms)
	return l
}
