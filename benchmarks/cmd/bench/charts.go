package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// chartsDir is the folder of the charts, beside the Markdown report and named after it
// relative to the report's folder: -out ../docs/benchmarks.md draws into ../docs/benchmarks/.
const chartsDir = "benchmarks"

// chart is one figure drawn from the results: its file name in chartsDir, what the report says
// of it, and how it is drawn.
type chart struct {
	file, caption string
	draw          func() (*plot.Plot, error)
}

// charts returns the charts the results allow: drain rate by backlog against watermill, the
// latency quantiles of each run, and Process throughput by workers; a chart whose figures were
// not measured is left out.
func (r *results) charts() []chart {
	var cs []chart
	if len(r.Backlogs) > 0 {
		cs = append(cs, chart{"drain_backlog.svg", "Drain rate by backlog: `drain_batched` of each schema against watermill",
			r.backlogPlot})
	}
	if len(r.latencyKeys()) > 0 {
		cs = append(cs, chart{"latency.svg", "Latency, COMMIT returned → received: p50, p99 and max of each run (log scale)",
			r.latencyPlot})
	}
	if len(r.processSeries()) > 0 {
		cs = append(cs, chart{"process_workers.svg", "Process throughput by workers, per handler (`process_*` figures)",
			r.processPlot})
	}
	return cs
}

// chartsMarkdown is the report's section showing the charts, empty when there is none.
func chartsMarkdown(r *results) string {
	cs := r.charts()
	if len(cs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("## Charts\n\nDrawn by the same run from the figures below, as SVG files in `" + chartsDir +
		"/` beside this page (`-out` draws them beside its report).\n\n")
	for _, c := range cs {
		fmt.Fprintf(&b, "**%s**\n\n![%s](%s/%s)\n\n", c.caption, strings.TrimSuffix(c.file, ".svg"), chartsDir, c.file)
	}
	return b.String()
}

// writeCharts draws every chart of r as an SVG file into dir, creating it.
func writeCharts(r *results, dir string) error {
	cs := r.charts()
	if len(cs) == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, c := range cs {
		p, err := c.draw()
		if err != nil {
			return fmt.Errorf("chart %s: %w", c.file, err)
		}
		if err := p.Save(8*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, c.file)); err != nil {
			return fmt.Errorf("chart %s: %w", c.file, err)
		}
	}
	return nil
}

// bars is one series of a grouped bar chart.
type bars struct {
	name   string
	values plotter.Values
}

// groupedBars draws the series side by side over the nominal x labels.
func groupedBars(title, ylabel string, labels []string, series []bars) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	width := vg.Points(240 / float64(len(series)*max(len(labels), 1)))
	top := 0.0
	for i, s := range series {
		b, err := plotter.NewBarChart(s.values, width)
		if err != nil {
			return nil, err
		}
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		b.Offset = width * vg.Length(float64(i)-float64(len(series)-1)/2)
		p.Add(b)
		p.Legend.Add(s.name, b)
		top = max(top, slices.Max(s.values))
	}
	p.NominalX(labels...)
	p.X.Min, p.X.Max = -0.5, float64(len(labels))-0.5
	p.Y.Min, p.Y.Max = 0, top*1.35 // room for the legend above the bars
	p.Y.Tick.Marker = plainTicks{}
	return p, nil
}

// plainTicks are plot's default ticks labelled without trailing zeros: 5000, 2500, 0.5.
type plainTicks struct{}

func (plainTicks) Ticks(min, max float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'f', -1, 64)
		}
	}
	return ts
}

// backlogPlot is the drain rate of each backlog size: drain_batched per schema variant, and
// watermill with and without decoding.
func (r *results) backlogPlot() (*plot.Plot, error) {
	labels := make([]string, len(r.Params.Backlogs))
	for i, b := range r.Params.Backlogs {
		labels[i] = countLabel(b)
	}
	var series []bars
	for _, v := range r.variantsRun() {
		s := bars{name: "drain_batched (" + string(v) + ")", values: make(plotter.Values, len(labels))}
		for _, b := range r.Backlogs {
			if b.Variant == string(v) {
				s.values[slices.Index(r.Params.Backlogs, b.Rows)] = b.DrainBatchedEPS
			}
		}
		series = append(series, s)
	}
	decoding := bars{name: "watermill_decode", values: make(plotter.Values, len(labels))}
	raw := bars{name: "watermill", values: make(plotter.Values, len(labels))}
	for i, b := range r.Params.Backlogs {
		decoding.values[i] = r.fig(backlogKey("watermill_decode_eps", b), upgraded)
		raw.values[i] = r.fig(backlogKey("watermill_eps", b), upgraded)
	}
	p, err := groupedBars("Drain rate by backlog", "events/s (median)", labels, append(series, decoding, raw))
	if p != nil {
		p.X.Label.Text = "backlog (rows)"
	}
	return p, err
}

// latencyKeys are the latency runs of r, in the report's order.
func (r *results) latencyKeys() []string {
	var keys []string
	for _, s := range latencySpecs(r.variantsRun()) {
		if _, ok := r.LatencyMS[s.key]; ok {
			keys = append(keys, s.key)
		}
	}
	return keys
}

// latencyFloorMS is where the log scale of the latency chart starts: quantiles below it (an
// event received before its writer saw COMMIT return counts 0 ms) are drawn at it.
const latencyFloorMS = 0.01

// latencyPlot is p50, p99 and max of each latency run, as points on a log scale.
func (r *results) latencyPlot() (*plot.Plot, error) {
	keys := r.latencyKeys()
	p := plot.New()
	p.Title.Text = "Latency, COMMIT returned → received"
	p.Y.Label.Text = "ms (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	quantiles := []struct {
		name string
		of   func(latency) float64
	}{
		{"p50", func(l latency) float64 { return l.P50 }},
		{"p99", func(l latency) float64 { return l.P99 }},
		{"max", func(l latency) float64 { return l.Max }},
	}
	for i, q := range quantiles {
		xys := make(plotter.XYs, len(keys))
		for j, key := range keys {
			xys[j] = plotter.XY{X: float64(j), Y: math.Max(q.of(r.LatencyMS[key]), latencyFloorMS)}
		}
		points, err := plotter.NewScatter(xys)
		if err != nil {
			return nil, err
		}
		points.Color, points.Shape, points.Radius = plotutil.Color(i), plotutil.Shape(i), vg.Points(4)
		p.Add(points)
		p.Legend.Add(q.name, points)
	}
	p.NominalX(keys...)
	p.X.Min, p.X.Max = -0.5, float64(len(keys))-0.5
	p.X.Tick.Label.Rotation = math.Pi / 8
	p.X.Tick.Label.XAlign, p.X.Tick.Label.YAlign = draw.XRight, draw.YTop
	return p, nil
}

// processFigure matches a Process figure with its worker count: process_<handler>_w<N>_eps.
var processFigure = regexp.MustCompile(`^process_(.+)_w(\d+)_eps$`)

// processSeries returns, per handler (process_<handler>_w<N>_eps, upgraded schema), the medians
// by worker count, sorted by workers.
func (r *results) processSeries() map[string]plotter.XYs {
	series := map[string]plotter.XYs{}
	for key, s := range r.Stats {
		m := processFigure.FindStringSubmatch(key)
		if m == nil {
			continue
		}
		workers, err := strconv.Atoi(m[2])
		if err != nil || workers <= 0 {
			continue
		}
		series[m[1]] = append(series[m[1]], plotter.XY{X: float64(workers), Y: s.Median})
	}
	for _, xys := range series {
		slices.SortFunc(xys, func(a, b plotter.XY) int { return int(a.X - b.X) })
	}
	return series
}

// processPlot is Process throughput by workers, a line per handler, workers on a log scale.
func (r *results) processPlot() (*plot.Plot, error) {
	series := r.processSeries()
	names := make([]string, 0, len(series))
	for name := range series {
		names = append(names, name)
	}
	slices.Sort(names)
	p := plot.New()
	p.Title.Text = "Process throughput by workers"
	p.X.Label.Text = "workers"
	p.Y.Label.Text = "events/s (median)"
	var workers []float64
	for _, xys := range series {
		for _, xy := range xys {
			workers = append(workers, xy.X)
		}
	}
	slices.Sort(workers)
	workers = slices.Compact(workers)
	ticks := make(plot.ConstantTicks, 0, len(workers))
	for _, w := range workers {
		ticks = append(ticks, plot.Tick{Value: w, Label: strconv.FormatFloat(w, 'f', -1, 64)})
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = ticks
	p.Y.Min = 0
	p.Y.Tick.Marker = plainTicks{}
	p.Legend.Top, p.Legend.Left = true, true
	for i, name := range names {
		line, points, err := plotter.NewLinePoints(series[name])
		if err != nil {
			return nil, err
		}
		line.Color, points.Color, points.Shape = plotutil.Color(i), plotutil.Color(i), plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add("process_"+name, line, points)
	}
	p.X.Min, p.X.Max = workers[0]/1.5, workers[len(workers)-1]*1.5
	p.Y.Max *= 1.2 // room for the legend
	return p, nil
}
