package main

import (
	"fmt"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// target is one comparison of the run against its goal.
type target struct {
	name  string  // what is compared
	uses  string  // the figures the value is computed from
	value float64 // the measured ratio or figure
	goal  float64
	le    bool // the goal is an upper bound (value <= goal); otherwise a lower bound
	unit  string
	ok    bool // the inputs were measured
	// compared says the target is a goal of the upgraded schema shown with the comparison of
	// the schema variants.
	compared bool
}

// pass reports whether the target is met.
func (t target) pass() bool {
	if t.le {
		return t.value <= t.goal
	}
	return t.value >= t.goal
}

// margin is how far the value is from the goal, as a fraction of the goal: positive when the
// target passes with room to spare, negative when it misses (-0.25: a quarter short). It is
// 0 for a goal of zero.
func (t target) margin() float64 {
	if t.goal == 0 {
		return 0
	}
	if t.le {
		return (t.goal - t.value) / t.goal
	}
	return (t.value - t.goal) / t.goal
}

// unmarshalSpeedupGoal is the least speed-up of UnmarshalDocument over the JSON round trip of
// the document map it replaced; typedDrainGoal the least rate of a drain whose consumer reads
// each document into a struct, against the same drain reading nothing.
const (
	unmarshalSpeedupGoal = 4
	typedDrainGoal       = 0.9
)

// ratioTarget is a lower bound on the ratio of figure a to figure b.
func ratioTarget(name string, a, b float64, aKey, bKey string, goal float64) target {
	v, ok := ratio(a, b)
	return target{name: name, uses: "`" + aKey + "` ÷ `" + bKey + "`", value: v, goal: goal, unit: "x", ok: ok}
}

// drainTargets are the throughput goals of the drains on variant v.
func (r *results) drainTargets(v variant) []target {
	label := func(name string) string {
		if len(r.Params.Variants) > 1 {
			return "[" + string(v) + "] " + name
		}
		return name
	}
	f := func(key string) float64 { return r.fig(key, v) }
	k := v.key
	ts := []target{
		ratioTarget(label("drain_sync / upsert_limit"), f("drain_sync_eps"), r.UpsertLimitWPS,
			k("drain_sync_eps"), "upsert_limit_wps", 0.8),
		ratioTarget(label("(no processed flag) drain_sync / upsert_limit"), f("drain_sync_noflag_eps"), r.UpsertLimitWPS,
			k("drain_sync_noflag_eps"), "upsert_limit_wps", 0.8),
	}
	if v == upgraded { // ProcessTx and MarkProcessedTx refuse a legacy changelog
		ts = append(ts, ratioTarget(label("effect + MarkProcessedTx in one tx / effect then MarkProcessed"),
			f("drain_txack_eps"), f("drain_effect_sync_eps"), k("drain_txack_eps"), k("drain_effect_sync_eps"), txAckGoal),
			ratioTarget(label("ProcessTx, 8 workers / 1 worker"), f("process_tx_w8_eps"), f("process_tx_w1_eps"),
				k("process_tx_w8_eps"), k("process_tx_w1_eps"), processTxGoal),
			ratioTarget(label("ProcessTx, 8 workers / the same transactions by hand"), f("process_tx_w8_eps"), f(byHandKey(8)),
				k("process_tx_w8_eps"), k(byHandKey(8)), processTxByHandGoal))
	}
	// The same transactions without ProcessTx: what the machine allows, and ProcessTx's share of it.
	ts = append(ts, ratioTarget(label("ProcessTx's transactions by hand, 8 goroutines / 1"), f(byHandKey(8)), f(byHandKey(1)),
		k(byHandKey(8)), k(byHandKey(1)), processTxGoal))
	for _, b := range r.Params.Backlogs {
		goal := 2.0
		if b < 10_000 {
			goal = 1
		}
		dk, wk := backlogKey("drain_batched_eps", b), backlogKey("watermill_decode_eps", b)
		ts = append(ts, ratioTarget(label("drain_batched / decoding watermill, "+countLabel(b)+" backlog"),
			f(dk), r.fig(wk, upgraded), k(dk), wk, goal))
	}
	return append(ts,
		ratioTarget(label("drain_batched / watcher read ceiling"), f("drain_batched_eps"), f("watcher_read_limit_rps"),
			k("drain_batched_eps"), k("watcher_read_limit_rps"), 0.8),
		ratioTarget(label("(processed flag) drain_batched_flag / watcher read ceiling"), f("drain_batched_flag_eps"),
			f("watcher_read_limit_rps"), k("drain_batched_flag_eps"), k("watcher_read_limit_rps"), 0.5),
		ratioTarget(label("drain_batched_unanalyzed / drain_batched"), f("drain_batched_unanalyzed_eps"), f("drain_batched_eps"),
			k("drain_batched_unanalyzed_eps"), k("drain_batched_eps"), 0.8),
		ratioTarget(label("health-shaped drain / items drain (within 2x)"), f("drain_health_eps"), f("drain_batched_flag_eps"),
			k("drain_health_eps"), k("drain_batched_flag_eps"), 0.5),
		ratioTarget(label("typed health drain (Document) / drain_health"), f("drain_health_typed_eps"), f("drain_health_eps"),
			k("drain_health_typed_eps"), k("drain_health_eps"), typedDrainGoal),
		ratioTarget(label("bulk one-transaction drain / drain_sync"), f("drain_bulk_sync_eps"), f("drain_sync_eps"),
			k("drain_bulk_sync_eps"), k("drain_sync_eps"), 0.8),
	)
}

// handlerBoundGoal is the least rate of a Process figure against the rate its handlers' own
// durations allow: the engine's hand-offs, the reads and the acknowledgements cost at most a
// tenth.
const handlerBoundGoal = 0.9

// processTargets are the goals of the Process figures: a 2 ms handler runs at most 500 events/s
// per worker, and Process should reach 80% of that (or of drain_batched, the reader's pace); a
// no-op handler 80% of drain_batched; past a hot key holding half the events, the other keys
// half the rate of 1,000 even keys.
func (r *results) processTargets() []target {
	f := func(key string) float64 { return r.fig(key, upgraded) }
	perWorker := float64(time.Second / processHandleTime)
	w64 := min(64*perWorker, f("drain_batched_eps"))
	w64Target := ratioTarget("Process, 2 ms handler, Workers 64 / min(64 × 500/s, drain_batched)", f("process_sleep2ms_w64_eps"),
		w64, "process_sleep2ms_w64_eps", "drain_batched_eps", 0.8)
	w64Target.uses = "`process_sleep2ms_w64_eps` ÷ min(64 × 500/s, `drain_batched_eps`)"
	w8Target := ratioTarget("Process, 2 ms handler, Workers 8 / 8 × 500/s", f("process_sleep2ms_w8_eps"),
		8*perWorker, "process_sleep2ms_w8_eps", "", 0.8)
	w8Target.uses = "`process_sleep2ms_w8_eps` ÷ 8 × 500/s"
	// What Process itself costs: its rate against the one its handlers' measured durations
	// allow (a 2 ms sleep takes longer than 2 ms on a loaded machine).
	bound := func(workers, key string) target {
		return ratioTarget("Process, 2 ms handler, Workers "+workers+" / its handlers' own durations", f(key), f(handlerBoundKey(key)),
			key, handlerBoundKey(key), handlerBoundGoal)
	}
	return []target{
		ratioTarget("Process, no-op handler, Workers 8 / drain_batched", f("process_noop_w8_eps"), f("drain_batched_eps"),
			"process_noop_w8_eps", "drain_batched_eps", 0.8),
		w8Target,
		bound("8", "process_sleep2ms_w8_eps"),
		w64Target,
		bound("64", "process_sleep2ms_w64_eps"),
		// And against 64 goroutines that only sleep on Events(): what the runtime allows beside
		// the reads.
		ratioTarget("Process, 2 ms handler, Workers 64 / the same sleeps without Process", f("process_sleep2ms_w64_eps"),
			f(eventsSleepKey), "process_sleep2ms_w64_eps", eventsSleepKey, handlerBoundGoal),
		ratioTarget("Process past a hot key holding half the events: the other keys / 1,000 keys", f("process_hotkey_w64_eps"),
			f("process_sleep2ms_w64_eps"), "process_hotkey_w64_eps", "process_sleep2ms_w64_eps", 0.5),
	}
}

// targets evaluates the goals that the run's figures allow.
func (r *results) targets() []target {
	var ts []target
	for _, v := range r.variantsRun() {
		ts = append(ts, r.drainTargets(v)...)
	}
	ts = append(ts, r.processTargets()...)
	ts = append(ts, r.sharedTargets()...)
	for _, c := range r.throughputComparisons() {
		if c.target != nil {
			ts = append(ts, *c.target)
		}
	}
	add := func(name, uses string, v float64, goal float64, le bool, unit string) {
		ts = append(ts, target{name: name, uses: uses, value: v, goal: goal, le: le, unit: unit, ok: true})
	}
	keys := []string{"hybrid"}
	for _, v := range r.variantsRun() {
		for _, run := range variantLatencyRuns {
			keys = append(keys, v.key(run))
		}
	}
	for _, key := range keys {
		if l, ok := r.LatencyMS[key]; ok {
			for _, q := range hybridQuantiles(l) {
				ts = append(ts, latencyTarget(key, q))
			}
		}
	}
	if l, ok := r.LatencyMS["polling"]; ok {
		add("polling latency p50 vs PollInterval", "`latency_ms polling`", l.P50,
			float64(pgchangestream.DefaultPollInterval)/float64(time.Millisecond), true, "ms")
	}
	if m := r.Micro; m != nil && r.DrainBatchedEPS > 0 {
		perEvent := 1e9 / r.DrainBatchedEPS
		add("pending push+ack / drain_batched per-event cost", "BenchmarkPendingPushAck, `drain_batched_eps`",
			100*m.PushAckNs/perEvent, 3, true, "%")
		add("pending push+ack allocations", "BenchmarkPendingPushAck", m.PushAckAllocs, 0, true, "allocs/op")
	}
	if m := r.Micro; m != nil {
		t := ratioTarget("UnmarshalDocument speed-up over the map round trip", m.UnmarshalDocumentMapNs, m.UnmarshalDocumentNs,
			"", "", unmarshalSpeedupGoal)
		t.uses = "BenchmarkUnmarshalDocument: map-round-trip ÷ bytes, same run"
		ts = append(ts, t)
	}
	if s := r.SaturationHeapMB; s != nil {
		add(heapGrowthName(s.Deliveries), "`saturation_heap_mb`", s.AfterAllMB-s.AfterEarlyMB, heapGrowthGoalMB, true, "MB")
	}
	if r.RetainedDrainRatio > 0 {
		add("retained_drain_ratio", "`retained_drain_ratio`", r.RetainedDrainRatio, 1.2, true, "x")
		add("(per-ack saves) retained_drain_ratio", "`retained_drain_ratio_sync`", r.RetainedDrainRatioSync, 1.2, true, "x")
		add("(no processed flag) retained_drain_ratio", "`retained_drain_ratio_noflag`", r.RetainedDrainRatioNoFlag, 1.2, true, "x")
	}
	return ts
}

// formatTarget renders a target's value, goal and mark; the mark says by how much it passed
// or missed.
func formatTarget(t target) (value, goal, mark string) {
	if !t.ok {
		return "n/a", "", "-"
	}
	op := "≥"
	switch {
	case t.le && t.goal == 0:
		op = "="
	case t.le:
		op = "≤"
	}
	prec := 2
	if t.unit == "allocs/op" {
		prec = 0
	}
	value = fmt.Sprintf("%.*f %s", prec, t.value, t.unit)
	goal = fmt.Sprintf("%s %g %s", op, t.goal, t.unit)
	mark = "MISS"
	if t.pass() {
		mark = "pass"
	}
	if t.goal != 0 {
		mark += fmt.Sprintf(" (%+.0f%%)", 100*t.margin())
	}
	return value, goal, mark
}
