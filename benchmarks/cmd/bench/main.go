// Command bench measures pgchangestream against a throwaway PostgreSQL (fsync on) and compares
// the figures with the ceilings of the database and with watermill-sql, all in one run.
//
// Run it from the benchmarks module:
//
//	go run ./cmd/bench                       # full run, a table on stdout
//	go run ./cmd/bench -quick                # reduced set: fewer rows, 3 reps, shorter latency runs
//	go run ./cmd/bench -json                 # the figures as JSON
//	go run ./cmd/bench -out ../docs/benchmarks.md
//
// The server comes from internal/pgtest: PGCHANGESTREAM_TEST_DSN if set (then fsync is
// whatever that server has), else local PostgreSQL binaries, started with fsync,
// synchronous_commit and full_page_writes on.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// options are the command-line flags.
type options struct {
	rows            int
	reps            int
	latencyDuration time.Duration
	latencyRate     int
	saturationRows  int
	retainedRows    int
	backlogs        []int
	variants        []variant
	quick           bool
	jsonOut         bool
	out             string
	micro           bool
	only            string
	cpuProfile      string
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.IntVar(&o.rows, "rows", 5000, "backlog rows per drain")
	fs.IntVar(&o.reps, "reps", 5, "repetitions of each throughput figure (the median and range are reported)")
	backlogs := fs.String("backlogs", "2000,10000,50000", "comma-separated backlog sizes drained against watermill")
	variantList := fs.String("variants", "legacy,upgraded", "comma-separated schema variants the drains run on: "+
		"legacy (changelog without txid) and upgraded (schema.Install as is)")
	fs.DurationVar(&o.latencyDuration, "latency-duration", 10*time.Second, "length of each latency run")
	fs.IntVar(&o.latencyRate, "latency-rate", 1000, "events per second offered in the latency runs")
	fs.IntVar(&o.saturationRows, "saturation-rows", 1_000_000, "deliveries never acknowledged in the heap test")
	fs.IntVar(&o.retainedRows, "retained-rows", 1_000_000, "older rows retained behind the cursor")
	fs.BoolVar(&o.quick, "quick", false, "reduced set: 2,000 rows, 3 reps, 3 s latency runs, "+
		"100k retained and saturation rows (both schema variants, so the comparison holds)")
	fs.BoolVar(&o.jsonOut, "json", false, "print the figures as JSON instead of a table")
	fs.StringVar(&o.out, "out", "", "also write the report as Markdown to this file (e.g. ../docs/benchmarks.md)")
	fs.BoolVar(&o.micro, "micro", true, "run the pending-ring micro-benchmark of the library (go test) for the tracking cost")
	fs.StringVar(&o.only, "only", "", "comma-separated groups to run: throughput, latency, saturation, retained, shared, micro, "+
		"or single throughput figures such as drain_batched_eps (default all)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		defaults := []struct {
			name string
			f    func()
		}{
			{"rows", func() { o.rows = 2000 }},
			{"reps", func() { o.reps = 3 }},
			{"latency-duration", func() { o.latencyDuration = 3 * time.Second }},
			{"saturation-rows", func() { o.saturationRows = 100_000 }},
			{"retained-rows", func() { o.retainedRows = 100_000 }},
		}
		for _, d := range defaults {
			if !set[d.name] {
				d.f()
			}
		}
	}
	var err error
	if o.backlogs, err = parseBacklogs(*backlogs); err != nil {
		return o, err
	}
	if o.variants, err = parseVariants(*variantList); err != nil {
		return o, err
	}
	switch {
	case o.rows < 1, o.reps < 1, o.latencyRate < 1, o.latencyDuration <= 0:
		return o, fmt.Errorf("-rows, -reps, -latency-rate and -latency-duration must be positive")
	case o.saturationRows < saturationEarly:
		return o, fmt.Errorf("-saturation-rows must be at least %d", saturationEarly)
	}
	return o, nil
}

// parseBacklogs parses the -backlogs list.
func parseBacklogs(list string) ([]int, error) {
	var ns []int
	for f := range strings.SplitSeq(list, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-backlogs: %q is not a positive row count", f)
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// parseVariants parses the -variants list, keeping the report order.
func parseVariants(list string) ([]variant, error) {
	named := map[variant]bool{}
	for f := range strings.SplitSeq(list, ",") {
		v := variant(strings.TrimSpace(f))
		if v != legacy && v != upgraded {
			return nil, fmt.Errorf("-variants: %q is neither %s nor %s", v, legacy, upgraded)
		}
		named[v] = true
	}
	var vs []variant
	for _, v := range variants {
		if named[v] {
			vs = append(vs, v)
		}
	}
	return vs, nil
}

// selected reports whether -only names name; with no -only, everything is selected.
func (o options) selected(name string) bool {
	if o.only == "" {
		return true
	}
	for g := range strings.SplitSeq(o.only, ",") {
		if strings.TrimSpace(g) == name {
			return true
		}
	}
	return false
}

// runs reports whether the group is selected; the throughput group also runs when one of its
// figures is named.
func (o options) runs(group string) bool {
	if o.selected(group) {
		return true
	}
	if group == "throughput" {
		for _, t := range throughputs(o) {
			if o.runsFigure(t) {
				return true
			}
		}
	}
	return false
}

// runsFigure reports whether the measurement is selected: the throughput group, or one of
// its figures, is named.
func (o options) runsFigure(t throughput) bool {
	if o.selected("throughput") {
		return true
	}
	for _, f := range t.figs {
		if o.selected(f.key) {
			return true
		}
	}
	return false
}

func main() {
	o, err := parseFlags(os.Args[1:])
	switch {
	case errors.Is(err, flag.ErrHelp):
		return
	case err != nil:
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(ctx, o, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		pprof.StopCPUProfile()
		stop()
		os.Exit(1)
	}
}

// run starts the server, measures, and writes the report.
func run(ctx context.Context, o options, stdout, progress io.Writer) (err error) {
	began := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(progress, "[%6.1fs] "+format+"\n", append([]any{time.Since(began).Seconds()}, args...)...)
	}
	e, err := startEnv(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if serr := e.stop(); err == nil && serr != nil {
			err = serr
		}
	}()
	res := newResults(o)
	m, err := collectMachine(ctx, e)
	if err != nil {
		return err
	}
	if err := measureAll(ctx, e, o, res, logf); err != nil {
		return err
	}
	res.WallSeconds = time.Since(began).Seconds()
	logf("done")
	if o.jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else {
		writeTable(stdout, res)
	}
	if o.out != "" {
		if err := writeCharts(res, filepath.Join(filepath.Dir(o.out), chartsDir)); err != nil {
			return err
		}
		return os.WriteFile(o.out, []byte(markdown(res, m)), 0o644)
	}
	return nil
}

// measureAll runs the selected groups in an order that keeps them from disturbing each other:
// the heap test first, on a fresh heap; the throughput figures interleaved per repetition, with
// the schema variants taking turns going first, so that drift of a noisy machine hits them
// alike; then latency, then the retained-rows ratio.
func measureAll(ctx context.Context, e *env, o options, res *results, logf func(string, ...any)) error {
	if o.runs("saturation") {
		logf("saturation: %d deliveries never acknowledged", o.saturationRows)
		s, err := saturation(ctx, e, o.saturationRows)
		if err != nil {
			return err
		}
		res.SaturationHeapMB = &s
	}
	ts := throughputs(o)
	defer res.setMedians(ts)
	if o.runs("throughput") {
		for rep := 1; rep <= o.reps; rep++ {
			for _, t := range ts {
				if !o.runsFigure(t) {
					continue
				}
				vs := []variant{upgraded}
				if t.perVariant {
					vs = slices.Clone(o.variants)
					if rep%2 == 0 { // the variants take turns going first
						slices.Reverse(vs)
					}
				}
				for _, v := range vs {
					ds, err := t.run(ctx, e, v)
					if err != nil {
						return fmt.Errorf("%s: %w", v.key(t.figs[0].key), err)
					}
					for i, f := range t.figs {
						key := v.key(f.key)
						rate := float64(t.count) / ds[i].Seconds()
						res.Samples[key] = append(res.Samples[key], rate)
						logf("rep %d/%d %-36s %10.0f /s", rep, o.reps, key, rate)
					}
				}
			}
		}
	}
	if o.runs("latency") {
		res.LatencyMS = map[string]latency{}
		for _, s := range latencySpecs(o.variants) {
			logf("latency %s: %d events/s for %v", s.key, o.latencyRate, o.latencyDuration)
			l, err := measureLatency(ctx, e, s, o.latencyRate, o.latencyDuration)
			if err != nil {
				return fmt.Errorf("latency %s: %w", s.key, err)
			}
			res.LatencyMS[s.key] = l
			logf("latency %s: p50 %.2f ms, p99 %.2f ms, max %.2f ms", s.key, l.P50, l.P99, l.Max)
		}
	}
	if o.runs("retained") {
		if err := measureRetained(ctx, e, o, res, logf); err != nil {
			return fmt.Errorf("retained: %w", err)
		}
	}
	if o.runs("shared") {
		if err := measureShared(ctx, e, o, res, logf); err != nil {
			return err
		}
	}
	if o.runs("micro") && o.micro {
		logf("micro-benchmarks: go test -bench in the library module")
		count := 3
		if o.quick {
			count = 1
		}
		mb, err := runMicro(ctx, count)
		if err != nil {
			return fmt.Errorf("micro-benchmarks: %w", err)
		}
		res.Micro = mb
	}
	return nil
}

// measureRetained drains o.rows new rows with o.retainedRows older rows behind the cursor, and
// the same on an empty changelog, alternating, in three ways: batched saves (the reported
// ratio: reads set the pace), per-ack saves, and batched saves without the processed flag
// (reads alone).
func measureRetained(ctx context.Context, e *env, o options, res *results, logf func(string, ...any)) error {
	logf("retained: filling %d older rows", o.retainedRows)
	r, err := newRetained(ctx, e, o.retainedRows)
	if err != nil {
		return err
	}
	defer r.d.drop(ctx)
	specs := []struct {
		key  string
		spec drainSpec
	}{
		{"retained_drain_ratio", drainSpec{checkpointInterval: batchedInterval}},
		{"retained_drain_ratio_sync", drainSpec{}},
		{"retained_drain_ratio_noflag", drainSpec{checkpointInterval: batchedInterval, disableProcessedFlag: true}},
	}
	for rep := 1; rep <= o.reps; rep++ {
		for _, s := range specs {
			empty, err := drainFresh(ctx, e, upgraded, o.rows, s.spec)
			if err != nil {
				return err
			}
			retained, err := r.drainNew(ctx, o.rows, s.spec)
			if err != nil {
				return err
			}
			ratio := retained.Seconds() / empty.Seconds()
			res.Samples[s.key] = append(res.Samples[s.key], ratio)
			logf("rep %d/%d %-28s empty %v, retained %v, ratio %.2f", rep, o.reps, s.key,
				empty.Round(time.Millisecond), retained.Round(time.Millisecond), ratio)
		}
	}
	res.RetainedDrainRatio = median(res.Samples["retained_drain_ratio"])
	res.RetainedDrainRatioSync = median(res.Samples["retained_drain_ratio_sync"])
	res.RetainedDrainRatioNoFlag = median(res.Samples["retained_drain_ratio_noflag"])
	return nil
}
