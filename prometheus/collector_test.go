package prometheus

import (
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream"
	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// fakeWatcher returns fixed Stats and health.
type fakeWatcher struct {
	stats  pgchangestream.Stats
	health error
}

func (f *fakeWatcher) Stats() pgchangestream.Stats { return f.stats }
func (f *fakeWatcher) Health() error               { return f.health }

func TestCollectorExportsStatsAndHealth(t *testing.T) {
	c := NewCollector()
	c.Add("billing", &fakeWatcher{stats: pgchangestream.Stats{
		Delivered: 10, Acked: 7, Filtered: 2, Evicted: 1, Pending: 3,
		CheckpointWrites: 5, CheckpointErrors: 1, ReadErrors: 4, LoadErrors: 2,
		Lag: 1500 * time.Millisecond, ListenUp: true, Active: true, FloorActive: true, Rewinds: 3,
		Process: pgchangestream.ProcessStats{InFlight: 12, Deferred: 3, BusyWorkers: 4, Handled: 90, Retries: 6, Parked: 1,
			HandlerTime: 2250 * time.Millisecond, LongestKeyQueue: 8, LongestKey: "node-3"},
	}})
	c.Add("audit", &fakeWatcher{health: errors.New("read changelog: permission denied")})
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP pgchangestream_events_delivered_total Events handed to the consumer.
# TYPE pgchangestream_events_delivered_total counter
pgchangestream_events_delivered_total{client="audit"} 0
pgchangestream_events_delivered_total{client="billing"} 10
# HELP pgchangestream_events_acked_total Deliveries acknowledged.
# TYPE pgchangestream_events_acked_total counter
pgchangestream_events_acked_total{client="audit"} 0
pgchangestream_events_acked_total{client="billing"} 7
# HELP pgchangestream_events_filtered_total Events dropped by Config.Filter.
# TYPE pgchangestream_events_filtered_total counter
pgchangestream_events_filtered_total{client="audit"} 0
pgchangestream_events_filtered_total{client="billing"} 2
# HELP pgchangestream_events_evicted_total Unacknowledged deliveries folded into the floor beyond Config.MaxPending.
# TYPE pgchangestream_events_evicted_total counter
pgchangestream_events_evicted_total{client="audit"} 0
pgchangestream_events_evicted_total{client="billing"} 1
# HELP pgchangestream_pending Deliveries not yet acknowledged.
# TYPE pgchangestream_pending gauge
pgchangestream_pending{client="audit"} 0
pgchangestream_pending{client="billing"} 3
# HELP pgchangestream_checkpoint_writes_total Saved tokens written.
# TYPE pgchangestream_checkpoint_writes_total counter
pgchangestream_checkpoint_writes_total{client="audit"} 0
pgchangestream_checkpoint_writes_total{client="billing"} 5
# HELP pgchangestream_checkpoint_errors_total Failed token saves.
# TYPE pgchangestream_checkpoint_errors_total counter
pgchangestream_checkpoint_errors_total{client="audit"} 0
pgchangestream_checkpoint_errors_total{client="billing"} 1
# HELP pgchangestream_read_errors_total Failed changelog reads.
# TYPE pgchangestream_read_errors_total counter
pgchangestream_read_errors_total{client="audit"} 0
pgchangestream_read_errors_total{client="billing"} 4
# HELP pgchangestream_load_errors_total Failed loads of the start position (token table, changelog).
# TYPE pgchangestream_load_errors_total counter
pgchangestream_load_errors_total{client="audit"} 0
pgchangestream_load_errors_total{client="billing"} 2
# HELP pgchangestream_lag_seconds Age of the oldest row not yet acknowledged or read, from its changed_at; 0 when caught up.
# TYPE pgchangestream_lag_seconds gauge
pgchangestream_lag_seconds{client="audit"} 0
pgchangestream_lag_seconds{client="billing"} 1.5
# HELP pgchangestream_rewinds_total Returns to the saved token after the server recovered, failed over or was restored.
# TYPE pgchangestream_rewinds_total counter
pgchangestream_rewinds_total{client="audit"} 0
pgchangestream_rewinds_total{client="billing"} 3
# HELP pgchangestream_floor_active 1 while evicted deliveries hold the checkpoint back, else 0.
# TYPE pgchangestream_floor_active gauge
pgchangestream_floor_active{client="audit"} 0
pgchangestream_floor_active{client="billing"} 1
# HELP pgchangestream_healthy 1 while Health reports no failure, else 0.
# TYPE pgchangestream_healthy gauge
pgchangestream_healthy{client="audit"} 0
pgchangestream_healthy{client="billing"} 1
# HELP pgchangestream_listen_up 1 while the LISTEN connection is connected.
# TYPE pgchangestream_listen_up gauge
pgchangestream_listen_up{client="audit"} 0
pgchangestream_listen_up{client="billing"} 1
# HELP pgchangestream_active 1 while the watcher delivers; 0 for an exclusive standby.
# TYPE pgchangestream_active gauge
pgchangestream_active{client="audit"} 0
pgchangestream_active{client="billing"} 1
# HELP pgchangestream_process_in_flight Events Process took from Events and has not finished.
# TYPE pgchangestream_process_in_flight gauge
pgchangestream_process_in_flight{client="audit"} 0
pgchangestream_process_in_flight{client="billing"} 12
# HELP pgchangestream_process_deferred Of the events in flight, those of keys past MaxKeyQueue, kept as a token until their turn.
# TYPE pgchangestream_process_deferred gauge
pgchangestream_process_deferred{client="audit"} 0
pgchangestream_process_deferred{client="billing"} 3
# HELP pgchangestream_process_busy_workers Process workers running a handler or a dead-letter table call.
# TYPE pgchangestream_process_busy_workers gauge
pgchangestream_process_busy_workers{client="audit"} 0
pgchangestream_process_busy_workers{client="billing"} 4
# HELP pgchangestream_process_handled_total Handler runs of Process that succeeded, reruns of parked events included.
# TYPE pgchangestream_process_handled_total counter
pgchangestream_process_handled_total{client="audit"} 0
pgchangestream_process_handled_total{client="billing"} 90
# HELP pgchangestream_process_retries_total Failed handler attempts of Process that were retried.
# TYPE pgchangestream_process_retries_total counter
pgchangestream_process_retries_total{client="audit"} 0
pgchangestream_process_retries_total{client="billing"} 6
# HELP pgchangestream_process_parked_total Events Process parked in the dead-letter table.
# TYPE pgchangestream_process_parked_total counter
pgchangestream_process_parked_total{client="audit"} 0
pgchangestream_process_parked_total{client="billing"} 1
# HELP pgchangestream_process_handler_seconds_total Time spent in Process handlers, failed attempts included.
# TYPE pgchangestream_process_handler_seconds_total counter
pgchangestream_process_handler_seconds_total{client="audit"} 0
pgchangestream_process_handler_seconds_total{client="billing"} 2.25
# HELP pgchangestream_process_longest_key_queue The longest queue of events of one key Process has seen (Stats.Process.LongestKey is the key).
# TYPE pgchangestream_process_longest_key_queue gauge
pgchangestream_process_longest_key_queue{client="audit"} 0
pgchangestream_process_longest_key_queue{client="billing"} 8
`)))

	c.Remove("audit")
	require.Equal(t, 23, testutil.CollectAndCount(c), "one series per metric for the remaining watcher")
	require.NoError(t, prom.NewPedanticRegistry().Register(c))
}

func TestCollectorReadsAWatcher(t *testing.T) {
	w := pgchangestream.NewPostgreSQLChangeStreamWatcher(nil, "c", "t", "", pgchangestream.ModePolling)
	c := NewCollector()
	c.Add("c", w)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP pgchangestream_healthy 1 while Health reports no failure, else 0.
# TYPE pgchangestream_healthy gauge
pgchangestream_healthy{client="c"} 0
`), "pgchangestream_healthy"), "a watcher with an invalid configuration is unhealthy")
}

// TestReadmeListsEveryMetric keeps the metric names in README.md and the collector's the same.
func TestReadmeListsEveryMetric(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	// The list is the paragraph of the Prometheus part that starts "It exports".
	text := string(readme)
	start := strings.Index(text, "It exports, each labelled")
	require.NotEqual(t, -1, start, "README.md lists the metrics after \"It exports, each labelled\"")
	text = text[start:]
	if end := strings.Index(text, "\n\n"); end >= 0 {
		text = text[:end]
	}
	var listed []string
	for _, name := range regexp.MustCompile(`\bpgchangestream_[a-z_]+`).FindAllString(text, -1) {
		if !slices.Contains(listed, name) {
			listed = append(listed, name)
		}
	}

	reg := prom.NewPedanticRegistry()
	c := NewCollector()
	c.Add("billing", &fakeWatcher{})
	c.Add("orders", &fakeWatcher{stats: pgchangestream.Stats{Shared: pgchangestream.SharedStats{Name: "m1"}}})
	require.NoError(t, reg.Register(c))
	families, err := reg.Gather()
	require.NoError(t, err)
	var exported []string
	for _, f := range families {
		exported = append(exported, f.GetName())
	}
	slices.Sort(listed)
	require.Equal(t, exported, listed, "the metrics README.md names are the ones the collector exports")
}

// countingWatcher counts the reads of its state.
type countingWatcher struct{ stats, health int }

func (c *countingWatcher) Stats() pgchangestream.Stats { c.stats++; return pgchangestream.Stats{} }
func (c *countingWatcher) Health() error               { c.health++; return nil }

func TestCollectorReadsEachWatcherOncePerScrape(t *testing.T) {
	c := NewCollector()
	w := &countingWatcher{}
	c.Add("c", w)
	require.Equal(t, 23, testutil.CollectAndCount(c))
	require.Equal(t, countingWatcher{stats: 1, health: 1}, *w)
}

// TestCollectorLabelsSharedMembers proves that a Shared member has the shared metrics, labelled
// with its client and member name, that an unshared watcher has none, and that the registry
// accepts both together.
func TestCollectorLabelsSharedMembers(t *testing.T) {
	c := NewCollector()
	c.Add("orders", &fakeWatcher{stats: pgchangestream.Stats{Shared: pgchangestream.SharedStats{
		Member: 4, Name: "host-a:12", Ranges: []int{0, 1, 2, 5}, HandOvers: 3}}})
	c.Add("billing", &fakeWatcher{})
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(`
# HELP pgchangestream_shared_ranges The ranges the shared member owns and reads.
# TYPE pgchangestream_shared_ranges gauge
pgchangestream_shared_ranges{client="orders",member="host-a:12"} 4
# HELP pgchangestream_shared_handovers_total Hand-overs of the shared member that changed its ranges (released or claimed).
# TYPE pgchangestream_shared_handovers_total counter
pgchangestream_shared_handovers_total{client="orders",member="host-a:12"} 3
`), "pgchangestream_shared_ranges", "pgchangestream_shared_handovers_total"))
	require.Equal(t, 2*23+2, testutil.CollectAndCount(c), "the shared metrics of the member only")
	require.NoError(t, prom.NewPedanticRegistry().Register(c))
}
