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
		require.Equal(t, m.Kind == Counter, strings.HasSuffix(m.Prometheus, "_total"), m.Prometheus)
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
