package pgchangestream

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/document"
	"github.com/pgchangestream/pgchangestream/internal/document/doctest"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// healthEventWithStatus and healthRowJSON are the health event of the decoding tests.
type healthEventWithStatus = doctest.HealthEventWithStatus

const healthRowJSON = doctest.HealthRowJSON

// healthRow is changelog row id of a health_events insert.
func healthRow(id int64) changelogRow {
	return changelogRow{ID: id, RecordID: "5f0c3c1e-8c1a-4c2e-9d1e-0b6a7c2d9e11", Operation: "INSERT",
		NewValues: []byte(healthRowJSON), ChangedAt: t0.Add(time.Duration(id) * time.Microsecond)}
}

// healthEvent returns the delivery of a health row as the watcher makes it, with or without
// Config.RawDocuments.
func healthEvent(tb testing.TB, rawDocuments bool) EventWithToken {
	w := newWatcher(Config{ClientName: "bench", TableName: "health_events", DocumentField: "document",
		RawDocuments: rawDocuments}.WithDefaults())
	row := healthRow(1)
	ev, raw, err := w.event(&row)
	if err != nil {
		tb.Fatal(err)
	}
	return EventWithToken{Event: ev, ResumeToken: position.FormatToken(row.ID), raw: raw}
}

// BenchmarkUnmarshalDocument decodes the fullDocument of a ~1 KB health event into a
// HealthEventWithStatus-shaped struct: by the map round trip (the reference and fallback), by
// UnmarshalDocument from the JSON text, by Document of an event delivered with RawDocuments,
// and, as the floor, json.Unmarshal of the same document text.
func BenchmarkUnmarshalDocument(b *testing.B) {
	mapped, raw := healthEvent(b, false), healthEvent(b, true)
	if mapped.raw.DocumentJSON(mapped.Event) == nil || raw.raw.DocumentJSON(raw.Event) == nil {
		b.Fatal("the health event has no document text")
	}
	b.Run("map-round-trip", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			var v healthEventWithStatus
			if err := document.UnmarshalMap(mapped.Event, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bytes", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			var v healthEventWithStatus
			if err := mapped.UnmarshalDocument(&v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw-documents", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := Document[healthEventWithStatus](raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		data := mapped.raw.DocumentJSON(mapped.Event)
		b.ReportAllocs()
		for range b.N {
			var v healthEventWithStatus
			if err := json.Unmarshal(data, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDeliveryPathHealthTyped is BenchmarkDeliveryPath's tracked delivery of health rows
// (DocumentField "document"), each received event read into a HealthEventWithStatus-shaped
// struct: with the map built and UnmarshalDocument, and with RawDocuments and Document.
func BenchmarkDeliveryPathHealthTyped(b *testing.B) {
	ctx := context.Background()
	for _, rawDocuments := range []bool{false, true} {
		name := "map"
		if rawDocuments {
			name = "raw-documents"
		}
		b.Run(name, func(b *testing.B) {
			w := newWatcher(Config{ClientName: "bench", TableName: "health_events", DocumentField: "document",
				RawDocuments: rawDocuments, CheckpointInterval: time.Hour}.WithDefaults())
			w.loaded = true
			b.ReportAllocs()
			for i := range b.N {
				row := healthRow(int64(i + 1))
				if err := w.deliver(ctx, &row, position.Make(row.ChangedAt, row.ID), false); err != nil {
					b.Fatal(err)
				}
				ev := <-w.events
				v, err := Document[healthEventWithStatus](ev)
				if err != nil || v.HealthEvent == nil {
					b.Fatal(err)
				}
				if err := w.MarkProcessed(ctx, ev.ResumeToken); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
