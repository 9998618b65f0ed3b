package main

import (
	"slices"
	"time"
)

// batchedInterval is the CheckpointInterval of the batched drains.
const batchedInterval = 100 * time.Millisecond

// concurrentWorkers is the number of workers of the concurrent drain.
const concurrentWorkers = 8

// params are the run's settings, as reported.
type params struct {
	Rows            int      `json:"rows"`
	Reps            int      `json:"reps"`
	LatencySeconds  float64  `json:"latency_seconds"`
	LatencyRate     int      `json:"latency_rate"`
	SaturationRows  int      `json:"saturation_rows"`
	RetainedRows    int      `json:"retained_rows"`
	Quick           bool     `json:"quick"`
	BatchedInterval string   `json:"batched_checkpoint_interval"`
	Backlogs        []int    `json:"backlogs"`
	Variants        []string `json:"variants"`
}

// stat is the spread of one figure over the repetitions.
type stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// backlogResult is the drain of one backlog size against watermill on the same backlog.
type backlogResult struct {
	Rows               int     `json:"rows"`
	Variant            string  `json:"variant"`
	DrainBatchedEPS    float64 `json:"drain_batched_eps"`
	WatermillEPS       float64 `json:"watermill_eps"`
	WatermillDecodeEPS float64 `json:"watermill_decode_eps"`
	// RatioDecode is DrainBatchedEPS ÷ WatermillDecodeEPS, RatioRaw the same against the raw
	// consumer.
	RatioDecode float64 `json:"ratio_vs_watermill_decode"`
	RatioRaw    float64 `json:"ratio_vs_watermill"`
}

// results are the figures of one run. Throughputs are medians of the repetitions; figures
// without a variant label are of the upgraded schema.
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
	// DrainBatchedFlagEPS is drain_batched with Config.ProcessedFlag (drain_batched has New's
	// defaults: no flag).
	DrainBatchedFlagEPS float64 `json:"drain_batched_flag_eps"`
	// DrainBatchedUnanalyzedEPS is drain_batched on a changelog never analyzed.
	DrainBatchedUnanalyzedEPS float64 `json:"drain_batched_unanalyzed_eps"`
	// RetainedDrainRatioSync and RetainedDrainRatioNoFlag are the retained ratio of drains
	// with per-ack saves, and of batched drains without the processed flag (reads alone).
	RetainedDrainRatioSync   float64 `json:"retained_drain_ratio_sync"`
	RetainedDrainRatioNoFlag float64 `json:"retained_drain_ratio_noflag"`
	// Micro holds the library's micro-benchmarks, when run.
	Micro *microResults `json:"micro,omitempty"`

	// WatermillDecodeEPS is watermill_eps with a consumer that decodes each payload.
	WatermillDecodeEPS float64 `json:"watermill_decode_eps"`
	// WatcherReadLimitRPS is the read ceiling measured with the watcher's own reads.
	WatcherReadLimitRPS float64 `json:"watcher_read_limit_rps"`
	// WatcherReadLimitHealthRPS is the read ceiling of the health_events rows of drain_health.
	WatcherReadLimitHealthRPS float64 `json:"watcher_read_limit_health_rps"`
	// DrainHealthEPS is drain_batched of health_events rows of about 1 KB, half updates.
	DrainHealthEPS float64 `json:"drain_health_eps"`
	// DrainHealthTypedEPS is drain_health with each document read into a struct by Document;
	// DrainHealthRawEPS the same with Config.RawDocuments.
	DrainHealthTypedEPS float64 `json:"drain_health_typed_eps"`
	DrainHealthRawEPS   float64 `json:"drain_health_raw_eps"`
	// DrainBulkSyncEPS is drain_sync of a backlog written by one transaction.
	DrainBulkSyncEPS float64 `json:"drain_bulk_sync_eps"`
	// Insert4wRPS is the insert rate of hybridWriters writers through the trigger.
	Insert4wRPS float64 `json:"insert_4w_rps"`
	// Backlogs are the drains of each backlog size, per variant, against watermill.
	Backlogs []backlogResult `json:"backlogs,omitempty"`
	// Variants holds, per variant, the median of every figure measured on each schema.
	Variants map[string]map[string]float64 `json:"variants,omitempty"`
	// DeltaVsLegacy is, for every figure measured on both schemas, its median on the upgraded
	// schema (snapshot-delta reads, txid column) ÷ its median on the legacy one; for latency,
	// the same of each quantile.
	DeltaVsLegacy map[string]float64 `json:"delta_vs_legacy,omitempty"`
	// DeltaGoals are the goals of the comparison and whether each passed.
	DeltaGoals []comparedGoal `json:"delta_goals,omitempty"`
	// Stats is the median, minimum and maximum of every sampled figure.
	Stats map[string]stat `json:"stats"`

	Samples     map[string][]float64 `json:"samples"`
	Params      params               `json:"params"`
	WallSeconds float64              `json:"wall_seconds"`
}

func newResults(o options) *results {
	vs := make([]string, len(o.variants))
	for i, v := range o.variants {
		vs[i] = string(v)
	}
	return &results{
		Samples: map[string][]float64{},
		Stats:   map[string]stat{},
		Params: params{
			Rows: o.rows, Reps: o.reps, LatencySeconds: o.latencyDuration.Seconds(), LatencyRate: o.latencyRate,
			SaturationRows: o.saturationRows, RetainedRows: o.retainedRows, Quick: o.quick,
			BatchedInterval: batchedInterval.String(), Backlogs: o.backlogs, Variants: vs,
		},
	}
}

// variantsRun returns the variants of the run.
func (r *results) variantsRun() []variant {
	vs := make([]variant, len(r.Params.Variants))
	for i, v := range r.Params.Variants {
		vs[i] = variant(v)
	}
	return vs
}

// fig returns the median of figure key on variant v, 0 if it was not measured.
func (r *results) fig(key string, v variant) float64 { return r.Stats[v.key(key)].Median }

// setMedians sets the reported figures from the samples of the measurements ts, and the
// comparison of the schema variants.
func (r *results) setMedians(ts []throughput) {
	for key, xs := range r.Samples {
		r.Stats[key] = stat{Median: median(xs), Min: slices.Min(xs), Max: slices.Max(xs), N: len(xs)}
	}
	for key, dst := range map[string]*float64{
		"drain_sync_eps":                &r.DrainSyncEPS,
		"drain_batched_eps":             &r.DrainBatchedEPS,
		"drain_sync_concurrent_eps":     &r.DrainSyncConcurrentEPS,
		"drain_sync_noflag_eps":         &r.DrainSyncNoFlagEPS,
		"drain_batched_flag_eps":        &r.DrainBatchedFlagEPS,
		"drain_batched_unanalyzed_eps":  &r.DrainBatchedUnanalyzedEPS,
		"watermill_eps":                 &r.WatermillEPS,
		"watermill_decode_eps":          &r.WatermillDecodeEPS,
		"select_decode_limit_rps":       &r.SelectDecodeLimitRPS,
		"upsert_limit_wps":              &r.UpsertLimitWPS,
		"watcher_read_limit_rps":        &r.WatcherReadLimitRPS,
		"watcher_read_limit_health_rps": &r.WatcherReadLimitHealthRPS,
		"drain_health_eps":              &r.DrainHealthEPS,
		"drain_health_typed_eps":        &r.DrainHealthTypedEPS,
		"drain_health_raw_eps":          &r.DrainHealthRawEPS,
		"drain_bulk_sync_eps":           &r.DrainBulkSyncEPS,
		"insert_4w_rps":                 &r.Insert4wRPS,
	} {
		*dst = r.Stats[key].Median
	}
	r.Variants = map[string]map[string]float64{}
	for _, v := range r.variantsRun() {
		m := map[string]float64{}
		for _, t := range ts {
			for _, f := range t.figs {
				if s, ok := r.Stats[v.key(f.key)]; ok && t.perVariant {
					m[f.key] = s.Median
				}
			}
		}
		r.Variants[string(v)] = m
		for _, b := range r.Params.Backlogs {
			br := backlogResult{
				Rows: b, Variant: string(v),
				DrainBatchedEPS:    r.fig(backlogKey("drain_batched_eps", b), v),
				WatermillEPS:       r.fig(backlogKey("watermill_eps", b), upgraded),
				WatermillDecodeEPS: r.fig(backlogKey("watermill_decode_eps", b), upgraded),
			}
			if br.DrainBatchedEPS == 0 {
				continue
			}
			br.RatioDecode, _ = ratio(br.DrainBatchedEPS, br.WatermillDecodeEPS)
			br.RatioRaw, _ = ratio(br.DrainBatchedEPS, br.WatermillEPS)
			r.Backlogs = append(r.Backlogs, br)
		}
	}
	r.setComparisons()
}

// ratio returns a ÷ b, and whether both were measured.
func ratio(a, b float64) (float64, bool) {
	if a == 0 || b == 0 {
		return 0, false
	}
	return a / b, true
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
