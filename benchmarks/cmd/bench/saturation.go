package main

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// saturationEarly is the number of deliveries after which the first heap sample is taken.
const saturationEarly = 10_000

// saturationResult is the heap in use after a number of deliveries that were never
// acknowledged, with the default MaxPending.
type saturationResult struct {
	AfterEarlyMB float64 `json:"after_10000"`
	AfterAllMB   float64 `json:"after_total"`
	Deliveries   int     `json:"total_deliveries"`
	Evicted      uint64  `json:"evicted"`
	Pending      int     `json:"pending"`
}

// heapMB returns the live heap after a full collection, in MiB.
func heapMB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}

// saturation saves a client's start position, fills the changelog with total rows (directly,
// bypassing the trigger), then receives all of them in snapshot deltas through a watcher with the default MaxPending without acknowledging
// any, and samples the heap after saturationEarly deliveries and after the last. The consumer
// stops receiving while it samples, so the watcher is blocked on a full Events channel each
// time.
func saturation(ctx context.Context, e *env, total int) (saturationResult, error) {
	d, err := e.newDatabase(ctx, upgraded)
	if err != nil {
		return saturationResult{}, err
	}
	defer d.drop(ctx)
	cfg := d.watcherConfig("saturation")
	if err := d.saveStart(ctx, cfg); err != nil {
		return saturationResult{}, err
	}
	if err := d.fillChangelog(ctx, total, time.Hour, false); err != nil {
		return saturationResult{}, err
	}
	w, err := pgchangestream.New(cfg)
	if err != nil {
		return saturationResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*drainTimeout)
	defer cancel()
	w.Start(ctx)
	defer func() { _ = w.Close(context.WithoutCancel(ctx)) }()

	r := saturationResult{Deliveries: total}
	for i := 1; i <= total; i++ {
		if _, err := receive(ctx, w); err != nil {
			return r, fmt.Errorf("after %d deliveries: %w", i-1, err)
		}
		if i == min(saturationEarly, total) {
			r.AfterEarlyMB = heapMB()
		}
	}
	r.AfterAllMB = heapMB()
	st := w.Stats()
	r.Evicted, r.Pending = st.Evicted, st.Pending
	if st.Pending != pgchangestream.DefaultMaxPending || !st.FloorActive {
		return r, fmt.Errorf("saturation: %d pending (floor %v), want %d with a floor",
			st.Pending, st.FloorActive, pgchangestream.DefaultMaxPending)
	}
	return r, nil
}
