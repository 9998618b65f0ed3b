package main

import (
	"context"
	"time"
)

// figureSpec names one figure of a measurement and says what it measures.
type figureSpec struct {
	key, what string
}

// throughput is one measurement, run once per repetition, and once per schema variant if
// perVariant: run returns one duration per figure, each for count items. deltaGoal, if not 0,
// is the lowest ratio of its figures on the upgraded schema to the same on the legacy one.
type throughput struct {
	figs       []figureSpec
	count      int
	perVariant bool
	deltaGoal  float64
	run        func(ctx context.Context, e *env, v variant) ([]time.Duration, error)
}

// backlogKey returns the key of figure key measured at a backlog of n rows: key@2k.
func backlogKey(key string, n int) string { return key + "@" + countLabel(n) }

// throughputs returns the throughput measurements of the run's settings.
func (r *results) throughputs() []throughput {
	return throughputs(options{rows: r.Params.Rows, backlogs: r.Params.Backlogs})
}

// throughputs lists the throughput measurements, in the order they run in each repetition.
// Figures compared by a target run next to each other, so that load from outside the run hits
// both alike.
func throughputs(o options) []throughput {
	n := o.rows
	one := func(key, what string, perVariant bool, count int,
		run func(context.Context, *env, variant) (time.Duration, error)) throughput {
		return throughput{figs: []figureSpec{{key, what}}, count: count, perVariant: perVariant,
			run: func(ctx context.Context, e *env, v variant) ([]time.Duration, error) {
				d, err := run(ctx, e, v)
				return []time.Duration{d}, err
			}}
	}
	drainWith := func(key, what string, count int, spec drainSpec) throughput {
		t := one(key, what, true, count, func(ctx context.Context, e *env, v variant) (time.Duration, error) {
			return drainFresh(ctx, e, v, count, spec)
		})
		t.deltaGoal = drainDeltaGoal
		return t
	}
	watermillAt := func(count int, key func(string) string) throughput {
		return throughput{
			figs: []figureSpec{
				{key("watermill_eps"), "watermill-sql v4 PostgreSQL subscriber, batch 100, ack each (raw payload)"},
				{key("watermill_decode_eps"), "the same, consumer decodes each payload into map[string]any (encoding/json)"},
			},
			count: count,
			run: func(ctx context.Context, e *env, _ variant) ([]time.Duration, error) {
				raw, decode, err := watermillDrains(ctx, e, count)
				return []time.Duration{raw, decode}, err
			},
		}
	}
	// upgradedOnly runs t on the upgraded schema only: ProcessTx and MarkProcessedTx refuse a
	// legacy changelog (pgchangestream.ErrLegacyChangelog).
	upgradedOnly := func(t throughput) throughput {
		t.perVariant, t.deltaGoal = false, 0
		return t
	}
	// batched is a drain with New's defaults (no processed flag), saving every batchedInterval;
	// batchedFlag the same with Config.ProcessedFlag.
	batched := drainSpec{checkpointInterval: batchedInterval, disableProcessedFlag: true}
	batchedFlag := drainSpec{checkpointInterval: batchedInterval}
	inserts := one("insert_4w_rps", itoa(hybridWriters)+" writers inserting through the trigger, one autocommit row each",
		true, n, func(ctx context.Context, e *env, v variant) (time.Duration, error) {
			return insertThroughput(ctx, e, v, n)
		})
	inserts.deltaGoal = insertDeltaGoal
	ts := []throughput{
		one("upsert_limit_wps", "single-client token upsert, one commit each", false, n,
			func(ctx context.Context, e *env, _ variant) (time.Duration, error) { return upserts(ctx, e, n) }),
		drainWith("drain_sync_eps", "watcher (polling), MarkProcessed each event, CheckpointInterval 0", n, drainSpec{}),
		drainWith("drain_bulk_sync_eps", "drain_sync of a backlog written by one transaction (one changed_at)", n,
			drainSpec{shape: bulkShape}),
		drainWith("drain_sync_noflag_eps", "drain_sync with DisableProcessedFlag", n, drainSpec{disableProcessedFlag: true}),
		upgradedOnly(drainWith("drain_txack_eps", "one effect row per event: BEGIN; INSERT effect; MarkProcessedTx; COMMIT, "+
			"DisableProcessedFlag", n, drainSpec{effects: effectsInTx, disableProcessedFlag: true})),
		drainWith("drain_effect_sync_eps", "one effect row per event: INSERT effect (autocommit), then MarkProcessed "+
			"(CheckpointInterval 0), DisableProcessedFlag", n, drainSpec{effects: effectsThenAck, disableProcessedFlag: true}),
		upgradedOnly(drainWith("process_tx_w1_eps", "one effect row per event in the transaction ProcessTx owns (claim, effect, "+
			"commit), Workers 1, DisableProcessedFlag", n, drainSpec{effects: effectsProcessTx, workers: 1, disableProcessedFlag: true})),
		upgradedOnly(drainWith("process_tx_w8_eps", "process_tx_w1 with Workers 8", n,
			drainSpec{effects: effectsProcessTx, workers: 8, disableProcessedFlag: true})),
		drainWith(byHandKey(1), "no ProcessTx: 1 goroutine takes Events() and runs process_tx's transactions by hand "+
			"(BEGIN, the same claim, the effect, COMMIT), then MarkProcessed, CheckpointInterval "+batchedInterval.String(), n,
			drainSpec{effects: effectsByHand, workers: 1, checkpointInterval: batchedInterval, disableProcessedFlag: true}),
		drainWith(byHandKey(8), byHandKey(1)+" with 8 goroutines, acknowledging the contiguous prefix of committed events", n,
			drainSpec{effects: effectsByHand, workers: 8, checkpointInterval: batchedInterval, disableProcessedFlag: true}),
		drainWith("drain_sync_concurrent_eps", itoa(concurrentWorkers)+
			" workers, contiguous watermark acked, CheckpointInterval 0", n, drainSpec{workers: concurrentWorkers}),
		watermillAt(n, func(key string) string { return key }),
		drainWith("drain_batched_eps", "New's defaults (no processed flag), MarkProcessed each event, CheckpointInterval "+
			batchedInterval.String()+", final Flush", n, batched),
		drainWith("drain_batched_flag_eps", "drain_batched with ProcessedFlag, until every row is marked", n, batchedFlag),
		one("watcher_read_limit_rps", "watcher whose Filter drops every event: its own batched reads and decoding, "+
			"nothing delivered or acknowledged", true, n, func(ctx context.Context, e *env, v variant) (time.Duration, error) {
			return watcherReadFresh(ctx, e, v, n, itemsShape)
		}),
		one("watcher_read_limit_health_rps", "watcher_read_limit of the health_events rows of drain_health", true, n,
			func(ctx context.Context, e *env, v variant) (time.Duration, error) {
				return watcherReadFresh(ctx, e, v, n, healthShape)
			}),
		drainWith("drain_health_eps", "drain_batched_flag of ~1 KB health_events rows, half updates, DocumentField \"document\"", n,
			drainSpec{checkpointInterval: batchedInterval, shape: healthShape}),
		drainWith("drain_health_typed_eps", "drain_health, each document read into a HealthEventWithStatus-shaped "+
			"struct by Document (document maps built)", n,
			drainSpec{checkpointInterval: batchedInterval, shape: healthShape, typed: typedFromMap}),
		drainWith("drain_health_raw_eps", "drain_health_typed with RawDocuments (no document maps)", n,
			drainSpec{checkpointInterval: batchedInterval, shape: healthShape, typed: typedRaw}),
		one("select_decode_limit_rps", "one SELECT of the rows + JSON decode into event maps", false, n,
			func(ctx context.Context, e *env, _ variant) (time.Duration, error) {
				return selectDecodeFresh(ctx, e, n)
			}),
		drainWith("drain_batched_unanalyzed_eps", "drain_batched on a changelog never analyzed", n,
			drainSpec{checkpointInterval: batchedInterval, disableProcessedFlag: true, unanalyzed: true}),
		inserts,
	}
	ts = append(ts, processThroughputs(n)...)
	for _, b := range o.backlogs {
		at := func(key string) string { return backlogKey(key, b) }
		ts = append(ts, watermillAt(b, at),
			drainWith(at("drain_batched_eps"), "drain_batched of a backlog of "+countLabel(b)+" rows", b, batched))
	}
	return ts
}
