package pgchangestream

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/position"
)

// healthRowJSON is the new_values of a health_events row as PostgreSQL's jsonb writes it (keys
// by length, a space after each colon and comma): about 1 KB, the document of the benchmark
// command's drain_health.
const healthRowJSON = `{"id": "5f0c3c1e-8c1a-4c2e-9d1e-0b6a7c2d9e11", "document": {"createdAt": "2025-03-14T15:09:26.535897Z", ` +
	`"healthevent": {"agent": "gpu-health-monitor", "isfatal": true, "message": "XID 79: GPU has fallen off the bus (PCI:0000:3b:00)", ` +
	`"version": 1, "metadata": {"rack": "r17", "kernel": "5.15.0-1061-nvidia", "cluster": "train-east-2", "cuda_version": "12.4", ` +
	`"instance_type": "p5.48xlarge", "chassis_serial": "1563620001234", "driver_version": "550.90.07"}, ` +
	`"nodename": "gpu-node-017.train-east-2.internal", "checkname": "GpuXidError", "errorcode": ["79"], "ishealthy": false, ` +
	`"componentclass": "GPU", "drainoverrides": {"skip": false, "force": false}, "entitiesimpacted": [{"entitytype": "GPU", ` +
	`"entityvalue": "3"}, {"entitytype": "PCI", "entityvalue": "0000:3b:00.0"}, {"entitytype": "GPU_UUID", ` +
	`"entityvalue": "GPU-5f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"}], "recommendedaction": 2, ` +
	`"generatedtimestamp": {"nanos": 535897000, "seconds": 1741964966}, "quarantineoverrides": {"skip": false, "force": false}}, ` +
	`"healtheventstatus": {"faultremediated": null, "nodequarantined": null, "userpodsevictionstatus": {"status": "", "message": ""}, ` +
	`"lastremediationtimestamp": null}}}`

// healthEventWithStatus has the shape of the store-client's HealthEventWithStatus.
type healthEventWithStatus struct {
	ID          string    `json:"id"`
	CreatedAt   time.Time `json:"createdAt"`
	HealthEvent *struct {
		Version           int    `json:"version"`
		Agent             string `json:"agent"`
		ComponentClass    string `json:"componentclass"`
		CheckName         string `json:"checkname"`
		IsFatal           bool   `json:"isfatal"`
		IsHealthy         bool   `json:"ishealthy"`
		Message           string `json:"message"`
		RecommendedAction int    `json:"recommendedaction"`
		ErrorCode         []string
		EntitiesImpacted  []struct {
			EntityType  string `json:"entitytype"`
			EntityValue string `json:"entityvalue"`
		} `json:"entitiesimpacted"`
		Metadata           map[string]string `json:"metadata"`
		GeneratedTimestamp struct {
			Seconds int64 `json:"seconds"`
			Nanos   int32 `json:"nanos"`
		} `json:"generatedtimestamp"`
		NodeName            string          `json:"nodename"`
		QuarantineOverrides map[string]bool `json:"quarantineoverrides"`
		DrainOverrides      map[string]bool `json:"drainoverrides"`
	} `json:"healthevent"`
	HealthEventStatus struct {
		NodeQuarantined        *string `json:"nodequarantined"`
		UserPodsEvictionStatus struct {
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"userpodsevictionstatus"`
		FaultRemediated          *bool      `json:"faultremediated"`
		LastRemediationTimestamp *time.Time `json:"lastremediationtimestamp"`
	} `json:"healtheventstatus"`
}

// healthRow is changelog row id of a health_events insert.
func healthRow(id int64) changelogRow {
	return changelogRow{ID: id, RecordID: "5f0c3c1e-8c1a-4c2e-9d1e-0b6a7c2d9e11", Operation: "INSERT",
		NewValues: []byte(healthRowJSON), ChangedAt: t0.Add(time.Duration(id) * time.Microsecond)}
}

// healthEvent returns the delivery of a health row as the watcher makes it, with or without
// Config.RawDocuments.
func healthEvent(tb testing.TB, rawDocuments bool) EventWithToken {
	w := newWatcher(Config{ClientName: "bench", TableName: "health_events", DocumentField: "document",
		RawDocuments: rawDocuments}.withDefaults())
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
	if mapped.documentJSON() == nil || raw.documentJSON() == nil {
		b.Fatal("the health event has no document text")
	}
	b.Run("map-round-trip", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			var v healthEventWithStatus
			if err := unmarshalDocumentMap(mapped.Event, &v); err != nil {
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
		data := mapped.documentJSON()
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
				RawDocuments: rawDocuments, CheckpointInterval: time.Hour}.withDefaults())
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
