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
	d, err := e.newDatabase(ctx)
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
	rate := func(key string, v float64, what string) {
		if v > 0 {
			fs = append(fs, figure{key, fmt.Sprintf("%.0f /s", v), what})
		}
	}
	rate("drain_sync_eps", r.DrainSyncEPS, "watcher (polling), MarkProcessed each event, CheckpointInterval 0")
	rate("drain_batched_eps", r.DrainBatchedEPS, "same, CheckpointInterval "+batchedInterval.String()+", final Flush")
	rate("drain_sync_concurrent_eps", r.DrainSyncConcurrentEPS,
		itoa(concurrentWorkers)+" workers, contiguous watermark acked, CheckpointInterval 0")
	rate("drain_sync_noflag_eps", r.DrainSyncNoFlagEPS, "drain_sync with DisableProcessedFlag")
	rate("drain_batched_noflag_eps", r.DrainBatchedNoFlagEPS, "drain_batched with DisableProcessedFlag")
	rate("drain_batched_unanalyzed_eps", r.DrainBatchedUnanalyzedEPS, "drain_batched on a changelog never analyzed")
	rate("watermill_eps", r.WatermillEPS, "watermill-sql v4 PostgreSQL subscriber, batch 100, ack each")
	rate("select_decode_limit_rps", r.SelectDecodeLimitRPS, "one SELECT of the rows + JSON decode into event maps")
	rate("upsert_limit_wps", r.UpsertLimitWPS, "single-client token upsert, one commit each")
	for _, mode := range latencyModes {
		if l, ok := r.LatencyMS[string(mode)]; ok {
			fs = append(fs, figure{"latency_ms " + string(mode), formatLatency(l),
				fmt.Sprintf("COMMIT returned → received; %d events at %.0f/s offered, %d early, %d missed",
					l.Events, l.OfferedRate, l.Early, l.Missed)})
			if f := l.NotifyFloor; f != nil {
				fs = append(fs, figure{"  notify floor", formatLatency(*f),
					"COMMIT returned → NOTIFY received on a bare LISTEN connection, same run"})
			}
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
			figure{"retained_drain_ratio", fmt.Sprintf("%.2f", r.RetainedDrainRatio),
				fmt.Sprintf("drain_batched of %d new rows behind %s retained rows ÷ the same on an empty changelog",
					r.Params.Rows, countLabel(r.Params.RetainedRows))},
			figure{"retained_drain_ratio_sync", fmt.Sprintf("%.2f", r.RetainedDrainRatioSync), "the same with per-ack saves (drain_sync)"},
			figure{"retained_drain_ratio_noflag", fmt.Sprintf("%.2f", r.RetainedDrainRatioNoFlag),
				"the same with batched saves and DisableProcessedFlag: reads alone"})
	}
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
	}
	return fs
}

// formatTarget renders a target's value, goal and mark.
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
	value = strconv.FormatFloat(t.value, 'f', prec, 64) + " " + t.unit
	goal = op + " " + strconv.FormatFloat(t.goal, 'f', -1, 64) + " " + t.unit
	mark = "MISS"
	if t.pass() {
		mark = "pass"
	}
	return value, goal, mark
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
	fmt.Fprintf(w, "\nrows %d, reps %d (median), wall time %.0f s\n", r.Params.Rows, r.Params.Reps, r.WallSeconds)
}

// formatLatency renders a latency distribution.
func formatLatency(l latency) string {
	return fmt.Sprintf("p50 %.2f  p99 %.2f  max %.2f", l.P50, l.P99, l.Max)
}
