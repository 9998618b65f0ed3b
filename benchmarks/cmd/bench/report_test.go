package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestResultsKeepJSONKeys checks that the -json output of a quick run keeps the keys it had
// before schema variants, spreads and backlogs were added, and that sample keys are unique.
func TestResultsKeepJSONKeys(t *testing.T) {
	o, err := parseFlags([]string{"-quick"})
	if err != nil {
		t.Fatal(err)
	}
	r := newResults(o)
	seen := map[string]bool{}
	for _, tp := range throughputs(o) {
		for _, f := range tp.figs {
			for _, v := range variants {
				key := v.key(f.key)
				if seen[key] {
					t.Fatalf("figure %s listed twice", key)
				}
				seen[key] = true
				r.Samples[key] = []float64{3, 1, 2}
			}
		}
	}
	r.LatencyMS = map[string]latency{"hybrid": {}, "polling": {}}
	r.Micro = &microResults{}
	r.SaturationHeapMB = &saturationResult{}
	r.setMedians(throughputs(o))
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"drain_sync_eps", "drain_batched_eps", "drain_sync_concurrent_eps", "watermill_eps",
		"select_decode_limit_rps", "upsert_limit_wps", "latency_ms", "saturation_heap_mb", "retained_drain_ratio",
		"drain_sync_noflag_eps", "drain_batched_flag_eps", "drain_batched_unanalyzed_eps", "retained_drain_ratio_sync",
		"retained_drain_ratio_noflag", "micro", "samples", "params", "wall_seconds", "delta_vs_legacy", "delta_goals"} {
		if _, ok := got[key]; !ok {
			t.Errorf("key %q missing from the JSON output", key)
		}
	}
	if r.DrainSyncEPS != 2 || r.Stats["legacy/drain_sync_eps"] != (stat{Median: 2, Min: 1, Max: 3, N: 3}) {
		t.Errorf("drain_sync_eps %v, legacy stat %+v; want the median 2 of 1..3", r.DrainSyncEPS, r.Stats["legacy/drain_sync_eps"])
	}
	if o.reps != 3 || len(o.variants) != 2 || len(o.backlogs) != 3 {
		t.Errorf("-quick: reps %d, variants %v, backlogs %v", o.reps, o.variants, o.backlogs)
	}
}

func TestFormatTargetMargin(t *testing.T) {
	tests := []struct {
		t    target
		want string
	}{
		{target{value: 0.6, goal: 0.8, ok: true, unit: "x"}, "MISS (-25%)"},
		{target{value: 1.0, goal: 0.8, ok: true, unit: "x"}, "pass (+25%)"},
		{target{value: 15, goal: 20, le: true, ok: true, unit: "ms"}, "pass (+25%)"},
		{target{value: 30, goal: 20, le: true, ok: true, unit: "ms"}, "MISS (-50%)"},
		{target{value: 0, goal: 0, le: true, ok: true, unit: "allocs/op"}, "pass"},
		{target{}, "-"},
	}
	for _, tt := range tests {
		if _, _, mark := formatTarget(tt.t); mark != tt.want {
			t.Errorf("%+v: mark %q, want %q", tt.t, mark, tt.want)
		}
	}
}

func TestParseFlagsLists(t *testing.T) {
	o, err := parseFlags([]string{"-variants", "upgraded, legacy", "-backlogs", "500,2000"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.variants) != 2 || o.variants[0] != legacy || o.backlogs[1] != 2000 || o.reps != 5 {
		t.Errorf("variants %v, backlogs %v, reps %d", o.variants, o.backlogs, o.reps)
	}
	for _, args := range [][]string{{"-variants", "delta"}, {"-backlogs", "2k"}, {"-backlogs", "0"}} {
		if _, err := parseFlags(args); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%v: error %v, want one naming %s", args, err, args[0])
		}
	}
	if o.latencyDuration != 10*time.Second {
		t.Errorf("latency duration %v", o.latencyDuration)
	}
}
