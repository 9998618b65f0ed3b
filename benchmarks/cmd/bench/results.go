package main

import (
	"context"
	"slices"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// batchedInterval is the CheckpointInterval of the batched drains.
const batchedInterval = 100 * time.Millisecond

// concurrentWorkers is the number of workers of the concurrent drain.
const concurrentWorkers = 8

// latencyModes are the modes whose latency is measured, in order.
var latencyModes = []pgchangestream.Mode{pgchangestream.ModeHybrid, pgchangestream.ModePolling}

// throughput is one figure measured once per repetition: count items in the returned time.
type throughput struct {
	key   string
	count int
	run   func(ctx context.Context, e *env) (time.Duration, error)
}

// throughputs lists the throughput figures, in the order they run in each repetition.
func throughputs(o options) []throughput {
	n := o.rows
	drainWith := func(spec drainSpec) func(context.Context, *env) (time.Duration, error) {
		return func(ctx context.Context, e *env) (time.Duration, error) { return drainFresh(ctx, e, n, spec) }
	}
	// Figures compared by a target run next to each other, so that load from outside the run
	// hits both alike.
	return []throughput{
		{"upsert_limit_wps", n, func(ctx context.Context, e *env) (time.Duration, error) { return upserts(ctx, e, n) }},
		{"drain_sync_eps", n, drainWith(drainSpec{})},
		{"drain_sync_noflag_eps", n, drainWith(drainSpec{disableProcessedFlag: true})},
		{"drain_sync_concurrent_eps", n, drainWith(drainSpec{workers: concurrentWorkers})},
		{"watermill_eps", n, func(ctx context.Context, e *env) (time.Duration, error) { return watermillDrain(ctx, e, n) }},
		{"drain_batched_eps", n, drainWith(drainSpec{checkpointInterval: batchedInterval})},
		{"select_decode_limit_rps", n, func(ctx context.Context, e *env) (time.Duration, error) {
			return selectDecodeFresh(ctx, e, n)
		}},
		{"drain_batched_noflag_eps", n, drainWith(drainSpec{checkpointInterval: batchedInterval, disableProcessedFlag: true})},
		{"drain_batched_unanalyzed_eps", n, drainWith(drainSpec{checkpointInterval: batchedInterval, unanalyzed: true})},
	}
}

// params are the run's settings, as reported.
type params struct {
	Rows            int     `json:"rows"`
	Reps            int     `json:"reps"`
	LatencySeconds  float64 `json:"latency_seconds"`
	LatencyRate     int     `json:"latency_rate"`
	SaturationRows  int     `json:"saturation_rows"`
	RetainedRows    int     `json:"retained_rows"`
	Quick           bool    `json:"quick"`
	BatchedInterval string  `json:"batched_checkpoint_interval"`
}

// results are the figures of one run. Throughputs are medians of the repetitions.
type results struct {
	DrainSyncEPS           float64            `json:"drain_sync_eps"`
	DrainBatchedEPS        float64            `json:"drain_batched_eps"`
	DrainSyncConcurrentEPS float64            `json:"drain_sync_concurrent_eps"`
	WatermillEPS           float64            `json:"watermill_eps"`
	SelectDecodeLimitRPS   float64            `json:"select_decode_limit_rps"`
	UpsertLimitWPS         float64            `json:"upsert_limit_wps"`
	LatencyMS              map[string]latency `json:"latency_ms,omitempty"`
	SaturationHeapMB       *saturationResult  `json:"saturation_heap_mb,omitempty"`
	RetainedDrainRatio     float64            `json:"retained_drain_ratio"`

	// DrainSyncNoFlagEPS is drain_sync with DisableProcessedFlag: the cost of the legacy flag.
	DrainSyncNoFlagEPS float64 `json:"drain_sync_noflag_eps"`
	// DrainBatchedNoFlagEPS is drain_batched with DisableProcessedFlag.
	DrainBatchedNoFlagEPS float64 `json:"drain_batched_noflag_eps"`
	// DrainBatchedUnanalyzedEPS is drain_batched on a changelog never analyzed.
	DrainBatchedUnanalyzedEPS float64 `json:"drain_batched_unanalyzed_eps"`
	// RetainedDrainRatioSync and RetainedDrainRatioNoFlag are the retained ratio of drains
	// with per-ack saves, and of batched drains without the processed flag (reads alone).
	RetainedDrainRatioSync   float64 `json:"retained_drain_ratio_sync"`
	RetainedDrainRatioNoFlag float64 `json:"retained_drain_ratio_noflag"`
	// Micro holds the library's micro-benchmarks, when run.
	Micro *microResults `json:"micro,omitempty"`

	Samples     map[string][]float64 `json:"samples"`
	Params      params               `json:"params"`
	WallSeconds float64              `json:"wall_seconds"`
}

func newResults(o options) *results {
	return &results{
		Samples: map[string][]float64{},
		Params: params{
			Rows: o.rows, Reps: o.reps, LatencySeconds: o.latencyDuration.Seconds(), LatencyRate: o.latencyRate,
			SaturationRows: o.saturationRows, RetainedRows: o.retainedRows, Quick: o.quick,
			BatchedInterval: batchedInterval.String(),
		},
	}
}

// setMedians sets the throughput figures from their samples.
func (r *results) setMedians() {
	for key, dst := range map[string]*float64{
		"drain_sync_eps":               &r.DrainSyncEPS,
		"drain_batched_eps":            &r.DrainBatchedEPS,
		"drain_sync_concurrent_eps":    &r.DrainSyncConcurrentEPS,
		"drain_sync_noflag_eps":        &r.DrainSyncNoFlagEPS,
		"drain_batched_noflag_eps":     &r.DrainBatchedNoFlagEPS,
		"drain_batched_unanalyzed_eps": &r.DrainBatchedUnanalyzedEPS,
		"watermill_eps":                &r.WatermillEPS,
		"select_decode_limit_rps":      &r.SelectDecodeLimitRPS,
		"upsert_limit_wps":             &r.UpsertLimitWPS,
	} {
		*dst = median(r.Samples[key])
	}
}

// median returns the median of xs (the mean of the middle two for an even count), 0 if empty.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// target is one comparison of the run against its goal.
type target struct {
	name  string  // what is compared
	value float64 // the measured ratio or figure
	goal  float64
	le    bool // the goal is an upper bound (value <= goal); otherwise a lower bound
	unit  string
	ok    bool // the inputs were measured
}

// pass reports whether the target is met.
func (t target) pass() bool {
	if t.le {
		return t.value <= t.goal
	}
	return t.value >= t.goal
}

// targets evaluates the goals that the run's figures allow.
func (r *results) targets() []target {
	ratio := func(a, b float64) (float64, bool) {
		if a == 0 || b == 0 {
			return 0, false
		}
		return a / b, true
	}
	var ts []target
	add := func(name string, v float64, ok bool, goal float64, le bool, unit string) {
		ts = append(ts, target{name: name, value: v, goal: goal, le: le, unit: unit, ok: ok})
	}
	v, ok := ratio(r.DrainSyncEPS, r.UpsertLimitWPS)
	add("drain_sync / upsert_limit", v, ok, 0.8, false, "x")
	v, ok = ratio(r.DrainBatchedEPS, r.WatermillEPS)
	add("drain_batched / watermill", v, ok, 2, false, "x")
	v, ok = ratio(r.DrainBatchedEPS, r.SelectDecodeLimitRPS)
	add("drain_batched / select_decode_limit", v, ok, 0.5, false, "x")
	// The same three without the legacy processed flag, to show what it costs.
	v, ok = ratio(r.DrainSyncNoFlagEPS, r.UpsertLimitWPS)
	add("(no processed flag) drain_sync / upsert_limit", v, ok, 0.8, false, "x")
	v, ok = ratio(r.DrainBatchedNoFlagEPS, r.WatermillEPS)
	add("(no processed flag) drain_batched / watermill", v, ok, 2, false, "x")
	v, ok = ratio(r.DrainBatchedNoFlagEPS, r.SelectDecodeLimitRPS)
	add("(no processed flag) drain_batched / select_decode_limit", v, ok, 0.5, false, "x")
	if l, ok := r.LatencyMS["hybrid"]; ok {
		add("hybrid latency p50", l.P50, true, 2, true, "ms")
		add("hybrid latency p99", l.P99, true, 20, true, "ms")
	}
	if l, ok := r.LatencyMS["polling"]; ok {
		add("polling latency p50 vs PollInterval", l.P50, true,
			float64(pgchangestream.DefaultPollInterval)/float64(time.Millisecond), true, "ms")
	}
	if m := r.Micro; m != nil && r.DrainBatchedEPS > 0 {
		perEvent := 1e9 / r.DrainBatchedEPS
		add("pending push+ack / drain_batched per-event cost", 100*m.PushAckNs/perEvent, true, 3, true, "%")
		add("pending push+ack allocations", m.PushAckAllocs, true, 0, true, "allocs/op")
	}
	if s := r.SaturationHeapMB; s != nil {
		add(heapGrowthName(s.Deliveries), s.AfterAllMB-s.AfterEarlyMB, true, heapGrowthGoalMB, true, "MB")
	}
	if r.RetainedDrainRatio > 0 {
		add("retained_drain_ratio", r.RetainedDrainRatio, true, 1.2, true, "x")
		add("(per-ack saves) retained_drain_ratio", r.RetainedDrainRatioSync, true, 1.2, true, "x")
		add("(no processed flag) retained_drain_ratio", r.RetainedDrainRatioNoFlag, true, 1.2, true, "x")
	}
	return ts
}

// heapGrowthGoalMB is "within a few MB": the most the heap may grow between the two samples.
const heapGrowthGoalMB = 4

func heapGrowthName(total int) string {
	return "heap growth, " + countLabel(saturationEarly) + " to " + countLabel(total) + " unacked"
}

// countLabel formats a count as 10k, 1M, 250k.
func countLabel(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return itoa(n/1_000_000) + "M"
	case n >= 1000 && n%1000 == 0:
		return itoa(n/1000) + "k"
	}
	return itoa(n)
}
