package otel

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/pgchangestreamtest"
)

var errDown = errors.New("connection reset")

// startWatcher starts a real watcher of client billing on table orders, over a mock database,
// that reads three inserts written a minute ago (ids 42 to 44) and expects the saves of 42 and
// 43, the second failing with errDown.
func startWatcher(t *testing.T, observer pgchangestream.Observer) *pgchangestream.Watcher {
	t.Helper()
	m := pgchangestreamtest.NewMock(t, pgchangestream.Config{ClientName: "billing", TableName: "orders",
		Mode: pgchangestream.ModePolling, PollInterval: time.Hour, Observer: observer})
	m.ExpectStart(pgchangestreamtest.Start{Newest: pgchangestream.Position{ID: 41}})
	written := time.Now().Add(-time.Minute)
	var changes []pgchangestreamtest.Change
	for _, id := range []string{"o1", "o2", "o3"} {
		c := pgchangestreamtest.Insert(id, map[string]any{"id": id})
		c.ChangedAt = written
		changes = append(changes, c)
	}
	m.ExpectRead(changes...)
	m.ExpectSave(42)
	m.ExpectSaveFailure(43, errDown)
	w, err := pgchangestream.New(m.Config())
	require.NoError(t, err)
	m.StartWatcher(context.Background(), w)
	t.Cleanup(func() { require.NoError(t, m.ExpectationsWereMet()) })
	return w
}

// consume receives the three events and acknowledges the first two.
func consume(ctx context.Context, t *testing.T, w *pgchangestream.Watcher) {
	t.Helper()
	evs := []pgchangestream.EventWithToken{<-w.Events(), <-w.Events(), <-w.Events()}
	require.NoError(t, w.MarkProcessed(ctx, evs[0].ResumeToken))
	require.ErrorIs(t, w.MarkProcessed(ctx, evs[1].ResumeToken), errDown)
}

// collected returns the data points of each metric collected by r.
func collected(t *testing.T, r sdkmetric.Reader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, Name, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// point returns the value for client of a collected metric.
func point(t *testing.T, data metricdata.Aggregation, client string) (float64, attribute.Set) {
	t.Helper()
	group := attribute.String(attrConsumerGroup, client)
	switch d := data.(type) {
	case metricdata.Sum[int64]:
		require.True(t, d.IsMonotonic)
		for _, p := range d.DataPoints {
			if v, _ := p.Attributes.Value(group.Key); v == group.Value {
				return float64(p.Value), p.Attributes
			}
		}
	case metricdata.Sum[float64]:
		require.True(t, d.IsMonotonic)
		for _, p := range d.DataPoints {
			if v, _ := p.Attributes.Value(group.Key); v == group.Value {
				return p.Value, p.Attributes
			}
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			if v, _ := p.Attributes.Value(group.Key); v == group.Value {
				return p.Value, p.Attributes
			}
		}
	default:
		t.Fatalf("unexpected aggregation %T", data)
	}
	t.Fatalf("no data point for client %s", client)
	return 0, attribute.Set{}
}

func TestMetricsReadARealWatcher(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	m, err := NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	require.NoError(t, err)
	w := startWatcher(t, nil)
	consume(ctx, t, w)
	m.Add("billing", "orders", w)
	m.Add("audit", "audit_log", pgchangestream.NewPostgreSQLChangeStreamWatcher(nil, "audit", "audit_log", "", pgchangestream.ModePolling))

	lagBefore := w.Stats().Lag
	got := collected(t, reader)
	lagAfter := w.Stats().Lag

	delivered, attrs := point(t, got["messaging.client.consumed.messages"], "billing")
	require.Equal(t, 3.0, delivered)
	require.Equal(t, attribute.NewSet(
		attribute.String("messaging.system", "pgchangestream"),
		attribute.String("messaging.destination.name", "orders"),
		attribute.String("messaging.consumer.group.name", "billing"),
		attribute.String("messaging.operation.name", "receive"),
	), attrs)
	want := map[string]float64{
		"pgchangestream.events.acked":      2, // the failed save keeps the acknowledgement
		"pgchangestream.pending":           1,
		"pgchangestream.checkpoint.writes": 2, // the new client's start position, then 42
		"pgchangestream.checkpoint.errors": 1,
		"pgchangestream.healthy":           0, // the failed save
		"pgchangestream.active":            1,
		"pgchangestream.listen.up":         0, // polling
		"pgchangestream.events.filtered":   0,
		"pgchangestream.read.errors":       0,
		"pgchangestream.floor.active":      0,
	}
	for name, v := range want {
		got, attrs := point(t, got[name], "billing")
		require.Equal(t, v, got, name)
		require.Equal(t, 3, attrs.Len(), "%s: system, table and client", name)
	}
	lag, _ := point(t, got["pgchangestream.lag"], "billing")
	require.GreaterOrEqual(t, lag, lagBefore.Seconds(), "the lag of Stats, in seconds")
	require.LessOrEqual(t, lag, lagAfter.Seconds())
	require.InDelta(t, 60, lag, 10, "the pending row was written a minute ago")
	healthy, _ := point(t, got["pgchangestream.healthy"], "audit")
	require.Equal(t, 0.0, healthy, "a watcher with an invalid configuration is unhealthy")

	m.Remove("audit")
	for name, data := range collected(t, reader) {
		switch d := data.(type) {
		case metricdata.Sum[int64]:
			require.Len(t, d.DataPoints, 1, name)
		case metricdata.Sum[float64]:
			require.Len(t, d.DataPoints, 1, name)
		case metricdata.Gauge[float64]:
			require.Len(t, d.DataPoints, 1, name)
		}
	}
	require.NoError(t, m.Close())
	require.Empty(t, collected(t, reader), "no callback after Close")
}

func TestObserverRecordsReadAndSaveSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	w := startWatcher(t, NewObserver(tp, "billing", "orders"))
	ctx, parent := tp.Tracer("test").Start(context.Background(), "handle")
	consume(ctx, t, w)
	parent.End()

	var reads, saves []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "read orders":
			reads = append(reads, s)
		case "checkpoint orders":
			saves = append(saves, s)
		}
	}
	require.Len(t, reads, 1, "one read: the next waits for the hour-long poll")
	read := reads[0]
	require.Contains(t, read.Attributes(), attribute.Int("messaging.batch.message_count", 3))
	require.Contains(t, read.Attributes(), attribute.Int64("pgchangestream.read.after_id", 41))
	require.Contains(t, read.Attributes(), attribute.String("messaging.operation.type", "receive"))
	require.Contains(t, read.Attributes(), attribute.String("messaging.destination.name", "orders"))
	require.Equal(t, codes.Unset, read.Status().Code)
	require.False(t, read.Parent().IsValid(), "reads run on the watcher's own context")

	require.Len(t, saves, 2)
	ok, failed := saves[0], saves[1]
	require.Contains(t, ok.Attributes(), attribute.Int64("pgchangestream.checkpoint.id", 42))
	require.Equal(t, codes.Unset, ok.Status().Code)
	require.Contains(t, failed.Attributes(), attribute.Int64("pgchangestream.checkpoint.id", 43))
	require.Equal(t, codes.Error, failed.Status().Code)
	require.Contains(t, failed.Status().Description, errDown.Error())
	require.Len(t, failed.Events(), 1)
	require.Equal(t, "exception", failed.Events()[0].Name)
	for _, s := range saves {
		require.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID(), "a save is a child of the caller's span")
		require.False(t, s.EndTime().Before(s.StartTime()))
	}
	require.False(t, failed.StartTime().Before(ok.EndTime()))
}

// healthyFake is the test kit's fake watcher, always healthy.
type healthyFake struct {
	*pgchangestreamtest.FakeWatcher
}

func (healthyFake) Health() error { return nil }

func TestMetricsOfProcess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { testMetricsOfProcess(t) })
}

func testMetricsOfProcess(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	f := pgchangestreamtest.NewFakeWatcher(pgchangestream.Config{ClientName: "billing", TableName: "orders"})
	f.Push(pgchangestreamtest.Insert("o1", nil), pgchangestreamtest.Insert("o2", nil),
		pgchangestreamtest.Update("o1", nil, map[string]any{"paid": true}))
	f.Start(ctx)
	defer f.Close(context.Background())
	var attempts atomic.Int32
	errc := make(chan error, 1)
	go func() {
		errc <- f.Process(ctx, pgchangestream.ProcessOptions{}, func(context.Context, pgchangestream.EventWithToken) error {
			time.Sleep(time.Millisecond)
			if attempts.Add(1) == 1 {
				return errors.New("once")
			}
			return nil
		})
	}()
	time.Sleep(time.Second) // the retry's backoff is over
	synctest.Wait()
	cancel()
	require.NoError(t, <-errc)

	reader := sdkmetric.NewManualReader()
	m, err := NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	require.NoError(t, err)
	defer m.Close()
	m.Add("billing", "orders", healthyFake{f})
	got := collected(t, reader)
	want := map[string]float64{
		"pgchangestream.process.handled":          3,
		"pgchangestream.process.retries":          1,
		"pgchangestream.process.parked":           0,
		"pgchangestream.process.inflight":         0, // the run ended
		"pgchangestream.process.deferred":         0,
		"pgchangestream.process.workers.busy":     0,
		"pgchangestream.process.keyqueue.longest": 2, // o1's two events
	}
	for name, v := range want {
		got, _ := point(t, got[name], "billing")
		require.Equal(t, v, got, name)
	}
	seconds, _ := point(t, got["pgchangestream.process.handler.time"], "billing")
	require.Equal(t, f.Stats().Process.HandlerTime.Seconds(), seconds)
	require.Equal(t, 0.004, seconds, "four handler runs of a millisecond, the failed one included")
	_, isFloat := got["pgchangestream.process.handler.time"].(metricdata.Sum[float64])
	require.True(t, isFloat, "handler time is a float counter")
}

// statsOnly is a Watcher with fixed Stats.
type statsOnly struct{ s pgchangestream.Stats }

func (w statsOnly) Stats() pgchangestream.Stats { return w.s }
func (statsOnly) Health() error                 { return nil }

// A Shared member's ranges and hand-overs carry its name beside the client's; an unshared
// watcher has neither.
func TestMetricsOfSharedMembers(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	m, err := NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	require.NoError(t, err)
	defer m.Close()
	m.Add("quarantine", "health_events", statsOnly{pgchangestream.Stats{Shared: pgchangestream.SharedStats{
		Member: 4, Name: "node-a", Ranges: []int{0, 1, 2}, HandOvers: 2}}})
	m.Add("billing", "orders", statsOnly{})
	got := collected(t, reader)
	ranges, attrs := point(t, got["pgchangestream.shared.ranges"], "quarantine")
	require.Equal(t, 3.0, ranges)
	member, _ := attrs.Value(attrMember)
	require.Equal(t, "node-a", member.AsString())
	handovers, _ := point(t, got["pgchangestream.shared.handovers"], "quarantine")
	require.Equal(t, 2.0, handovers)
	switch d := got["pgchangestream.shared.ranges"].(type) {
	case metricdata.Gauge[float64]:
		require.Len(t, d.DataPoints, 1, "an unshared watcher has no shared metrics")
	default:
		t.Fatalf("pgchangestream.shared.ranges is a %T", d)
	}
}
