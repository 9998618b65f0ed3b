package pgchangestream

import (
	"sync"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// A changed fullDocument is decoded as it is now, not from the text.
func TestUnmarshalDocumentSeesAChangedMap(t *testing.T) {
	ev := healthEvent(t, false)
	doc := ev.Event["fullDocument"].(map[string]any)
	doc["extra"] = "added"
	var v map[string]any
	require.NoError(t, ev.UnmarshalDocument(&v))
	require.Equal(t, "added", v["extra"])

	ev.Event["fullDocument"] = map[string]any{"replaced": true}
	v = nil
	require.NoError(t, ev.UnmarshalDocument(&v))
	require.Equal(t, map[string]any{"replaced": true}, v)

	raw := healthEvent(t, true)
	raw.Event["fullDocument"] = map[string]any{"set": 1.0}
	v = nil
	require.NoError(t, raw.UnmarshalDocument(&v))
	require.Equal(t, map[string]any{"set": 1.0}, v)
	_, err := raw.GetNodeName()
	require.Error(t, err, "the set document has no health event")
}

// An event delivered with RawDocuments has no document map, and its methods decode on demand,
// also from several goroutines at once (as typed reads of an event with maps do).
func TestRawDocumentsEvent(t *testing.T) {
	w := newWatcher(Config{ClientName: "c", TableName: "health_events", DocumentField: "document", RawDocuments: true}.WithDefaults())
	row := evRow("UPDATE", `{"id": "x", "document": {"s": {"q": null}, "n": 1}}`, `{"id": "x", "document": {"s": {"q": "Q"}, "n": 1}}`)
	ev, raw, err := w.event(row)
	require.NoError(t, err)
	require.Nil(t, ev["fullDocument"])
	require.NotContains(t, ev, "updateDescription")
	e := EventWithToken{Event: ev, ResumeToken: position.FormatToken(row.ID), raw: raw}
	mapped := healthEvent(t, false)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			health, err := Document[healthEventWithStatus](mapped)
			require.NoError(t, err)
			require.Equal(t, "GpuXidError", health.HealthEvent.CheckName)
			doc, err := Document[map[string]any](e)
			require.NoError(t, err)
			require.Equal(t, map[string]any{"id": "rec-1", "s": map[string]any{"q": "Q"}, "n": 1.0}, doc)
			id, err := e.GetRecordUUID()
			require.NoError(t, err)
			require.Equal(t, "rec-1", id)
			require.Equal(t, map[string]any{"s.q": "Q"}, e.UpdatedFields())
			require.True(t, EventUpdatesOnly(e, "s.q"))
		})
	}
	wg.Wait()
	require.Nil(t, ev["fullDocument"], "nothing is stored back")

	// A row the fast path cannot vouch for is decoded when read, with its error, as without RawDocuments.
	ev, raw, err = w.event(evRow("INSERT", "", `{"id": 1,}`))
	require.Error(t, err)
	require.Nil(t, ev["fullDocument"])
	require.Error(t, EventWithToken{Event: ev, raw: raw}.UnmarshalDocument(new(map[string]any)))
}

// Deliveries on Events carry the row, with and without RawDocuments.
func TestDeliveriesKeepTheDocumentText(t *testing.T) {
	for _, rawDocuments := range []bool{false, true} {
		w := newWatcher(Config{ClientName: "c", TableName: "health_events", DocumentField: "document",
			RawDocuments: rawDocuments, CheckpointInterval: time.Hour}.WithDefaults())
		w.loaded = true
		row := healthRow(7)
		require.NoError(t, w.deliver(t.Context(), &row, position.Make(row.ChangedAt, row.ID), false))
		ev := <-w.events
		require.NotNil(t, ev.raw.DocumentJSON(ev.Event))
		require.Equal(t, rawDocuments, ev.Event["fullDocument"] == nil)
		doc, err := Document[healthEventWithStatus](ev)
		require.NoError(t, err)
		require.Equal(t, row.RecordID, doc.ID)
		name, err := ev.GetNodeName()
		require.NoError(t, err)
		require.Equal(t, "gpu-node-017.train-east-2.internal", name)
	}
}

// A typed read of a health event takes the faster decoder: 67 allocations through encoding/json.
func TestUnmarshalDocumentAllocations(t *testing.T) {
	for _, rawDocuments := range []bool{false, true} {
		ev := healthEvent(t, rawDocuments)
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := Document[healthEventWithStatus](ev); err != nil {
				t.Fatal(err)
			}
		})
		require.LessOrEqual(t, allocs, 45.0, "raw %v", rawDocuments)
	}
}
