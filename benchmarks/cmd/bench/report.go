package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

var itoa = strconv.Itoa

// machine describes where the run happened.
type machine struct {
	CPU      string
	Cores    int
	Go       string
	Postgres string
	Command  string
	Date     string
}

// collectMachine reads the CPU model, the Go version and the server's version.
func collectMachine(ctx context.Context, e *env) (machine, error) {
	m := machine{
		CPU:     cpuModel(),
		Cores:   runtime.NumCPU(),
		Go:      runtime.Version(),
		Command: strings.Join(append([]string{"go run ./cmd/bench"}, os.Args[1:]...), " "),
		Date:    time.Now().UTC().Format("2006-01-02"),
	}
	d, err := e.newDatabase(ctx, upgraded)
	if err != nil {
		return m, err
	}
	defer d.drop(ctx)
	err = d.QueryRowContext(ctx, `SELECT current_setting('server_version') || ', fsync=' ||
		current_setting('fsync') || ', synchronous_commit=' || current_setting('synchronous_commit')`).Scan(&m.Postgres)
	return m, err
}

// cpuModel returns the first "model name" of /proc/cpuinfo, or GOARCH where there is none.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

// figure is one row of the table of figures.
type figure struct {
	key, value, what string
}

// figures lists the run's figures for the table and the report.
func (r *results) figures() []figure {
	var fs []figure
	for _, t := range r.throughputs() {
		vs := []variant{upgraded}
		if t.perVariant {
			vs = r.variantsRun()
		}
		for _, f := range t.figs {
			for _, v := range vs {
				if s, ok := r.Stats[v.key(f.key)]; ok {
					fs = append(fs, figure{v.key(f.key), formatStat(s) + " /s", f.what})
				}
			}
		}
	}
	for _, s := range latencySpecs(r.variantsRun()) {
		l, ok := r.LatencyMS[s.key]
		if !ok {
			continue
		}
		what := fmt.Sprintf("COMMIT returned → received; %d writers, %d events at %.0f/s offered, %d early, %d missed",
			s.writers, l.Events, l.OfferedRate, l.Early, l.Missed)
		if s.longTx {
			what += "; a transaction open in another database meanwhile"
		}
		fs = append(fs, figure{"latency_ms " + s.key, formatLatency(l), what})
		if f := l.NotifyFloor; f != nil {
			fs = append(fs, figure{"  notify floor", formatLatency(*f),
				"COMMIT returned → NOTIFY received on a bare LISTEN connection, same run"})
		}
	}
	if s := r.SaturationHeapMB; s != nil {
		fs = append(fs, figure{"saturation_heap_mb",
			fmt.Sprintf("%.1f → %.1f", s.AfterEarlyMB, s.AfterAllMB),
			fmt.Sprintf("HeapAlloc after %s and %s unacked deliveries (%d evicted, %d pending)",
				countLabel(saturationEarly), countLabel(s.Deliveries), s.Evicted, s.Pending)})
	}
	if r.RetainedDrainRatio > 0 {
		fs = append(fs,
			figure{"retained_drain_ratio", formatStat(r.Stats["retained_drain_ratio"]),
				fmt.Sprintf("drain_batched of %d new rows behind %s retained rows ÷ the same on an empty changelog",
					r.Params.Rows, countLabel(r.Params.RetainedRows))},
			figure{"retained_drain_ratio_sync", formatStat(r.Stats["retained_drain_ratio_sync"]),
				"the same with per-ack saves (drain_sync)"},
			figure{"retained_drain_ratio_noflag", formatStat(r.Stats["retained_drain_ratio_noflag"]),
				"the same with batched saves and DisableProcessedFlag: reads alone"})
	}
	fs = append(fs, r.sharedFigures()...)
	if m := r.Micro; m != nil {
		fs = append(fs,
			figure{"pending push+ack", fmt.Sprintf("%.1f ns, %.0f allocs", m.PushAckNs, m.PushAckAllocs),
				"BenchmarkPendingPushAck"},
			figure{"MarkProcessed (batched)", fmt.Sprintf("%.1f ns, %.0f allocs", m.MarkProcessedBatchedNs, m.MarkProcessedBatchedAllocs),
				"BenchmarkMarkProcessedBatched: ring push + MarkProcessed"},
			figure{"delivery path tracked/untracked", fmt.Sprintf("%.0f / %.0f ns", m.DeliveryTrackedNs, m.DeliveryUntrackedNs),
				"BenchmarkDeliveryPath: build event, lock, send, receive, ack; with/without the ring"},
			figure{"checkpoint position", fmt.Sprintf("%.1f ns, %.0f allocs", m.CheckpointNs, m.CheckpointAllocs),
				"BenchmarkCheckpointPosition: min of cursor, floor and pending, 2048 pending"},
			figure{"build event insert/update", fmt.Sprintf("%.1f / %.1f µs", m.BuildInsertNs/1000, m.BuildUpdateNs/1000),
				"BenchmarkBuildEvent: one event document from a ~1 KB changelog row (JSON decode and diff)"})
		fs = append(fs, figure{"UnmarshalDocument map/text", fmt.Sprintf("%.1f / %.1f µs, %.0f allocs",
			m.UnmarshalDocumentMapNs/1000, m.UnmarshalDocumentNs/1000, m.UnmarshalDocumentAllocs),
			"BenchmarkUnmarshalDocument: a ~1 KB health document into a struct, by the map's JSON round trip / by UnmarshalDocument"})
	}
	return fs
}

// formatStat renders a figure as its median and range: "5230 [4990–5400]". Rates are
// rounded to units, ratios to hundredths.
func formatStat(s stat) string {
	prec := 0
	if s.Median < 100 {
		prec = 2
	}
	if s.N == 1 {
		return fmt.Sprintf("%.*f", prec, s.Median)
	}
	return fmt.Sprintf("%.*f [%.*f–%.*f]", prec, s.Median, prec, s.Min, prec, s.Max)
}

// writeTable prints the figures and the targets as aligned text.
func writeTable(w io.Writer, r *results) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURE\tVALUE\tWHAT")
	for _, f := range r.figures() {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f.key, f.value, f.what)
	}
	fmt.Fprintln(tw, "\t\t")
	fmt.Fprintln(tw, "TARGET\tVALUE\tGOAL\tMARK")
	for _, t := range r.targets() {
		v, g, m := formatTarget(t)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.name, v, g, m)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nrows %d, reps %d (median [min–max]), wall time %.0f s\n", r.Params.Rows, r.Params.Reps, r.WallSeconds)
}

// formatLatency renders a latency distribution.
func formatLatency(l latency) string {
	return fmt.Sprintf("p50 %.2f  p99 %.2f  max %.2f", l.P50, l.P99, l.Max)
}
