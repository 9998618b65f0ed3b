package main

import "fmt"

// Goals of the upgraded schema's snapshot-delta reads, each held against the legacy reads
// measured in the same run.
const (
	// drainDeltaGoal is the lowest ratio of a drain's throughput on the upgraded schema to the
	// same drain's on the legacy one.
	drainDeltaGoal = 0.95
	// insertDeltaGoal is the lowest ratio of the writers' insert throughput with the txid column
	// and its index to the same without them.
	insertDeltaGoal = 0.9
	// hybridP50GoalMS and hybridP99GoalMS bound the hybrid latency, with and without a long
	// transaction open in another database.
	hybridP50GoalMS = 2
	hybridP99GoalMS = 20
)

// variantLatencyRuns are the latency runs made on each schema variant.
var variantLatencyRuns = []string{"hybrid_4w", "hybrid_4w_longtx"}

// comparison is one figure measured on both schema variants in the same run.
type comparison struct {
	key              string  // the figure, as keyed on the upgraded schema
	legacy, upgraded string  // the figure on each schema, formatted
	ratio            float64 // upgraded ÷ legacy; 0 if either is 0
	target           *target // the goal of the comparison, if it has one
}

// throughputComparisons lists the per-variant throughputs measured on both schemas: the drains
// and the writers' inserts with their goal on the ratio, the read ceiling without one.
func (r *results) throughputComparisons() []comparison {
	var cs []comparison
	for _, t := range r.throughputs() {
		if !t.perVariant {
			continue
		}
		for _, f := range t.figs {
			l, u := r.Stats[legacy.key(f.key)], r.Stats[upgraded.key(f.key)]
			if l.N == 0 || u.N == 0 {
				continue
			}
			c := comparison{key: f.key, legacy: formatStat(l), upgraded: formatStat(u)}
			c.ratio, _ = ratio(u.Median, l.Median)
			if t.deltaGoal > 0 {
				tg := ratioTarget("upgraded ÷ legacy "+f.key, u.Median, l.Median, upgraded.key(f.key), legacy.key(f.key),
					t.deltaGoal)
				tg.compared = true
				c.target = &tg
			}
			cs = append(cs, c)
		}
	}
	return cs
}

// latencyComparisons lists the p50 and p99 of the latency runs made on both schemas, each with
// its goal on the upgraded schema's figure.
func (r *results) latencyComparisons() []comparison {
	var cs []comparison
	for _, run := range variantLatencyRuns {
		l, lok := r.LatencyMS[legacy.key(run)]
		u, uok := r.LatencyMS[upgraded.key(run)]
		if !lok || !uok {
			continue
		}
		lq := hybridQuantiles(l)
		for i, q := range hybridQuantiles(u) {
			tg := latencyTarget(upgraded.key(run), q)
			c := comparison{key: "latency_ms " + run + " " + q.name, legacy: fmt.Sprintf("%.2f ms", lq[i].ms),
				upgraded: fmt.Sprintf("%.2f ms", q.ms), target: &tg}
			c.ratio, _ = ratio(q.ms, lq[i].ms)
			cs = append(cs, c)
		}
	}
	return cs
}

// quantile is one quantile of a latency run, with its goal.
type quantile struct {
	name     string
	ms, goal float64
}

// hybridQuantiles are the quantiles of a hybrid latency run that have goals.
func hybridQuantiles(l latency) []quantile {
	return []quantile{{"p50", l.P50, hybridP50GoalMS}, {"p99", l.P99, hybridP99GoalMS}}
}

// latencyTarget is the goal of quantile q of latency run key. The upgraded schema's runs made
// on both variants are shown with the comparison of the variants.
func latencyTarget(key string, q quantile) target {
	compared := false
	for _, run := range variantLatencyRuns {
		compared = compared || key == upgraded.key(run)
	}
	return target{name: key + " latency " + q.name, uses: "`latency_ms " + key + "`", value: q.ms, goal: q.goal,
		le: true, unit: "ms", ok: true, compared: compared}
}

// comparedGoal is the result of one goal of the comparison, in the JSON output.
type comparedGoal struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Goal  string  `json:"goal"`
	Pass  bool    `json:"pass"`
}

// setComparisons sets DeltaVsLegacy and DeltaGoals from the comparisons of the run.
func (r *results) setComparisons() {
	r.DeltaVsLegacy, r.DeltaGoals = nil, nil
	for _, c := range append(r.throughputComparisons(), r.latencyComparisons()...) {
		if r.DeltaVsLegacy == nil {
			r.DeltaVsLegacy = map[string]float64{}
		}
		r.DeltaVsLegacy[c.key] = c.ratio
		if t := c.target; t != nil {
			_, goal, _ := formatTarget(*t)
			r.DeltaGoals = append(r.DeltaGoals, comparedGoal{Name: t.name, Value: t.value, Goal: goal, Pass: t.ok && t.pass()})
		}
	}
}
