package pgchangestream

import (
	"testing"

	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

func TestMatchFilterJSON(t *testing.T) {
	filter, err := MatchFilterJSON([]byte(`[{"$match": {"$or": [
		{"operationType": "insert"},
		{"updateDescription.updatedFields": {"healtheventstatus.nodequarantined": {"$in": ["Quarantined", "UnQuarantined"]}}}
	]}}]`))
	require.NoError(t, err)
	require.True(t, filter(Event{"operationType": "update",
		"updateDescription": map[string]any{"updatedFields": map[string]any{"healtheventstatus.nodequarantined": "Quarantined"}}}))

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
