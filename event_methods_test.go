package pgchangestream

import (
	"strconv"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

func TestEventGetters(t *testing.T) {
	ev, _, err := buildEvent(evRow("UPDATE", `{"document":{"healthevent":{"nodename":"n1"},"s":1}}`,
		`{"document":{"healthevent":{"nodename":"n1"},"s":2}}`), "health_events", "document")
	require.NoError(t, err)
	e := EventWithToken{Event: ev, ResumeToken: position.FormatToken(452)}

	id, err := e.GetDocumentID()
	require.NoError(t, err)
	require.Equal(t, "452", id)
	require.Equal(t, string(e.GetResumeToken()), id, "the document id is the resume token")
	rec, err := e.GetRecordUUID()
	require.NoError(t, err)
	require.Equal(t, "rec-1", rec)
	node, err := e.GetNodeName()
	require.NoError(t, err)
	require.Equal(t, "n1", node)
	require.Equal(t, map[string]any{"s": 2.0}, e.UpdatedFields())
	require.True(t, EventUpdatesOnly(e, "s"))
	require.False(t, EventUpdatesOnly(e, "t"))
}

func TestEventGetterEdges(t *testing.T) {
	type obj = map[string]any
	for _, tc := range []struct {
		name               string
		ev                 Event
		docID, rec, node   string // "" means an error is expected
		updated            map[string]any
		updatesOnlyS, upds bool
	}{
		{name: "empty event", ev: Event{}},
		{name: "_id without _data is printed whole", ev: Event{"_id": "7"}, docID: "7"},
		{name: "numeric _data", ev: Event{"_id": obj{"_data": 9}}, docID: "9"},
		{name: "_id fallback for the record", ev: Event{"fullDocument": obj{"_id": "u"}}, rec: "u"},
		{name: "id wins over _id", ev: Event{"fullDocument": obj{"_id": "u", "id": 5.0}}, rec: "5"},
		{name: "delete has no record in fullDocument", ev: Event{"fullDocument": nil, "fullDocumentBeforeChange": obj{"id": "u"}}},
		{name: "camelCase node name", ev: Event{"fullDocument": obj{"healthevent": obj{"nodeName": "n2"}}}, node: "n2"},
		{name: "lower case wins", ev: Event{"fullDocument": obj{"healthevent": obj{"nodeName": "n2", "nodename": "n3"}}}, node: "n3"},
		{name: "node name not a string", ev: Event{"fullDocument": obj{"healthevent": obj{"nodename": 1}}}},
		{name: "two fields updated", ev: Event{"updateDescription": obj{"updatedFields": obj{"s": 1, "t": nil}}},
			updated: obj{"s": 1, "t": nil}},
		{name: "removed field only", ev: Event{"updateDescription": obj{"updatedFields": obj{"s": nil}}},
			updated: obj{"s": nil}, updatesOnlyS: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := EventWithToken{Event: tc.ev}
			check := func(want string, got string, err error) {
				t.Helper()
				if want == "" {
					require.Error(t, err)
					require.Empty(t, got)
					return
				}
				require.NoError(t, err)
				require.Equal(t, want, got)
			}
			got, err := e.GetDocumentID()
			check(tc.docID, got, err)
			got, err = e.GetRecordUUID()
			check(tc.rec, got, err)
			got, err = e.GetNodeName()
			check(tc.node, got, err)
			require.Equal(t, tc.updated, e.UpdatedFields())
			require.Equal(t, tc.updatesOnlyS, EventUpdatesOnly(e, "s"))
			require.Nil(t, e.GetResumeToken())
		})
	}
}

func TestEventUnmarshalDocument(t *testing.T) {
	type status struct {
		Quarantined string `json:"nodequarantined"`
	}
	type doc struct {
		ID        string    `json:"id"`
		UnderID   string    `json:"_id"`
		CreatedAt time.Time `json:"createdAt"`
		Status    status    `json:"healtheventstatus"`
		Nested    struct {
			CreatedAt string `json:"createdAt"`
		} `json:"nested"`
	}
	created := "2025-03-14T15:09:26.535897Z"

	t.Run("unwrapped document", func(t *testing.T) {
		ev, _, err := buildEvent(evRow("INSERT", "",
			`{"id":"x","created_at":"`+created+`","document":{"healtheventstatus":{"nodequarantined":"Quarantined"}}}`),
			"health_events", "document")
		require.NoError(t, err)
		var d doc
		require.NoError(t, EventWithToken{Event: ev}.UnmarshalDocument(&d))
		require.Equal(t, "rec-1", d.ID)
		require.Equal(t, created, d.CreatedAt.Format(time.RFC3339Nano))
		require.Equal(t, "Quarantined", d.Status.Quarantined)
	})
	t.Run("whole row with a nested document", func(t *testing.T) {
		full := map[string]any{"id": "r9", "document": map[string]any{"createdat": created, "nested": map[string]any{"createdat": "n"}}}
		ev := Event{"fullDocument": full}
		var d doc
		require.NoError(t, EventWithToken{Event: ev}.UnmarshalDocument(&d))
		require.Equal(t, "r9", d.UnderID, "the outer id becomes _id")
		require.Empty(t, d.ID)
		require.Equal(t, created, d.CreatedAt.Format(time.RFC3339Nano), "createdat is read as createdAt")
		require.Equal(t, "n", d.Nested.CreatedAt, "at every depth")
		require.Equal(t, map[string]any{"id": "r9", "document": map[string]any{"createdat": created,
			"nested": map[string]any{"createdat": "n"}}}, full, "the event is not modified")
	})
	t.Run("createdAt already present wins", func(t *testing.T) {
		var d doc
		require.NoError(t, EventWithToken{Event: Event{"fullDocument": map[string]any{"createdAt": created, "createdat": "bad"}}}.UnmarshalDocument(&d))
		require.Equal(t, created, d.CreatedAt.Format(time.RFC3339Nano))
	})
	for name, ev := range map[string]Event{
		"no fullDocument":       {},
		"nil fullDocument":      {"fullDocument": nil},
		"fullDocument a string": {"fullDocument": "x"},
		"type mismatch":         {"fullDocument": map[string]any{"createdAt": 5}},
		"unencodable":           {"fullDocument": map[string]any{"c": make(chan int)}},
	} {
		t.Run(name, func(t *testing.T) {
			var d doc
			require.Error(t, EventWithToken{Event: ev}.UnmarshalDocument(&d))
		})
	}
}

// The idempotency key is "<table>/<changelog id>": the same for every delivery of one changelog
// row, different for each other row or table; an event without either part is an error.
func TestEventIdempotencyKey(t *testing.T) {
	key := func(ev Event) (string, error) { return EventWithToken{Event: ev}.IdempotencyKey() }
	row := evRow("INSERT", "", `{"a":1}`)
	first, _, err := buildEvent(row, "items", "")
	require.NoError(t, err)
	got, err := key(first)
	require.NoError(t, err)
	require.Equal(t, "items/"+strconv.FormatInt(row.ID, 10), got)
	again, _, err := buildEvent(row, "items", "")
	require.NoError(t, err)
	replayed, err := key(again)
	require.NoError(t, err)
	require.Equal(t, got, replayed, "a replayed delivery has the same key")

	other := *row
	other.ID++
	next, _, err := buildEvent(&other, "items", "")
	require.NoError(t, err)
	k, err := key(next)
	require.NoError(t, err)
	require.NotEqual(t, got, k, "another row, another key")
	elsewhere, _, err := buildEvent(row, "public.orders", "")
	require.NoError(t, err)
	k, err = key(elsewhere)
	require.NoError(t, err)
	require.Equal(t, "public.orders/"+strconv.FormatInt(row.ID, 10), k)

	for name, ev := range map[string]Event{
		"empty event":    {},
		"no _id":         {"ns": map[string]any{"coll": "items"}},
		"no ns":          {"_id": map[string]any{"_data": "7"}},
		"empty ns.coll":  {"_id": map[string]any{"_data": "7"}, "ns": map[string]any{"coll": ""}},
		"ns.coll number": {"_id": map[string]any{"_data": "7"}, "ns": map[string]any{"coll": 3}},
	} {
		_, err := key(ev)
		require.Error(t, err, name)
	}
}
