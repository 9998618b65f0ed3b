package main

import (
	"strings"
	"testing"
)

// The shared target is the ratio of the 4-member drain to the 1-member one against its goal,
// and the section and the target appear only when the run measured them.
func TestSharedTargetAndSection(t *testing.T) {
	o, err := parseFlags([]string{"-quick"})
	if err != nil {
		t.Fatal(err)
	}
	r := newResults(o)
	r.setMedians(nil)
	if len(r.sharedTargets()) != 0 || r.sharedMarkdown() != "" || len(r.sharedFigures()) != 0 {
		t.Fatal("shared target, section or figures without shared samples")
	}
	for _, tc := range []struct {
		m4   float64
		pass bool
	}{{9000, true}, {8900, false}} {
		r := newResults(o)
		r.Samples[sharedKey(1, "eps")] = []float64{3000}
		r.Samples[sharedKey(4, "eps")] = []float64{tc.m4}
		r.Samples["shared_join_s"] = []float64{1.2}
		r.Samples["shared_kill_s"] = []float64{2.5}
		r.setMedians(nil)
		ts := r.sharedTargets()
		if len(ts) != 1 || !ts[0].ok || ts[0].pass() != tc.pass || ts[0].value != tc.m4/3000 {
			t.Fatalf("4 members at %v/s, 1 at 3000/s: target %+v, want pass=%v", tc.m4, ts, tc.pass)
		}
		md := r.sharedMarkdown()
		if !strings.Contains(md, "## Shared consumers") || !strings.Contains(md, "2.50 s (SharedLease 2s)") {
			t.Fatalf("section lacks its heading or the kill time with its lease:\n%s", md)
		}
	}
}
