package main

import (
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gonum.org/v1/plot/plotter"
)

// chartResults is a small fixed result set: two backlogs on both schemas, two latency runs and,
// when process is set, Process figures of two handlers.
func chartResults(process bool) *results {
	r := &results{
		Params: params{Backlogs: []int{2000, 10000}, Variants: []string{"legacy", "upgraded"}},
		Stats: map[string]stat{
			"watermill_eps@2k": {Median: 900}, "watermill_decode_eps@2k": {Median: 800},
			"watermill_eps@10k": {Median: 1000}, "watermill_decode_eps@10k": {Median: 850},
		},
		Backlogs: []backlogResult{
			{Rows: 2000, Variant: "legacy", DrainBatchedEPS: 4000}, {Rows: 10000, Variant: "legacy", DrainBatchedEPS: 5000},
			{Rows: 2000, Variant: "upgraded", DrainBatchedEPS: 4200}, {Rows: 10000, Variant: "upgraded", DrainBatchedEPS: 5100},
		},
		LatencyMS: map[string]latency{"hybrid": {P50: 0.4, P99: 3, Max: 9}, "polling": {P50: 0, P99: 12, Max: 20}},
	}
	if process {
		for key, eps := range map[string]float64{"process_noop_w8_eps": 9000, "process_sleep2ms_w8_eps": 3900,
			"process_sleep2ms_w64_eps": 25000, "legacy/process_noop_w8_eps": 1} {
			r.Stats[key] = stat{Median: eps}
		}
	}
	return r
}

// svgText returns the text of every <text> element of the SVG file path, failing the test if
// it is not an SVG document.
func svgText(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := xml.NewDecoder(f)
	var texts []string
	root, inText := "", false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
			inText = tok.Name.Local == "text"
		case xml.CharData:
			if inText {
				texts = append(texts, strings.TrimSpace(string(tok)))
			}
		case xml.EndElement:
			inText = false
		}
	}
	if root != "svg" {
		t.Fatalf("%s: root element %q, want svg", path, root)
	}
	return texts
}

func TestChartsAreDrawnFromTheResults(t *testing.T) {
	dir := t.TempDir()
	r := chartResults(true)
	if err := writeCharts(r, dir); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"drain_backlog.svg":   {"drain_batched (legacy)", "drain_batched (upgraded)", "watermill_decode", "watermill", "2k", "10k"},
		"latency.svg":         {"p50", "p99", "max", "hybrid", "polling"},
		"process_workers.svg": {"process_noop", "process_sleep2ms"},
	}
	md := chartsMarkdown(r)
	for file, names := range want {
		texts := svgText(t, filepath.Join(dir, file))
		for _, name := range names {
			if !slices.Contains(texts, name) {
				t.Errorf("%s: no text %q among %q", file, name, texts)
			}
		}
		if !strings.Contains(md, "("+chartsDir+"/"+file+")") {
			t.Errorf("the report does not show %s:\n%s", file, md)
		}
	}
	got := r.processSeries()
	if len(got) != 2 || len(got["noop"]) != 1 || got["noop"][0] != (plotter.XY{X: 8, Y: 9000}) ||
		!slices.Equal(got["sleep2ms"], plotter.XYs{{X: 8, Y: 3900}, {X: 64, Y: 25000}}) {
		t.Errorf("Process series %v: want noop at 8 workers and sleep2ms at 8 and 64, upgraded figures only", got)
	}
}

// Without Process figures the Process chart is neither drawn nor shown; without any figure no
// folder is made.
func TestChartsSkipWhatWasNotMeasured(t *testing.T) {
	dir := t.TempDir()
	r := chartResults(false)
	if err := writeCharts(r, dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "process_workers.svg")); !os.IsNotExist(err) {
		t.Errorf("process_workers.svg without Process figures: %v", err)
	}
	if strings.Contains(chartsMarkdown(r), "process_workers") {
		t.Error("the report shows a Process chart without Process figures")
	}
	empty := filepath.Join(dir, "none")
	if err := writeCharts(&results{Stats: map[string]stat{}}, empty); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(empty); !os.IsNotExist(err) || chartsMarkdown(&results{}) != "" {
		t.Errorf("charts of empty results: %v", err)
	}
}
