// Package otel exports pgchangestream watchers to OpenTelemetry: metrics, named after the
// messaging semantic conventions where they apply and read from the same table as the
// prometheus module's, and spans around changelog reads and checkpoint saves, through
// [pgchangestream.Config.Observer]. It is a module of its own, so that the library does not
// depend on OpenTelemetry.
//
//	m, err := otel.NewMetrics(meterProvider)      // nil: the global MeterProvider
//	cfg.Observer = otel.NewObserver(tracerProvider, cfg.ClientName, cfg.TableName) // spans, optional
//	w, err := pgchangestream.New(cfg)
//	m.Add(cfg.ClientName, cfg.TableName, w)
package otel

import (
	"context"
	"fmt"
	"sync"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/internal/metrics"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Name is the instrumentation scope of the meter and tracer.
const Name = "github.com/pgchangestream/pgchangestream/otel"

// System is the messaging.system attribute of every metric and span.
const System = "pgchangestream"

// The attributes of the messaging semantic conventions that the metrics and spans carry.
const (
	attrSystem        = "messaging.system"
	attrDestination   = "messaging.destination.name"    // the watched table
	attrConsumerGroup = "messaging.consumer.group.name" // the client name
	attrOperationName = "messaging.operation.name"
	attrOperationType = "messaging.operation.type"
	attrBatchCount    = "messaging.batch.message_count"
	attrErrorType     = "error.type"
	attrMember        = "pgchangestream.member" // a Shared member's name (Config.MemberName)
)

// Watcher is what [Metrics] reads: [pgchangestream.Watcher] implements it.
type Watcher interface {
	Stats() pgchangestream.Stats
	Health() error
}

// Metrics registers observable instruments for the metrics of the watchers added to it, each
// attributed to its table and client name. At every collection it reads Stats and Health once
// per watcher. The delivered events are messaging.client.consumed.messages; the rest are under
// "pgchangestream.", for example pgchangestream.lag (seconds) and pgchangestream.pending. It is
// safe for concurrent use.
type Metrics struct {
	instruments []instrument // of metrics.All, in its order
	shared      []instrument // of metrics.Shared, in its order: for Shared members only
	reg         metric.Registration

	mu       sync.Mutex
	watchers map[string]watched // by client name
}

// instrument is one metric's instrument: a counter (int64), a float counter or a gauge
// (float64).
type instrument struct {
	counter      metric.Int64ObservableCounter
	floatCounter metric.Float64ObservableCounter
	gauge        metric.Float64ObservableGauge
}

// watched is a watcher added to Metrics with its attributes.
type watched struct {
	w        Watcher
	base     []attribute.KeyValue     // baseAttributes of its client and table
	attrs    metric.MeasurementOption // every metric's
	consumed metric.MeasurementOption // messaging.client.consumed.messages': attrs and the operation
}

// NewMetrics creates the instruments on a meter of mp (nil: the global MeterProvider) and
// registers their callback. Close unregisters it.
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(Name)
	m := &Metrics{watchers: map[string]watched{}}
	var (
		observables []metric.Observable
		err         error
	)
	if m.instruments, observables, err = newInstruments(meter, metrics.All, observables); err != nil {
		return nil, err
	}
	if m.shared, observables, err = newInstruments(meter, metrics.Shared, observables); err != nil {
		return nil, err
	}
	reg, err := meter.RegisterCallback(m.observe, observables...)
	if err != nil {
		return nil, fmt.Errorf("pgchangestream/otel: register callback: %w", err)
	}
	m.reg = reg
	return m, nil
}

// newInstruments creates the instruments of ds on meter, and appends them to observables.
func newInstruments(meter metric.Meter, ds []metrics.Metric, observables []metric.Observable) ([]instrument, []metric.Observable, error) {
	insts := make([]instrument, 0, len(ds))
	for _, d := range ds {
		var (
			inst instrument
			err  error
		)
		switch d.Kind {
		case metrics.Counter:
			inst.counter, err = meter.Int64ObservableCounter(d.OTel, metric.WithUnit(d.Unit), metric.WithDescription(d.Description))
			observables = append(observables, inst.counter)
		case metrics.FloatCounter:
			inst.floatCounter, err = meter.Float64ObservableCounter(d.OTel, metric.WithUnit(d.Unit), metric.WithDescription(d.Description))
			observables = append(observables, inst.floatCounter)
		default:
			inst.gauge, err = meter.Float64ObservableGauge(d.OTel, metric.WithUnit(d.Unit), metric.WithDescription(d.Description))
			observables = append(observables, inst.gauge)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("pgchangestream/otel: create %s: %w", d.OTel, err)
		}
		insts = append(insts, inst)
	}
	return insts, observables, nil
}

// Add observes w, the watcher of client (its Config.ClientName) on table (its
// Config.TableName). Adding a client name again replaces its watcher.
func (m *Metrics) Add(client, table string, w Watcher) {
	base := baseAttributes(client, table)
	set := attribute.NewSet(base...)
	consumed := attribute.NewSet(append(base, attribute.String(attrOperationName, "receive"))...)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.watchers[client] = watched{w: w, base: base, attrs: metric.WithAttributeSet(set), consumed: metric.WithAttributeSet(consumed)}
}

// Remove stops observing the watcher added as client.
func (m *Metrics) Remove(client string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.watchers, client)
}

// Close unregisters the instruments' callback: the watchers are no longer observed.
func (m *Metrics) Close() error {
	return m.reg.Unregister()
}

// observe is the instruments' callback: it reads each watcher once, without holding m.mu.
func (m *Metrics) observe(_ context.Context, o metric.Observer) error {
	m.mu.Lock()
	watchers := make([]watched, 0, len(m.watchers))
	for _, w := range m.watchers {
		watchers = append(watchers, w)
	}
	m.mu.Unlock()
	for _, w := range watchers {
		r := metrics.Read(w.w)
		for i, d := range metrics.All {
			attrs := w.attrs
			if d.OTel == metrics.ConsumedMessages {
				attrs = w.consumed
			}
			observeOne(o, m.instruments[i], d.Value(r), attrs)
		}
		if !metrics.IsShared(r) {
			continue
		}
		member := metric.WithAttributeSet(attribute.NewSet(append(w.base, attribute.String(attrMember, r.Stats.Shared.Name))...))
		for i, d := range metrics.Shared {
			observeOne(o, m.shared[i], d.Value(r), member)
		}
	}
	return nil
}

// observeOne records value on inst.
func observeOne(o metric.Observer, inst instrument, value float64, attrs metric.MeasurementOption) {
	switch {
	case inst.counter != nil:
		o.ObserveInt64(inst.counter, int64(value), attrs)
	case inst.floatCounter != nil:
		o.ObserveFloat64(inst.floatCounter, value, attrs)
	default:
		o.ObserveFloat64(inst.gauge, value, attrs)
	}
}

// baseAttributes are the attributes of every metric and span of a watcher.
func baseAttributes(client, table string) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String(attrSystem, System),
		attribute.String(attrDestination, table),
		attribute.String(attrConsumerGroup, client),
	}
}
