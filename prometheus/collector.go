// Package prometheus exports the counters of pgchangestream watchers as Prometheus metrics. It
// is a module of its own, so that the library does not depend on the Prometheus client.
//
//	c := prometheus.NewCollector()
//	c.Add("billing", w)                 // the client name labels the watcher's metrics
//	registry.MustRegister(c)
package prometheus

import (
	"slices"
	"strings"
	"sync"

	"github.com/pgchangestream/pgchangestream"
	prom "github.com/prometheus/client_golang/prometheus"
)

// Watcher is what the collector reads: [pgchangestream.Watcher] implements it.
type Watcher interface {
	Stats() pgchangestream.Stats
	Health() error
}

// metric is one exported series per watcher: its description and how to read it from Stats
// and the health.
type metric struct {
	desc  *prom.Desc
	kind  prom.ValueType
	value func(s pgchangestream.Stats, healthy bool) float64
}

// Collector is a [prom.Collector] of the metrics of the watchers added to it, each labelled
// with its client name. It reads Stats and Health at every scrape. It is safe for concurrent
// use.
type Collector struct {
	metrics []metric

	mu       sync.Mutex
	watchers map[string]Watcher // by client name
}

// NewCollector returns a collector with no watcher; see [Collector.Add].
func NewCollector() *Collector {
	m := func(name, help string, kind prom.ValueType, value func(pgchangestream.Stats, bool) float64) metric {
		return metric{desc: prom.NewDesc("pgchangestream_"+name, help, []string{"client"}, nil), kind: kind, value: value}
	}
	counter := func(name, help string, value func(pgchangestream.Stats) uint64) metric {
		return m(name, help, prom.CounterValue, func(s pgchangestream.Stats, _ bool) float64 { return float64(value(s)) })
	}
	return &Collector{
		watchers: map[string]Watcher{},
		metrics: []metric{
			counter("events_delivered_total", "Events handed to the consumer.",
				func(s pgchangestream.Stats) uint64 { return s.Delivered }),
			counter("events_acked_total", "Deliveries acknowledged.",
				func(s pgchangestream.Stats) uint64 { return s.Acked }),
			counter("events_filtered_total", "Events dropped by Config.Filter.",
				func(s pgchangestream.Stats) uint64 { return s.Filtered }),
			counter("events_evicted_total", "Unacknowledged deliveries folded into the floor beyond Config.MaxPending.",
				func(s pgchangestream.Stats) uint64 { return s.Evicted }),
			counter("checkpoint_writes_total", "Saved tokens written.",
				func(s pgchangestream.Stats) uint64 { return s.CheckpointWrites }),
			counter("checkpoint_errors_total", "Failed token saves.",
				func(s pgchangestream.Stats) uint64 { return s.CheckpointErrors }),
			counter("read_errors_total", "Failed changelog reads.",
				func(s pgchangestream.Stats) uint64 { return s.ReadErrors }),
			counter("load_errors_total", "Failed loads of the start position (token table, changelog).",
				func(s pgchangestream.Stats) uint64 { return s.LoadErrors }),
			m("pending", "Deliveries not yet acknowledged.", prom.GaugeValue,
				func(s pgchangestream.Stats, _ bool) float64 { return float64(s.Pending) }),
			m("lag_seconds", "Age of the oldest row not yet acknowledged or read, from its changed_at; 0 when caught up.",
				prom.GaugeValue, func(s pgchangestream.Stats, _ bool) float64 { return s.Lag.Seconds() }),
			m("healthy", "1 while Health reports no failure, else 0.", prom.GaugeValue,
				func(_ pgchangestream.Stats, healthy bool) float64 { return boolValue(healthy) }),
			m("listen_up", "1 while the LISTEN connection is connected.", prom.GaugeValue,
				func(s pgchangestream.Stats, _ bool) float64 { return boolValue(s.ListenUp) }),
			m("active", "1 while the watcher delivers; 0 for an exclusive standby.", prom.GaugeValue,
				func(s pgchangestream.Stats, _ bool) float64 { return boolValue(s.Active) }),
		},
	}
}

// Add collects the metrics of w, labelled client="client". Adding a client name again
// replaces its watcher.
func (c *Collector) Add(client string, w Watcher) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watchers[client] = w
}

// Remove stops collecting the metrics of the watcher added as client.
func (c *Collector) Remove(client string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.watchers, client)
}

// Describe sends the description of every metric.
func (c *Collector) Describe(ch chan<- *prom.Desc) {
	for _, m := range c.metrics {
		ch <- m.desc
	}
}

// Collect reads every watcher's Stats and Health and sends its metrics.
func (c *Collector) Collect(ch chan<- prom.Metric) {
	c.mu.Lock()
	clients := make([]string, 0, len(c.watchers))
	for name := range c.watchers {
		clients = append(clients, name)
	}
	slices.SortFunc(clients, strings.Compare)
	watchers := make([]Watcher, len(clients))
	for i, name := range clients {
		watchers[i] = c.watchers[name]
	}
	c.mu.Unlock()
	for i, w := range watchers {
		s, healthy := w.Stats(), w.Health() == nil
		for _, m := range c.metrics {
			ch <- prom.MustNewConstMetric(m.desc, m.kind, m.value(s, healthy), clients[i])
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
