package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
	return []throughput{
		fig("process_noop_w8_eps", "Process, Workers 8, no-op handler, "+itoa(processKeys)+" keys", processSpec{workers: 8}),
		bounded("process_sleep2ms_w8_eps", "Process, Workers 8, handler sleeps 2 ms, "+itoa(processKeys)+" keys",
			processSpec{workers: 8, sleep: processHandleTime}),
		bounded("process_sleep2ms_w64_eps", "Process, Workers 64, handler sleeps 2 ms, "+itoa(processKeys)+" keys",
			processSpec{workers: 64, sleep: processHandleTime}),
		hot,
	}
}

// handlerBoundKey is the key of the handler-bound figure of the Process figure key.
func handlerBoundKey(key string) string {
	return strings.TrimSuffix(key, "_eps") + "_handler_bound_eps"
}

// processFresh fills a fresh database with n rows behind a saved start and processes them. It
// returns the time from Start until the last of them finished (with s.hot: the last event of the
// other keys; Process is then stopped, the hot key's backlog left), and the sum of the handlers'
// durations (Stats().Process.HandlerTime).
func processFresh(ctx context.Context, e *env, v variant, n int, s processSpec) (time.Duration, time.Duration, error) {
	d, err := e.newDatabase(ctx, v)
	if err != nil {
		return 0, 0, err
	}
	defer d.drop(ctx)
	const client = "bench"
	spec := drainSpec{checkpointInterval: batchedInterval}
	if err := d.saveStart(ctx, d.drainConfig(client, spec)); err != nil {
		return 0, 0, err
	}
	after, err := d.newestID(ctx)
	if err != nil {
		return 0, 0, err
	}
	if err := d.fill(ctx, n, spec); err != nil {
		return 0, 0, err
	}
	if newest, err := d.newestID(ctx); err != nil || newest != after+int64(n) {
		return 0, 0, fmt.Errorf("backlog ids %d..%d, want %d consecutive ones (%v)", after+1, newest, n, err)
	}
	want := int64(n)
	if s.hot {
		want = int64(n) - countEven(after+1, after+int64(n))
	}
	w, err := pgchangestream.New(d.drainConfig(client, spec))
	if err != nil {
		return 0, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	defer func() { _ = w.Close(context.WithoutCancel(ctx)) }()
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
