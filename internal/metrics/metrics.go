// Package metrics is the one list of the metrics the observability modules (prometheus/ and
// otel/) export for a watcher, with how each is read from the watcher's state, so that both
// export the same values under the same definitions (the lag's included) and read each watcher
// once per collection.
package metrics

import "github.com/pgchangestream/pgchangestream"

// Kind is how a metric behaves.
type Kind uint8

const (
	// Counter only grows (from 0 when the watcher is created).
	Counter Kind = iota
	// Gauge is a current value.
	Gauge
	// FloatCounter is a Counter with a fractional value, such as seconds.
	FloatCounter
)

// Watcher is what the adapters read: [pgchangestream.Watcher] implements it.
type Watcher interface {
	Stats() pgchangestream.Stats
	Health() error
}

// Reading is a watcher's state at one collection.
type Reading struct {
	Stats   pgchangestream.Stats
	Healthy bool // Health returned nil
}

// Read reads w's state once.
func Read(w Watcher) Reading {
	return Reading{Stats: w.Stats(), Healthy: w.Health() == nil}
}

// Metric is one exported value per watcher.
type Metric struct {
	// Prometheus is the metric's Prometheus name; OTel its OpenTelemetry name, with Unit
	// (UCUM, as OpenTelemetry wants it).
	Prometheus, OTel, Unit string
	// Description is the help text, the same in both.
	Description string
	Kind        Kind
	// Value reads the metric from a reading.
	Value func(Reading) float64
}

// ConsumedMessages is the OpenTelemetry name of the delivered events: the messaging semantic
// conventions' consumer metric.
const ConsumedMessages = "messaging.client.consumed.messages"

// All lists every metric, in the order they are exported.
var All = []Metric{
	counter("events_delivered_total", ConsumedMessages, "{message}", "Events handed to the consumer.",
		func(s pgchangestream.Stats) uint64 { return s.Delivered }),
	counter("events_acked_total", "pgchangestream.events.acked", "{event}", "Deliveries acknowledged.",
		func(s pgchangestream.Stats) uint64 { return s.Acked }),
	counter("events_filtered_total", "pgchangestream.events.filtered", "{event}", "Events dropped by Config.Filter.",
		func(s pgchangestream.Stats) uint64 { return s.Filtered }),
	counter("events_evicted_total", "pgchangestream.events.evicted", "{event}",
		"Unacknowledged deliveries folded into the floor beyond Config.MaxPending.",
		func(s pgchangestream.Stats) uint64 { return s.Evicted }),
	counter("checkpoint_writes_total", "pgchangestream.checkpoint.writes", "{write}", "Saved tokens written.",
		func(s pgchangestream.Stats) uint64 { return s.CheckpointWrites }),
	counter("checkpoint_errors_total", "pgchangestream.checkpoint.errors", "{error}", "Failed token saves.",
		func(s pgchangestream.Stats) uint64 { return s.CheckpointErrors }),
	counter("read_errors_total", "pgchangestream.read.errors", "{error}", "Failed changelog reads.",
		func(s pgchangestream.Stats) uint64 { return s.ReadErrors }),
	counter("load_errors_total", "pgchangestream.load.errors", "{error}",
		"Failed loads of the start position (token table, changelog).",
		func(s pgchangestream.Stats) uint64 { return s.LoadErrors }),
	counter("rewinds_total", "pgchangestream.rewinds", "{rewind}",
		"Returns to the saved token after the server recovered, failed over or was restored.",
		func(s pgchangestream.Stats) uint64 { return s.Rewinds }),
	gauge("pending", "pgchangestream.pending", "{event}", "Deliveries not yet acknowledged.",
		func(r Reading) float64 { return float64(r.Stats.Pending) }),
	gauge("lag_seconds", "pgchangestream.lag", "s",
		"Age of the oldest row not yet acknowledged or read, from its changed_at; 0 when caught up.",
		func(r Reading) float64 { return r.Stats.Lag.Seconds() }),
	gauge("floor_active", "pgchangestream.floor.active", "1",
		"1 while evicted deliveries hold the checkpoint back, else 0.",
		func(r Reading) float64 { return boolValue(r.Stats.FloorActive) }),
	gauge("healthy", "pgchangestream.healthy", "1", "1 while Health reports no failure, else 0.",
		func(r Reading) float64 { return boolValue(r.Healthy) }),
	gauge("listen_up", "pgchangestream.listen.up", "1", "1 while the LISTEN connection is connected.",
		func(r Reading) float64 { return boolValue(r.Stats.ListenUp) }),
	gauge("active", "pgchangestream.active", "1", "1 while the watcher delivers; 0 for an exclusive standby.",
		func(r Reading) float64 { return boolValue(r.Stats.Active) }),

	// Watcher.Process (Stats.Process): gauges of the run in progress, 0 when none runs.
	gauge("process_in_flight", "pgchangestream.process.inflight", "{event}",
		"Events Process took from Events and has not finished.",
		func(r Reading) float64 { return float64(r.Stats.Process.InFlight) }),
	gauge("process_deferred", "pgchangestream.process.deferred", "{event}",
		"Of the events in flight, those of keys past MaxKeyQueue, kept as a token until their turn.",
		func(r Reading) float64 { return float64(r.Stats.Process.Deferred) }),
	gauge("process_busy_workers", "pgchangestream.process.workers.busy", "{worker}",
		"Process workers running a handler or a dead-letter table call.",
		func(r Reading) float64 { return float64(r.Stats.Process.BusyWorkers) }),
	counter("process_handled_total", "pgchangestream.process.handled", "{event}",
		"Handler runs of Process that succeeded, reruns of parked events included.",
		func(s pgchangestream.Stats) uint64 { return s.Process.Handled }),
	counter("process_retries_total", "pgchangestream.process.retries", "{retry}",
		"Failed handler attempts of Process that were retried.",
		func(s pgchangestream.Stats) uint64 { return s.Process.Retries }),
	counter("process_parked_total", "pgchangestream.process.parked", "{event}",
		"Events Process parked in the dead-letter table.",
		func(s pgchangestream.Stats) uint64 { return s.Process.Parked }),
	{Prometheus: "pgchangestream_process_handler_seconds_total", OTel: "pgchangestream.process.handler.time", Unit: "s",
		Description: "Time spent in Process handlers, failed attempts included.", Kind: FloatCounter,
		Value: func(r Reading) float64 { return r.Stats.Process.HandlerTime.Seconds() }},
	// The key itself is in Stats only: as a label it would make one series per hot key ever seen.
	gauge("process_longest_key_queue", "pgchangestream.process.keyqueue.longest", "{event}",
		"The longest queue of events of one key Process has seen (Stats.Process.LongestKey is the key).",
		func(r Reading) float64 { return float64(r.Stats.Process.LongestKeyQueue) }),
}

// Shared lists the metrics of a [pgchangestream.Config.Shared] member only (see [IsShared]),
// which the adapters label with the member's name beside the client's.
var Shared = []Metric{
	gauge("shared_ranges", "pgchangestream.shared.ranges", "{range}",
		"The ranges the shared member owns and reads.",
		func(r Reading) float64 { return float64(len(r.Stats.Shared.Ranges)) }),
	counter("shared_handovers_total", "pgchangestream.shared.handovers", "{handover}",
		"Hand-overs of the shared member that changed its ranges (released or claimed).",
		func(s pgchangestream.Stats) uint64 { return s.Shared.HandOvers }),
}

// IsShared reports whether the reading is of a Shared member: it has a member name from its
// creation on.
func IsShared(r Reading) bool { return r.Stats.Shared.Name != "" }

// counter is a Counter read from Stats; name is its Prometheus name without the prefix.
func counter(name, otel, unit, description string, value func(pgchangestream.Stats) uint64) Metric {
	return Metric{Prometheus: "pgchangestream_" + name, OTel: otel, Unit: unit, Description: description, Kind: Counter,
		Value: func(r Reading) float64 { return float64(value(r.Stats)) }}
}

// gauge is a Gauge; name is its Prometheus name without the prefix.
func gauge(name, otel, unit, description string, value func(Reading) float64) Metric {
	return Metric{Prometheus: "pgchangestream_" + name, OTel: otel, Unit: unit, Description: description, Kind: Gauge,
		Value: value}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
