package main

import "testing"

// The typed-read goals are among the run's targets, computed from their figures.
func TestTypedReadTargets(t *testing.T) {
	r := &results{
		Params: params{Variants: []string{"upgraded"}},
		Stats:  map[string]stat{"drain_health_eps": {Median: 10000}, "drain_health_typed_eps": {Median: 8500}},
		Micro:  &microResults{UnmarshalDocumentMapNs: 24000, UnmarshalDocumentNs: 5000},
	}
	want := map[string]struct {
		value float64
		pass  bool
	}{
		"typed health drain (Document) / drain_health":       {0.85, false},
		"UnmarshalDocument speed-up over the map round trip": {4.8, true},
	}
	found := 0
	for _, tg := range r.targets() {
		w, ok := want[tg.name]
		if !ok {
			continue
		}
		found++
		if !tg.ok || tg.value != w.value || tg.pass() != w.pass {
			t.Errorf("%s: value %v ok %v pass %v, want %v pass %v", tg.name, tg.value, tg.ok, tg.pass(), w.value, w.pass)
		}
	}
	if found != len(want) {
		t.Errorf("%d of the %d typed-read targets listed", found, len(want))
	}
}
