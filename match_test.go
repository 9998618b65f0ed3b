package pgchangestream

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// matchEvent is a health_events update as the watcher publishes it.
func matchEvent() Event {
	type obj = map[string]any
	return Event{
		"_id":           obj{"_data": "452"},
		"operationType": "update",
		"clusterTime":   time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC),
		"fullDocument": obj{
			"id": "rec-1",
			"healthevent": obj{"agent": "gpu-health-monitor", "isFatal": true, "nodename": "n1",
				"recommendedaction": 2.0, "errorcode": []any{"79"}, "processingstrategy": nil},
			"healtheventstatus": obj{"nodequarantined": "Quarantined"},
		},
		"updateDescription": obj{"updatedFields": obj{"healtheventstatus.nodequarantined": "Quarantined"}},
		"ns":                obj{"coll": "health_events"},
	}
}

func TestMatchFilter(t *testing.T) {
	type obj = map[string]any
	type arr = []any
	for _, tc := range []struct {
		name string
		cond obj
		want bool
	}{
		{"equal string", obj{"operationType": "update"}, true},
		{"unequal string", obj{"operationType": "insert"}, false},
		{"several fields all hold", obj{"operationType": "update", "ns.coll": "health_events"}, true},
		{"dot path", obj{"fullDocument.healthevent.nodename": "n1"}, true},
		{"path ignores case", obj{"fullDocument.HealthEvent.isfatal": true}, true},
		{"path into a dotted key", obj{"updateDescription.updatedFields.healtheventstatus.nodequarantined": "Quarantined"}, true},
		{"nested fields with a dotted key", obj{"updateDescription.updatedFields": obj{"healtheventstatus.nodequarantined": "Quarantined"}}, true},
		{"nested fields on a non-object", obj{"operationType": obj{"a": 1}}, false},
		{"numbers of any Go type", obj{"fullDocument.healthevent.recommendedaction": int64(2)}, true},
		{"path through a scalar", obj{"operationType.x": nil}, true},
		{"missing equals false", obj{"fullDocument.healthevent.isHealthy": false}, true},
		{"missing equals nil", obj{"fullDocument.nothing": nil}, true},
		{"null equals false", obj{"fullDocument.healthevent.processingstrategy": false}, true},
		{"missing is not true", obj{"fullDocument.healthevent.isHealthy": true}, false},
		{"missing $ne false", obj{"fullDocument.healthevent.isHealthy": obj{"$ne": false}}, false},
		{"$eq", obj{"fullDocument.healthevent.agent": obj{"$eq": "gpu-health-monitor"}}, true},
		{"$ne", obj{"fullDocument.healthevent.agent": obj{"$ne": "health-events-analyzer"}}, true},
		{"$ne on equal", obj{"fullDocument.healthevent.agent": obj{"$ne": "gpu-health-monitor"}}, false},
		{"$in", obj{"healtheventstatus": nil, "operationType": obj{"$in": arr{"insert", "update"}}}, true},
		{"$in of strings", obj{"operationType": obj{"$in": []string{"insert", "delete"}}}, false},
		{"$in never matches a missing field", obj{"fullDocument.nothing": obj{"$in": arr{nil, false}}}, false},
		{"$in never matches null", obj{"fullDocument.healthevent.processingstrategy": obj{"$in": arr{nil}}}, false},
		{"$in array compared whole", obj{"fullDocument.healthevent.errorcode": obj{"$in": arr{arr{"79"}}}}, true},
		{"$gt", obj{"fullDocument.healthevent.recommendedaction": obj{"$gt": 1}}, true},
		{"$gte and $lt together", obj{"fullDocument.healthevent.recommendedaction": obj{"$gte": 2, "$lt": 2.5}}, true},
		{"$lte fails", obj{"fullDocument.healthevent.recommendedaction": obj{"$lte": 1.5}}, false},
		{"$gt on strings", obj{"fullDocument.healthevent.nodename": obj{"$gt": "n0"}}, true},
		{"$lt on time", obj{"clusterTime": obj{"$lt": time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}}, true},
		{"$gt across kinds", obj{"fullDocument.healthevent.nodename": obj{"$gt": 1}}, false},
		{"$gt on missing", obj{"fullDocument.nothing": obj{"$gt": -1}}, false},
		{"$exists true", obj{"updateDescription.updatedFields": obj{"$exists": true}}, true},
		{"$exists on null", obj{"fullDocument.healthevent.processingstrategy": obj{"$exists": true}}, true},
		{"$exists false on missing", obj{"fullDocument.nothing": obj{"$exists": false}}, true},
		{"$exists with another operator", obj{"fullDocument.healthevent.recommendedaction": obj{"$exists": true, "$gt": 3}}, false},
		{"$or one holds", obj{"$or": arr{obj{"operationType": "insert"}, obj{"operationType": "update"}}}, true},
		{"$or none holds", obj{"$or": []map[string]any{{"operationType": "insert"}, {"operationType": "delete"}}}, false},
		{"$and", obj{"$and": arr{obj{"operationType": "update"}, obj{"fullDocument.healthevent.isfatal": true}}}, true},
		{"$and one fails", obj{"$and": arr{obj{"operationType": "update"}, obj{"fullDocument.healthevent.isfatal": false}}}, false},
		{"equal object", obj{"healthevent": obj{}, "fullDocument.healtheventstatus": obj{"nodequarantined": "Quarantined"}}, false},
		{"equal empty object", obj{"fullDocument.nothing": obj{}}, false},
		{"equal array", obj{"fullDocument.healthevent.errorcode": arr{"79"}}, true},
		{"array is not its element", obj{"fullDocument.healthevent.errorcode": "79"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			filter, err := MatchFilter([]map[string]any{{"$match": tc.cond}})
			require.NoError(t, err)
			require.NotNil(t, filter)
			require.Equal(t, tc.want, filter(matchEvent()))
		})
	}
}

func TestMatchFilterStages(t *testing.T) {
	type obj = map[string]any
	ev := matchEvent()
	filter, err := MatchFilter([]map[string]any{
		{"$match": obj{"operationType": "update"}},
		{"$match": obj{"ns.coll": "health_events"}},
	})
	require.NoError(t, err)
	require.True(t, filter(ev))
	filter, err = MatchFilter([]map[string]any{
		{"$match": obj{"operationType": "update"}},
		{"$match": obj{"ns.coll": "orders"}},
	})
	require.NoError(t, err)
	require.False(t, filter(ev), "every stage must hold")

	for name, pipeline := range map[string][]map[string]any{
		"nil":               nil,
		"empty":             {},
		"only empty $match": {{"$match": obj{}}, {"$match": obj{}}},
	} {
		filter, err := MatchFilter(pipeline)
		require.NoError(t, err, name)
		require.Nil(t, filter, "%s: no condition means no filter", name)
	}
}

func TestMatchFilterErrors(t *testing.T) {
	type obj = map[string]any
	type arr = []any
	for _, tc := range []struct {
		name     string
		pipeline []map[string]any
		want     string
	}{
		{"other stage", []map[string]any{{"$project": obj{"a": 1}}}, `stage 0: unsupported stage "$project"`},
		{"two keys", []map[string]any{{"$match": obj{}, "$limit": 1}}, "stage 0: want one key, $match, got 2 keys"},
		{"empty stage", []map[string]any{{"$match": obj{}}, {}}, "stage 1: want one key"},
		{"match not an object", []map[string]any{{"$match": arr{}}}, "$match takes an object, got []interface {}"},
		{"top-level operator", []map[string]any{{"$match": obj{"$nor": arr{}}}}, `unsupported operator "$nor"`},
		{"field operator", []map[string]any{{"$match": obj{"a": obj{"$regex": "x"}}}}, `field "a": $regex: unsupported operator`},
		{"mixed object", []map[string]any{{"$match": obj{"a": obj{"$eq": 1, "b": 2}}}}, `field "a": an object that mixes operators and fields`},
		{"$in not an array", []map[string]any{{"$match": obj{"a": obj{"$in": "x"}}}}, `field "a": $in: want an array, got string`},
		{"$exists not a bool", []map[string]any{{"$match": obj{"a": obj{"$exists": 1}}}}, "$exists: want true or false, got int"},
		{"$gt of a bool", []map[string]any{{"$match": obj{"a": obj{"$gt": true}}}}, "$gt: want a number, a string or a time.Time, got bool"},
		{"empty $or", []map[string]any{{"$match": obj{"$or": arr{}}}}, "$or takes a non-empty array of conditions"},
		{"$and of a non-object", []map[string]any{{"$match": obj{"$and": arr{1}}}}, "$and[0]: want a condition object, got int"},
		{"error inside $or", []map[string]any{{"$match": obj{"$or": arr{obj{"a": obj{"$bad": 1}}}}}}, `$or[0]: field "a": $bad`},
		{"unsupported value", []map[string]any{{"$match": obj{"a": struct{}{}}}}, `field "a": unsupported value type struct {}`},
		{"unsupported value inside", []map[string]any{{"$match": obj{"a": obj{"$in": arr{obj{"k": []int{1}}}}}}}, `[0]: "k": unsupported value type []int`},
		{"empty path", []map[string]any{{"$match": obj{"": 1}}}, "empty field path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			filter, err := MatchFilter(tc.pipeline)
			require.ErrorContains(t, err, tc.want)
			require.Nil(t, filter)
		})
	}
}

func TestMatchFilterJSON(t *testing.T) {
	filter, err := MatchFilterJSON([]byte(`[{"$match": {"$or": [
		{"operationType": "insert"},
		{"updateDescription.updatedFields": {"healtheventstatus.nodequarantined": {"$in": ["Quarantined", "UnQuarantined"]}}}
	]}}]`))
	require.NoError(t, err)
	require.True(t, filter(matchEvent()))

	filter, err = MatchFilterJSON([]byte(`null`))
	require.NoError(t, err)
	require.Nil(t, filter)

	_, err = MatchFilterJSON([]byte(`{"$match": {}}`))
	require.ErrorContains(t, err, "pipeline JSON")
}

// TestMatchFilterAsConfigFilter runs a compiled pipeline as the watcher's filter.
func TestMatchFilterAsConfigFilter(t *testing.T) {
	filter, err := MatchFilterJSON([]byte(`[{"$match": {"fullDocument.n": {"$gte": 2}}}]`))
	require.NoError(t, err)
	db, _ := mockDB(t)
	w, err := New(Config{DB: db, ClientName: "c", TableName: "t", Mode: ModePolling, Filter: filter, Logger: quietLogger})
	require.NoError(t, err)
	for n, want := range map[int64]bool{1: false, 2: true, 3: true} {
		row := &changelogRow{ID: n, RecordID: "r", Operation: "INSERT", NewValues: []byte(`{"n":` + string(position.FormatToken(n)) + `}`)}
		_, _, pending, _ := w.register(row, position.Make(row.ChangedAt, row.ID), false)
		require.Equal(t, want, pending, "n=%d", n)
	}
	require.Equal(t, uint64(1), w.Stats().Filtered)
}

func FuzzMatchFilterJSON(f *testing.F) {
	f.Add([]byte(`[{"$match":{"operationType":"update","fullDocument.healthevent.isfatal":true}}]`), []byte(`{}`))
	f.Add([]byte(`[{"$match":{"$or":[{"a.b":{"$in":[1,"x",null]}},{"c":{"$exists":false,"$gt":1}}]}}]`),
		[]byte(`{"a":{"b":1},"c":2}`))
	f.Add([]byte(`[{"$match":{"a.b.c":{"d.e":{"$ne":[1,{"x":null}]}}}}]`), []byte(`{"a":{"b.c":{"d.e":[1,{"x":null}]}}}`))
	f.Add([]byte(`[{"$match":{"A..B":{"$lte":"z"},"$and":[{"x":{}}]}}]`), []byte(`{"a":{"":{"b":"y"}},"x":{}}`))
	f.Add([]byte(`[{"$project":1}]`), []byte(`[]`))
	f.Fuzz(func(t *testing.T, pipeline, event []byte) {
		filter, err := MatchFilterJSON(pipeline)
		if err != nil || filter == nil {
			require.Nil(t, filter)
			return
		}
		var ev Event
		if json.Unmarshal(event, &ev) != nil {
			ev = matchEvent()
		}
		first := filter(ev)
		require.Equal(t, first, filter(ev), "a filter is deterministic")
		filter(nil)
	})
}

// A number beyond float64's range, as documents hold it, compares as an infinity.
func TestMatchFilterNumbersFloat64CannotHold(t *testing.T) {
	ev, _, err := buildEvent(evRow("INSERT", "", `{"huge": 1e400, "low": -1e400, "long": 123456789012345678901234567890}`), "t", "")
	require.NoError(t, err)
	for cond, want := range map[string]bool{
		`{"fullDocument.huge": {"$gt": 1e300}}`: true, `{"fullDocument.huge": {"$lt": 5}}`: false,
		`{"fullDocument.low": {"$lt": -1e300}}`: true, `{"fullDocument.huge": {"$exists": true}}`: true,
		`{"fullDocument.long": {"$gt": 1.2e29, "$lt": 1.3e29}}`: true, `{"fullDocument.huge": 5}`: false,
	} {
		filter, err := MatchFilterJSON([]byte(`[{"$match": ` + cond + `}]`))
		require.NoError(t, err)
		require.Equal(t, want, filter(ev), cond)
	}
}
