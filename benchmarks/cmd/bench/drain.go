package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// drainTimeout bounds one drain, so a stuck watcher fails the run instead of hanging it.
const drainTimeout = 5 * time.Minute

// drainSpec says how a drain acknowledges.
type drainSpec struct {
	// checkpointInterval is Config.CheckpointInterval: 0 saves on every MarkProcessed.
	checkpointInterval time.Duration
	// workers > 0 hands deliveries to that many goroutines, which finish out of order and
	// acknowledge the contiguous watermark; 0 acknowledges each event as it is received. With
	// effectsProcessTx it is ProcessOptions.Workers.
	workers int
	// disableProcessedFlag leaves Config.ProcessedFlag off: no legacy processed flag is set.
	disableProcessedFlag bool
	// unanalyzed skips the ANALYZE after filling the backlog.
	unanalyzed bool
	// shape is the backlog drained: items rows (the default), items rows all written by one
	// transaction, or health_events rows.
	shape backlogShape
	// effects says whether the consumer writes an effect row per event, and how it then
	// acknowledges (effects.go); the effects are checked once the drain is done.
	effects effectMode
	// typed makes the consumer read each event's document into a healthStruct before
	// acknowledging it, as [pgchangestream.Document] gives it.
	typed typedRead
}

// typedRead says whether and how a drain's consumer reads documents into structs.
type typedRead int

const (
	// untyped: the consumer does not read the document.
	untyped typedRead = iota
	// typedFromMap: the watcher builds the document maps as by default.
	typedFromMap
	// typedRaw: the watcher has Config.RawDocuments and builds no document maps.
	typedRaw
)

// backlogShape says which rows a drain's backlog holds.
type backlogShape int

const (
	// itemsShape: items rows of about 200 bytes, fillChunk per transaction.
	itemsShape backlogShape = iota
	// bulkShape: items rows, all inserted by one transaction, so they share one changed_at.
	bulkShape
	// healthShape: health_events rows of about 1 KB, half of them updates, read with
	// DocumentField "document" as the store-client does.
	healthShape
)

// drainConfig is the watcher configuration of a drain of client as spec says.
func (d *database) drainConfig(client string, spec drainSpec) pgchangestream.Config {
	cfg := d.watcherConfig(client)
	cfg.CheckpointInterval = spec.checkpointInterval
	cfg.ProcessedFlag = !spec.disableProcessedFlag // New leaves the flag off by default
	cfg.RawDocuments = spec.typed == typedRaw
	if spec.shape == healthShape {
		cfg.TableName, cfg.DocumentField = healthTable, "document"
	}
	return cfg
}

// drain reads n events through a new watcher of client, which resumes from the start position
// saveStart saved before they were written, acknowledging every one as spec says, then flushes
// the checkpoint and, unless the processed flag is disabled, waits until the watcher's background
// marker has marked every drained row (those after changelog id after). It returns the time from
// Start until then (the marking's catch-up included), after checking that the saved token has
// the form of the schema's reads.
func drain(ctx context.Context, d *database, client string, n int, spec drainSpec, after int64) (time.Duration, error) {
	w, err := pgchangestream.New(d.drainConfig(client, spec))
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	defer func() { _ = w.Close(context.WithoutCancel(ctx)) }()
	if spec.effects != noEffects {
		if err := d.createEffects(ctx); err != nil {
			return 0, err
		}
	}

	start := time.Now()
	w.Start(ctx)
	switch {
	case spec.effects == effectsProcessTx:
		err = consumeProcessTx(ctx, w, d, n, spec.workers)
	case spec.effects == effectsByHand:
		err = consumeByHand(ctx, w, d, n, spec.workers)
	case spec.effects != noEffects:
		err = consumeWithEffects(ctx, w, d, n, spec.effects)
	case spec.workers > 0:
		// The work itself: yield a random number of times, so that workers finish out of
		// order as real ones would.
		err = consumeConcurrently(ctx, w, n, spec.workers, func([]byte) error {
			for range rand.IntN(4) {
				runtime.Gosched()
			}
			return nil
		})
	default:
		err = consumeInOrder(ctx, w, n, spec.typed != untyped)
	}
	if err == nil {
		err = w.Flush(ctx)
	}
	if err == nil && !spec.disableProcessedFlag {
		err = d.waitMarked(ctx, d.drainConfig(client, spec).TableName, after)
	}
	elapsed := time.Since(start)
	if err != nil {
		return 0, err
	}
	// The checkpoint must name the newest row read. It need not equal the cursor: on the
	// upgraded schema the reader's last, short read of the delta moves the cursor on to the
	// start of the next one, which may happen after the flush; both name the same row.
	if st := w.Stats(); st.Pending != 0 || st.Checkpoint.ID != st.Cursor.ID || !st.Checkpoint.ChangedAt.Equal(st.Cursor.ChangedAt) {
		return 0, fmt.Errorf("drain ended with %d pending, checkpoint %v, cursor %v", st.Pending, st.Checkpoint, st.Cursor)
	}
	return elapsed, d.checkTokenForm(ctx, client)
}

// newestID returns the highest changelog id, 0 for an empty changelog: the rows written after it
// are a drain's backlog.
func (d *database) newestID(ctx context.Context) (int64, error) {
	var id int64
	err := d.QueryRowContext(ctx, `SELECT coalesce(max(id), 0) FROM `+changelogTable).Scan(&id)
	return id, err
}

// waitMarked waits until no changelog row of table after id after is left unmarked by the
// processed flag.
func (d *database) waitMarked(ctx context.Context, table string, after int64) error {
	for {
		var unmarked int
		err := d.QueryRowContext(ctx, `SELECT count(*) FROM `+changelogTable+` WHERE table_name = $1 AND id > $2 AND NOT processed`,
			table, after).Scan(&unmarked)
		if err != nil || unmarked == 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d drained rows never marked processed: %w", unmarked, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// receive takes the next delivery, failing if Events closed or ctx ended.
func receive(ctx context.Context, w *pgchangestream.Watcher) (pgchangestream.EventWithToken, error) {
	select {
	case ev, ok := <-w.Events():
		if !ok {
			return ev, fmt.Errorf("events closed early: %v", w.Err())
		}
		return ev, nil
	case <-ctx.Done():
		return pgchangestream.EventWithToken{}, fmt.Errorf("waiting for an event: %w", ctx.Err())
	}
}

// consumeInOrder acknowledges every event as it is received; typed first reads its document
// into a healthStruct.
func consumeInOrder(ctx context.Context, w *pgchangestream.Watcher, n int, typed bool) error {
	for range n {
		ev, err := receive(ctx, w)
		if err != nil {
			return err
		}
		if typed {
			if doc, err := pgchangestream.Document[healthStruct](ev); err != nil || doc.HealthEvent.NodeName == "" {
				return fmt.Errorf("read the document of event %s: %v", ev.ResumeToken, err)
			}
		}
		if err := w.MarkProcessed(ctx, ev.ResumeToken); err != nil {
			return err
		}
	}
	return nil
}

// watermark tracks the deliveries finished out of order and the contiguous prefix of them.
type watermark struct {
	mu     sync.Mutex
	tokens [][]byte // by delivery number; written by the dispatcher before the job is sent
	done   []bool   // guarded by mu
	next   int      // lowest unfinished delivery number; guarded by mu
}

// finish records delivery seq as done. If the contiguous prefix grew, it returns the token of
// the newest delivery in it.
func (m *watermark) finish(seq int) (token []byte, advanced bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.done[seq] = true
	old := m.next
	for m.next < len(m.done) && m.done[m.next] {
		m.next++
	}
	if m.next == old {
		return nil, false
	}
	return m.tokens[m.next-1], true
}

// consumeConcurrently numbers deliveries in receive order and hands them to workers, which run
// work on each and finish in any order; a worker whose finish advances the contiguous watermark
// acknowledges it.
func consumeConcurrently(ctx context.Context, w *pgchangestream.Watcher, n, workers int, work func([]byte) error) error {
	m := &watermark{tokens: make([][]byte, n), done: make([]bool, n)}
	jobs := make(chan int, workers)
	errs := make(chan error, workers+1)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for seq := range jobs {
				if err := work(m.tokens[seq]); err != nil {
					errs <- err
					return
				}
				if token, ok := m.finish(seq); ok {
					if err := w.MarkProcessed(ctx, token); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	var dispatchErr error
	for seq := 0; seq < n && dispatchErr == nil; seq++ {
		ev, err := receive(ctx, w)
		if err != nil {
			dispatchErr = err
			break
		}
		m.tokens[seq] = ev.ResumeToken
		select {
		case jobs <- seq:
		case err := <-errs:
			dispatchErr = err
		}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	for err := range errs {
		dispatchErr = errors.Join(dispatchErr, err)
	}
	return dispatchErr
}

// drainClient is the client name of the drains.
const drainClient = "bench"

// drainFresh copies the variant's template, saves a client's start position, fills a backlog
// of n rows and drains it with that client.
func drainFresh(ctx context.Context, e *env, v variant, n int, spec drainSpec) (time.Duration, error) {
	d, err := e.newDatabase(ctx, v)
	if err != nil {
		return 0, err
	}
	defer d.drop(ctx)
	if err := d.saveStart(ctx, d.drainConfig(drainClient, spec)); err != nil {
		return 0, err
	}
	after, err := d.newestID(ctx)
	if err != nil {
		return 0, err
	}
	if err := d.fill(ctx, n, spec); err != nil {
		return 0, err
	}
	return drain(ctx, d, drainClient, n, spec, after)
}

// fill writes the backlog spec describes: n changelog rows.
func (d *database) fill(ctx context.Context, n int, spec drainSpec) error {
	switch {
	case spec.shape == healthShape:
		return d.fillHealth(ctx, n)
	case spec.shape == bulkShape:
		return d.fillItemsBulk(ctx, n)
	case spec.unanalyzed:
		return d.fillItemsUnanalyzed(ctx, n)
	}
	return d.fillItems(ctx, n)
}

// retainedSetup is a database whose changelog holds many rows of the items table that an
// earlier consumer has processed, behind every client's cursor.
type retainedSetup struct {
	d      *database
	client int
}

// newRetained fills a fresh database with retained rows.
func newRetained(ctx context.Context, e *env, retained int) (*retainedSetup, error) {
	d, err := e.newDatabase(ctx, upgraded)
	if err != nil {
		return nil, err
	}
	if err := d.fillChangelog(ctx, retained, time.Hour, true); err != nil {
		d.drop(ctx)
		return nil, err
	}
	return &retainedSetup{d: d}, nil
}

// drainNew saves a new client's start position after the newest row, adds n rows through the
// trigger and drains them with that client. Rows of earlier calls stay behind, so the changelog
// grows by n per call.
func (r *retainedSetup) drainNew(ctx context.Context, n int, spec drainSpec) (time.Duration, error) {
	r.client++
	client := fmt.Sprintf("retained-%d", r.client)
	if err := r.d.saveStart(ctx, r.d.drainConfig(client, spec)); err != nil {
		return 0, err
	}
	after, err := r.d.newestID(ctx)
	if err != nil {
		return 0, err
	}
	if err := r.d.fillItems(ctx, n); err != nil {
		return 0, err
	}
	return drain(ctx, r.d, client, n, spec, after)
}
