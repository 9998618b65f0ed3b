package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

// TestComparisonGoals checks the ratios and goals of the upgraded schema against the legacy one,
// in the JSON fields, the Markdown comparison (and not again in its targets table) and the text
// table.
func TestComparisonGoals(t *testing.T) {
	o, err := parseFlags([]string{"-quick"})
	if err != nil {
		t.Fatal(err)
	}
	r := newResults(o)
	for key, xs := range map[string][]float64{
		"legacy/drain_sync_eps": {1000}, "drain_sync_eps": {900},
		"legacy/drain_batched_eps@50k": {1000}, "drain_batched_eps@50k": {990},
		"legacy/insert_4w_rps": {1000}, "insert_4w_rps": {950},
		"legacy/watcher_read_limit_rps": {200}, "watcher_read_limit_rps": {100},
	} {
		r.Samples[key] = xs
	}
	r.LatencyMS = map[string]latency{
		"legacy/hybrid_4w": {P50: 0.2, P99: 3}, "hybrid_4w": {P50: 0.3, P99: 25},
		"legacy/hybrid_4w_longtx": {P50: 0.2, P99: 3}, "hybrid_4w_longtx": {P50: 0.4, P99: 6},
	}
	r.setMedians(r.throughputs())

	want := map[string]float64{
		"drain_sync_eps": 0.9, "drain_batched_eps@50k": 0.99, "insert_4w_rps": 0.95, "watcher_read_limit_rps": 0.5,
		"latency_ms hybrid_4w p50": 1.5, "latency_ms hybrid_4w p99": 25.0 / 3, "latency_ms hybrid_4w_longtx p99": 2,
	}
	for key, w := range want {
		if got := r.DeltaVsLegacy[key]; math.Abs(got-w) > 1e-9 {
			t.Errorf("delta_vs_legacy[%s] = %v, want %v", key, got, w)
		}
	}
	pass := map[string]bool{}
	for _, g := range r.DeltaGoals {
		pass[g.Name] = g.Pass
	}
	wantPass := map[string]bool{
		"upgraded ÷ legacy drain_sync_eps": false, "upgraded ÷ legacy drain_batched_eps@50k": true,
		"upgraded ÷ legacy insert_4w_rps": true, "hybrid_4w latency p50": true, "hybrid_4w latency p99": false,
		"hybrid_4w_longtx latency p50": true, "hybrid_4w_longtx latency p99": true,
	}
	if len(pass) != len(wantPass) {
		t.Errorf("goals %v, want %v (the read ceiling has none)", pass, wantPass)
	}
	for name, w := range wantPass {
		if got, ok := pass[name]; !ok || got != w {
			t.Errorf("goal %q: pass %v (listed %v), want %v", name, got, ok, w)
		}
	}

	md := markdown(r, machine{})
	comparison, targets, ok := strings.Cut(md, "## Targets")
	if !ok {
		t.Fatal("no targets section")
	}
	for _, row := range []string{
		"| `drain_sync_eps` | 1000 | 900 | 0.90 | ≥ 0.95 x | MISS (-5%) |",
		"| `insert_4w_rps` | 1000 | 950 | 0.95 | ≥ 0.9 x | pass (+6%) |",
		"| `watcher_read_limit_rps` | 200 | 100 | 0.50 |  |  |",
		"| `latency_ms hybrid_4w p99` | 3.00 ms | 25.00 ms | 8.33 | ≤ 20 ms | MISS (-25%) |",
	} {
		if !strings.Contains(comparison, row) {
			t.Errorf("comparison lacks the row %s", row)
		}
	}
	if strings.Contains(targets, "upgraded ÷ legacy") || strings.Contains(targets, "| hybrid_4w latency") {
		t.Error("the targets table repeats goals of the comparison")
	}
	if !strings.Contains(targets, "legacy/hybrid_4w latency p99") {
		t.Error("the targets table lacks the legacy schema's latency goals")
	}
	var text bytes.Buffer
	writeTable(&text, r)
	if !strings.Contains(text.String(), "upgraded ÷ legacy drain_sync_eps") {
		t.Error("the text table lacks the goals of the comparison")
	}
}

// TestFlagCostText checks the time per row the processed flag adds, computed for each variant
// from its own drain_batched figures, and its place in the Markdown report.
func TestFlagCostText(t *testing.T) {
	o, err := parseFlags([]string{"-quick"})
	if err != nil {
		t.Fatal(err)
	}
	r := newResults(o)
	if got := r.flagCostText(); got != "" {
		t.Errorf("no drains measured: %q, want nothing", got)
	}
	for key, xs := range map[string][]float64{
		"legacy/drain_batched_eps": {100_000}, "legacy/drain_batched_flag_eps": {50_000},
		"drain_batched_eps": {80_000}, "drain_batched_flag_eps": {20_000},
	} {
		r.Samples[key] = xs
	}
	r.setMedians(r.throughputs())
	want := "1/`drain_batched_flag` − 1/`drain_batched`: 10.0 µs (legacy), 37.5 µs (upgraded)."
	if got := r.flagCostText(); !strings.HasSuffix(got, want) {
		t.Errorf("flagCostText() = %q, want it to end in %q", got, want)
	}
	if md := markdown(r, machine{}); !strings.Contains(md, want) {
		t.Errorf("the report lacks %q", want)
	}
}
