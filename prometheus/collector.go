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
	"github.com/pgchangestream/pgchangestream/internal/metrics"
	prom "github.com/prometheus/client_golang/prometheus"
)

// Watcher is what the collector reads: [pgchangestream.Watcher] implements it.
type Watcher interface {
	Stats() pgchangestream.Stats
	Health() error
}

// Collector is a [prom.Collector] of the metrics of the watchers added to it, each labelled
// with its client name. A [pgchangestream.Config.Shared] member also has the metrics of
// metrics.Shared (pgchangestream_shared_ranges, pgchangestream_shared_handovers_total),
// labelled with its member name (Config.MemberName) as well; its other metrics keep the client
// label only, so that they keep one label set: add one member per client name to a collector
// (the scrape's instance tells the processes apart). It reads Stats and Health once per watcher at every scrape. It is safe
// for concurrent use.
type Collector struct {
	descs  []*prom.Desc // of metrics.All, in its order
	shared []*prom.Desc // of metrics.Shared, in its order

	mu       sync.Mutex
	watchers map[string]Watcher // by client name
}

// NewCollector returns a collector with no watcher; see [Collector.Add].
func NewCollector() *Collector {
	c := &Collector{watchers: map[string]Watcher{}}
	for _, m := range metrics.All {
		c.descs = append(c.descs, prom.NewDesc(m.Prometheus, m.Description, []string{"client"}, nil))
	}
	for _, m := range metrics.Shared {
		c.shared = append(c.shared, prom.NewDesc(m.Prometheus, m.Description, []string{"client", "member"}, nil))
	}
	return c
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
	for _, d := range append(slices.Clone(c.descs), c.shared...) {
		ch <- d
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
		r := metrics.Read(w)
		for j, m := range metrics.All {
			ch <- prom.MustNewConstMetric(c.descs[j], valueType[m.Kind], m.Value(r), clients[i])
		}
		if !metrics.IsShared(r) {
			continue
		}
		for j, m := range metrics.Shared {
			ch <- prom.MustNewConstMetric(c.shared[j], valueType[m.Kind], m.Value(r), clients[i], r.Stats.Shared.Name)
		}
	}
}

// valueType is the Prometheus type of each kind of metric.
var valueType = map[metrics.Kind]prom.ValueType{metrics.Counter: prom.CounterValue, metrics.FloatCounter: prom.CounterValue,
	metrics.Gauge: prom.GaugeValue}
