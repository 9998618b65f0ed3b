package pgchangestream

import (
	"errors"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
)

// The store-client's PostgreSQL pipelines whose results differ with $exists: the data of
// PostgreSQLPipelineBuilder's BuildProcessableHealthEventInsertsPipeline (fault-quarantine) and
// BuildProcessableNonFatalUnhealthyInsertsPipeline (health-events-analyzer), as the adapter of
// docs/migrating.md hands them over. Processing strategies: 1 EXECUTE_REMEDIATION, 2 STORE_ONLY,
// 3 STORE_AND_ANALYSE; protobuf omits the unset one (0) from the document.
var (
	processableInsertsPipeline = []map[string]any{{"$match": map[string]any{
		"operationType": map[string]any{"$in": []any{"insert"}},
		"$or": []any{
			map[string]any{"fullDocument.healthevent.processingstrategy": int32(1)},
			map[string]any{"fullDocument.healthevent.processingstrategy": map[string]any{"$exists": false}},
		},
	}}}
	nonFatalUnhealthyPipeline = []map[string]any{{"$match": map[string]any{
		"operationType":                      map[string]any{"$in": []any{"insert", "update"}},
		"fullDocument.healthevent.agent":     map[string]any{"$ne": "health-events-analyzer"},
		"fullDocument.healthevent.ishealthy": false,
		"$or": []any{
			map[string]any{"fullDocument.healthevent.processingstrategy": int32(1)},
			map[string]any{"fullDocument.healthevent.processingstrategy": int32(3)},
			map[string]any{"fullDocument.healthevent.processingstrategy": map[string]any{"$exists": false}},
		},
	}}}
)

// healthEventScenario returns health_events events by name: inserts and updates, by agent,
// health and processing strategy (0: unset).
func healthEventScenario() map[string]Event {
	out := map[string]Event{}
	for _, op := range []string{"insert", "update"} {
		for _, agent := range []string{"gpu-health-monitor", "health-events-analyzer"} {
			for _, healthy := range []bool{false, true} {
				for _, strategy := range []int{0, 1, 2, 3} {
					he := map[string]any{"agent": agent, "nodename": "n1"}
					if healthy {
						he["ishealthy"] = true // protobuf omits false
					}
					if strategy != 0 {
						he["processingstrategy"] = float64(strategy)
					}
					name := op + "/" + agent + "/" + map[bool]string{false: "unhealthy", true: "healthy"}[healthy] +
						"/" + []string{"unset", "remediate", "store-only", "analyse"}[strategy]
					out[name] = Event{"operationType": op, "fullDocument": map[string]any{"healthevent": he}}
				}
			}
		}
	}
	return out
}

// delivered returns the names of the scenario's events that cfg's pipeline lets through.
func delivered(t *testing.T, cfg Config) []string {
	t.Helper()
	cfg, err := cfg.withPipeline()
	require.NoError(t, err)
	var names []string
	for name, ev := range healthEventScenario() {
		if cfg.Filter(ev) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// TestStoreClientCompatPipelines checks that, with StoreClientCompat, the services' pipelines
// let through the events the store-client delivered, where $exists was an unsupported
// operator that never held unless the pipeline was wrapped by client.WithExtendedFilters; and
// that without it (New's default) the events with an unset processing strategy are delivered
// too, as MongoDB does.
func TestStoreClientCompatPipelines(t *testing.T) {
	quarantine := Config{Pipeline: processableInsertsPipeline}
	analyzer := Config{Pipeline: nonFatalUnhealthyPipeline}
	withCompat := func(cfg Config, extended bool) Config {
		cfg.StoreClientCompat, cfg.ExtendedFilters = true, extended
		return cfg
	}
	upstreamQuarantine := []string{
		"insert/gpu-health-monitor/healthy/remediate", "insert/gpu-health-monitor/unhealthy/remediate",
		"insert/health-events-analyzer/healthy/remediate", "insert/health-events-analyzer/unhealthy/remediate",
	}
	upstreamAnalyzer := []string{
		"insert/gpu-health-monitor/unhealthy/analyse", "insert/gpu-health-monitor/unhealthy/remediate",
		"update/gpu-health-monitor/unhealthy/analyse", "update/gpu-health-monitor/unhealthy/remediate",
	}
	unset := func(names ...string) []string {
		var out []string
		for _, n := range names {
			out = append(out, n[:len(n)-len("remediate")]+"unset")
		}
		return out
	}
	sorted := func(a ...[]string) []string {
		var out []string
		for _, x := range a {
			out = append(out, x...)
		}
		sort.Strings(out)
		return out
	}
	withUnsetQuarantine := sorted(upstreamQuarantine, unset(upstreamQuarantine...))
	withUnsetAnalyzer := sorted(upstreamAnalyzer, unset(
		"insert/gpu-health-monitor/unhealthy/remediate", "update/gpu-health-monitor/unhealthy/remediate"))

	require.Equal(t, upstreamQuarantine, delivered(t, withCompat(quarantine, false)))
	require.Equal(t, upstreamAnalyzer, delivered(t, withCompat(analyzer, false)))
	require.Equal(t, withUnsetQuarantine, delivered(t, quarantine))
	require.Equal(t, withUnsetAnalyzer, delivered(t, analyzer))
	require.Equal(t, withUnsetQuarantine, delivered(t, withCompat(quarantine, true)), "WithExtendedFilters")
	require.Equal(t, withUnsetAnalyzer, delivered(t, withCompat(analyzer, true)), "WithExtendedFilters")
}

func TestConfigPipeline(t *testing.T) {
	t.Run("combined with Filter", func(t *testing.T) {
		seen := 0
		cfg, err := Config{
			Pipeline: []map[string]any{{"$match": map[string]any{"operationType": "update"}}},
			Filter:   func(Event) bool { seen++; return seen%2 == 1 },
		}.withPipeline()
		require.NoError(t, err)
		require.True(t, cfg.Filter(Event{"operationType": "update"}))
		require.False(t, cfg.Filter(Event{"operationType": "update"}), "Filter said no")
		require.False(t, cfg.Filter(Event{"operationType": "insert"}), "the pipeline said no")
		require.Equal(t, 2, seen, "Filter runs only for events the pipeline passes")
	})
	t.Run("no conditions", func(t *testing.T) {
		cfg, err := Config{Pipeline: []map[string]any{{"$match": map[string]any{}}}}.withPipeline()
		require.NoError(t, err)
		require.Nil(t, cfg.Filter)
	})
	t.Run("invalid", func(t *testing.T) {
		db, _ := mockDB(t)
		_, err := New(Config{DB: db, ClientName: "c", TableName: "t", Logger: quietLogger,
			Pipeline: []map[string]any{{"$match": map[string]any{"a": map[string]any{"$regex": "x"}}}}})
		require.True(t, errors.Is(err, ErrInvalidConfig), "%v", err)
		require.ErrorContains(t, err, "Config.Pipeline: pgchangestream: pipeline stage 0: field \"a\": $regex")
	})
}

func TestStoreClientCompatDefaults(t *testing.T) {
	db, _ := mockDB(t)
	row := evRow("UPDATE", `{"document":{"s":{"q":"x"}}}`, `{"document":{"s":{"q":"x","r":null}}}`)
	old := NewPostgreSQLChangeStreamWatcher(db, "c", "health_events", "", ModePolling)
	require.NoError(t, old.Err())
	w, err := New(Config{DB: db, ClientName: "c", TableName: "health_events", DocumentField: "document", Logger: quietLogger})
	require.NoError(t, err)
	for _, tc := range []struct {
		w    *Watcher
		want map[string]any
	}{{old, nil}, {w, map[string]any{"s.r": nil}}} {
		for _, rawDocs := range []bool{false, true} {
			tc.w.cfg.RawDocuments = rawDocs
			ev, raw, err := tc.w.event(row)
			require.NoError(t, err)
			require.Equal(t, tc.want, EventWithToken{Event: ev, raw: raw}.UpdatedFields(),
				"StoreClientCompat %v, RawDocuments %v", tc.w.cfg.StoreClientCompat, rawDocs)
		}
	}
}
