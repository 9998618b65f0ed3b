package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream"
)

func TestNamesAreUniqueAndFollowEachConvention(t *testing.T) {
	prom, otel := map[string]bool{}, map[string]bool{}
	for _, m := range All {
		require.False(t, prom[m.Prometheus], "Prometheus name %s twice", m.Prometheus)
		require.False(t, otel[m.OTel], "OpenTelemetry name %s twice", m.OTel)
		prom[m.Prometheus], otel[m.OTel] = true, true
		require.Equal(t, m.Kind != Gauge, strings.HasSuffix(m.Prometheus, "_total"), m.Prometheus)
		require.NotContains(t, m.OTel, "_", "OpenTelemetry names separate words with dots: %s", m.OTel)
		require.NotEmpty(t, m.Unit, m.OTel)
	}
}

func TestLagIsTheWatchersLagInSeconds(t *testing.T) {
	for _, m := range All {
		if m.OTel == "pgchangestream.lag" {
			require.Equal(t, 2.5, m.Value(Reading{Stats: pgchangestream.Stats{Lag: 2500 * time.Millisecond}}))
			require.Equal(t, "pgchangestream_lag_seconds", m.Prometheus)
			return
		}
	}
	t.Fatal("no lag metric")
}

func TestProcessMetricsReadStatsProcess(t *testing.T) {
	r := Reading{Stats: pgchangestream.Stats{Process: pgchangestream.ProcessStats{InFlight: 7, Deferred: 4, BusyWorkers: 3,
		Handled: 40, Retries: 5, Parked: 2, HandlerTime: 1500 * time.Millisecond, LongestKeyQueue: 9, LongestKey: "node-1"}}}
	want := map[string]float64{
		"pgchangestream_process_in_flight": 7, "pgchangestream_process_deferred": 4, "pgchangestream_process_busy_workers": 3,
		"pgchangestream_process_handled_total": 40, "pgchangestream_process_retries_total": 5,
		"pgchangestream_process_parked_total": 2, "pgchangestream_process_handler_seconds_total": 1.5,
		"pgchangestream_process_longest_key_queue": 9,
	}
	got := map[string]float64{}
	for _, m := range All {
		if strings.HasPrefix(m.Prometheus, "pgchangestream_process_") {
			got[m.Prometheus] = m.Value(r)
		}
	}
	require.Equal(t, want, got)
}
