package otel

import (
	"context"
	"time"

	"github.com/pgchangestream/pgchangestream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// NewObserver returns a [pgchangestream.Observer] that records a span for each changelog read
// ("read <table>", messaging.operation.type "receive", with the number of rows read) and each
// checkpoint save ("checkpoint <table>", type "settle", with the saved changelog id), with the
// operation's start and end times, on a tracer of tp (nil: the global TracerProvider). A failed
// operation's span records its error and has an error status. A save's span is a child of the
// span in the context of the call that saved (MarkProcessed, Flush, Close); read spans are
// roots. client and table are the watcher's Config.ClientName and Config.TableName.
func NewObserver(tp trace.TracerProvider, client, table string) pgchangestream.Observer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	base := baseAttributes(client, table)
	return &observer{
		tracer:   tp.Tracer(Name),
		readName: "read " + table,
		saveName: "checkpoint " + table,
		read:     append(base[:len(base):len(base)], attribute.String(attrOperationName, "read"), attribute.String(attrOperationType, "receive")),
		save:     append(base[:len(base):len(base)], attribute.String(attrOperationName, "checkpoint"), attribute.String(attrOperationType, "settle")),
	}
}

// observer records spans; its fields are immutable.
type observer struct {
	tracer             trace.Tracer
	readName, saveName string
	read, save         []attribute.KeyValue
}

// ObserveRead records the span of a changelog read.
func (o *observer) ObserveRead(ctx context.Context, r pgchangestream.ReadObservation) {
	_, span := o.tracer.Start(ctx, o.readName, trace.WithTimestamp(r.Start), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(o.read...), trace.WithAttributes(
			attribute.Int(attrBatchCount, r.Rows),
			attribute.Int64("pgchangestream.read.after_id", r.From.ID)))
	end(span, r.Err, r.Start.Add(r.Duration))
}

// ObserveSave records the span of a checkpoint save.
func (o *observer) ObserveSave(ctx context.Context, s pgchangestream.SaveObservation) {
	_, span := o.tracer.Start(ctx, o.saveName, trace.WithTimestamp(s.Start), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(o.save...), trace.WithAttributes(
			attribute.Int64("pgchangestream.checkpoint.id", s.Checkpoint.ID)))
	end(span, s.Err, s.Start.Add(s.Duration))
}

// end records err, if any, on span and ends it at t.
func end(span trace.Span, err error, t time.Time) {
	if err != nil {
		span.RecordError(err, trace.WithTimestamp(t))
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(attribute.String(attrErrorType, "_OTHER"))
	}
	span.End(trace.WithTimestamp(t))
}
