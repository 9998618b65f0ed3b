package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// Process figures: Watcher.Process over the backlog of drain_batched (CheckpointInterval
// batchedInterval), its events keyed by changelog id.
const (
	processKeys       = 1000                 // distinct keys of the 2 ms figures
	processHandleTime = 2 * time.Millisecond // the 2 ms handler's sleep
	processHotKey     = "hot"                // the key of the even changelog ids in process_hotkey
	// processHotDeferred is process_hotkey's ProcessOptions.MaxDeferred: 64 × the default
	// MaxInFlight deferred events at most.
	processHotDeferred = 64 * pgchangestream.DefaultProcessMaxInFlight
	// eventsSleepKey is the figure of the 2 ms sleeps of 64 goroutines without Process.
	eventsSleepKey = "events_sleep2ms_w64_eps"
)

// processSpec is one Process figure.
type processSpec struct {
	workers int
	sleep   time.Duration // the handler's; 0: a no-op handler
	hot     bool          // half the events (even ids) share one key; the figure is the others' rate
}

// processThroughputs are the Process figures over backlogs of n rows.
func processThroughputs(n int) []throughput {
	fig := func(key, what string, s processSpec) throughput {
		return throughput{figs: []figureSpec{{key, what}}, count: n, run: func(ctx context.Context, e *env, v variant) ([]time.Duration, error) {
			d, _, err := processFresh(ctx, e, v, n, s)
			return []time.Duration{d}, err
		}}
	}
	// bounded is fig with a second figure, key_handler_bound_eps: the rate the handlers' own
	// durations allow, n ÷ (their sum ÷ Workers), what Process would reach if it cost nothing.
	bounded := func(key, what string, s processSpec) throughput {
		t := fig(key, what, s)
		t.figs = append(t.figs, figureSpec{handlerBoundKey(key), "the rate " + key + "'s handlers allow: " +
			"events ÷ (Stats().Process.HandlerTime ÷ Workers), the handlers' durations as measured in the run"})
		t.run = func(ctx context.Context, e *env, v variant) ([]time.Duration, error) {
			d, handlers, err := processFresh(ctx, e, v, n, s)
			return []time.Duration{d, handlers / time.Duration(s.workers)}, err
		}
		return t
	}
	hot := fig("process_hotkey_w64_eps", "process_sleep2ms_w64 with one key holding half the events (even ids) and MaxDeferred "+
		itoa(processHotDeferred)+": the other keys' own rate", processSpec{workers: 64, sleep: processHandleTime, hot: true})
	hot.count = n / 2 // the odd ids of n consecutive ones
	floor := throughput{figs: []figureSpec{{eventsSleepKey, "no Process: 64 goroutines take Events() and sleep 2 ms per " +
		"event, acknowledging nothing: the rate those sleeps allow beside the watcher's reads"}}, count: n,
		run: func(ctx context.Context, e *env, v variant) ([]time.Duration, error) {
			d, err := eventsSleepFresh(ctx, e, v, n, 64)
			return []time.Duration{d}, err
		}}
	return []throughput{
		fig("process_noop_w8_eps", "Process, Workers 8, no-op handler, "+itoa(processKeys)+" keys", processSpec{workers: 8}),
		bounded("process_sleep2ms_w8_eps", "Process, Workers 8, handler sleeps 2 ms, "+itoa(processKeys)+" keys",
			processSpec{workers: 8, sleep: processHandleTime}),
		bounded("process_sleep2ms_w64_eps", "Process, Workers 64, handler sleeps 2 ms, "+itoa(processKeys)+" keys",
			processSpec{workers: 64, sleep: processHandleTime}),
		floor,
		hot,
	}
}

// handlerBoundKey is the key of the handler-bound figure of the Process figure key.
func handlerBoundKey(key string) string {
	return strings.TrimSuffix(key, "_eps") + "_handler_bound_eps"
}

// processBacklog is a fresh database holding n consecutive changelog rows (ids first..first+n-1)
// behind a saved start, and a watcher of drain_batched's configuration (New's defaults: no
// processed flag; CheckpointInterval batchedInterval) that resumes there, not started. close
// closes the watcher and drops the database.
type processBacklog struct {
	w     *pgchangestream.Watcher
	first int64
	close func()
}

func newProcessBacklog(ctx context.Context, e *env, v variant, n int) (*processBacklog, error) {
	d, err := e.newDatabase(ctx, v)
	if err != nil {
		return nil, err
	}
	spec := drainSpec{checkpointInterval: batchedInterval, disableProcessedFlag: true}
	w, first, err := func() (*pgchangestream.Watcher, int64, error) {
		if err := d.saveStart(ctx, d.drainConfig(drainClient, spec)); err != nil {
			return nil, 0, err
		}
		after, err := d.newestID(ctx)
		if err != nil {
			return nil, 0, err
		}
		if err := d.fill(ctx, n, spec); err != nil {
			return nil, 0, err
		}
		if newest, err := d.newestID(ctx); err != nil || newest != after+int64(n) {
			return nil, 0, fmt.Errorf("backlog ids %d..%d, want %d consecutive ones (%v)", after+1, newest, n, err)
		}
		w, err := pgchangestream.New(d.drainConfig(drainClient, spec))
		return w, after + 1, err
	}()
	if err != nil {
		d.drop(ctx)
		return nil, err
	}
	return &processBacklog{w: w, first: first, close: func() {
		_ = w.Close(context.WithoutCancel(ctx))
		d.drop(ctx)
	}}, nil
}

// processFresh processes a fresh processBacklog of n rows. It returns the time from Start until
// the last of them finished (with s.hot: the last event of the other keys; Process is then
// stopped, the hot key's backlog left), and the sum of the handlers' durations
// (Stats().Process.HandlerTime).
func processFresh(ctx context.Context, e *env, v variant, n int, s processSpec) (time.Duration, time.Duration, error) {
	b, err := newProcessBacklog(ctx, e, v, n)
	if err != nil {
		return 0, 0, err
	}
	defer b.close()
	w := b.w
	want := int64(n)
	if s.hot {
		want = int64(n) - countEven(b.first, b.first+int64(n)-1)
	}
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	var done atomic.Int64
	var elapsed atomic.Int64
	start := time.Now()
	handle := func(ctx context.Context, ev pgchangestream.EventWithToken) error {
		if s.sleep > 0 {
			time.Sleep(s.sleep)
		}
		if s.hot && processKey(ev, true) == processHotKey {
			return nil
		}
		if done.Add(1) == want {
			elapsed.Store(int64(time.Since(start)))
			stop()
		}
		return nil
	}
	w.Start(ctx)
	opts := pgchangestream.ProcessOptions{Workers: s.workers,
		Key: func(ev pgchangestream.EventWithToken) string { return processKey(ev, s.hot) }}
	if s.hot { // the other keys flow past the hot one: its events past MaxKeyQueue are deferred
		opts.MaxDeferred = processHotDeferred
	}
	err = w.Process(pctx, opts, handle)
	if err != nil {
		return 0, 0, err
	}
	if done.Load() != want {
		return 0, 0, fmt.Errorf("process ended with %d of %d events finished: %w", done.Load(), want, errors.Join(ctx.Err(), w.Err()))
	}
	return time.Duration(elapsed.Load()), w.Stats().Process.HandlerTime, nil
}

// eventsSleepFresh takes the events of a fresh processBacklog of n rows from Events() with
// workers goroutines, each sleeping processHandleTime per event, and acknowledges nothing: the
// rate those sleeps allow beside the watcher's reads and decoding, with no Process (no keys, no
// mark, no saves). It returns the time from Start until the last sleep ended.
func eventsSleepFresh(ctx context.Context, e *env, v variant, n, workers int) (time.Duration, error) {
	b, err := newProcessBacklog(ctx, e, v, n)
	if err != nil {
		return 0, err
	}
	defer b.close()
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	var left atomic.Int64
	left.Store(int64(n))
	finished := make(chan struct{})
	start := time.Now()
	b.w.Start(ctx)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case _, ok := <-b.w.Events():
					if !ok {
						return
					}
					time.Sleep(processHandleTime)
					if left.Add(-1) == 0 {
						close(finished)
					}
				}
			}
		})
	}
	defer wg.Wait()
	defer cancel() // before the wait: the goroutines return
	select {
	case <-finished:
		return time.Since(start), nil
	case <-ctx.Done():
		return 0, fmt.Errorf("%d of %d events slept: %w (%v)", int64(n)-left.Load(), n, ctx.Err(), b.w.Err())
	}
}

// processKey keys an event by its changelog id: processKeys keys, and with hot the even ids
// under processHotKey.
func processKey(ev pgchangestream.EventWithToken, hot bool) string {
	id, _ := strconv.ParseInt(string(ev.ResumeToken), 10, 64)
	if hot && id%2 == 0 {
		return processHotKey
	}
	return strconv.FormatInt(id%processKeys, 10)
}

// countEven is the number of even integers in [lo, hi].
func countEven(lo, hi int64) int64 {
	return hi/2 - (lo-1)/2
}
