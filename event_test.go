package pgchangestream

import (
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/document"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// evObj keeps the expected documents short; it is the same type as map[string]any.
type evObj = map[string]any

var evChangedAt = time.Date(2025, 3, 14, 15, 9, 26, 535897000, time.UTC)

// evRow returns a changelog row with id 452 and record id "rec-1"; an empty value is NULL.
func evRow(op, oldValues, newValues string) *changelogRow {
	row := &changelogRow{ID: 452, RecordID: "rec-1", Operation: op, ChangedAt: evChangedAt}
	if oldValues != "" {
		row.OldValues = []byte(oldValues)
	}
	if newValues != "" {
		row.NewValues = []byte(newValues)
	}
	return row
}

// buildEvent builds the event of row as the watcher does with Config.DocumentField field.
func buildEvent(row *changelogRow, table, field string) (Event, bool, error) {
	return document.Build(row, table, document.Options{Field: field})
}

var evSinkToken []byte

func TestFormatToken(t *testing.T) {
	tests := []struct {
		id   int64
		want string
	}{
		{0, "0"},
		{7, "7"},
		{452, "452"},
		{-1, "-1"},
		{math.MaxInt64, "9223372036854775807"},
		{math.MinInt64, "-9223372036854775808"},
	}
	for _, tt := range tests {
		require.Equal(t, []byte(tt.want), position.FormatToken(tt.id))
	}
	allocs := testing.AllocsPerRun(100, func() { evSinkToken = position.FormatToken(math.MinInt64) })
	require.Equal(t, 1.0, allocs)
}

func BenchmarkFormatToken(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		evSinkToken = position.FormatToken(123456789)
	}
}

func TestWatcherWarnsAboutAMissingDocumentField(t *testing.T) {
	var logs strings.Builder
	db, _ := mockDB(t)
	w, err := New(Config{DB: db, ClientName: "c", TableName: "health_events", Mode: ModePolling, DocumentField: "document",
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)

	ev, _, err := w.event(evRow("INSERT", "", `{"id":"x","document":{"a":1}}`))
	require.NoError(t, err)
	require.Equal(t, evObj{"a": 1.0, "id": "rec-1"}, ev["fullDocument"])
	require.Empty(t, logs.String())

	ev, _, err = w.event(evRow("INSERT", "", `{"id":"x","doc":{"a":1}}`))
	require.NoError(t, err)
	require.Equal(t, evObj{"id": "x", "doc": evObj{"a": 1.0}}, ev["fullDocument"], "the whole row is published")
	require.Contains(t, logs.String(), "level=WARN")
	require.Contains(t, logs.String(), "id=452")
}

func TestLegacyConstructorUnwrapsHealthEvents(t *testing.T) {
	db, _ := mockDB(t)
	require.Equal(t, "document", NewPostgreSQLChangeStreamWatcher(db, "c", "health_events", "", ModePolling).cfg.DocumentField)
	require.Empty(t, NewPostgreSQLChangeStreamWatcher(db, "c", "orders", "", ModePolling).cfg.DocumentField)
	require.Empty(t, NewPostgreSQLChangeStreamWatcher(db, "c", "public.health_events", "", ModePolling).cfg.DocumentField,
		"the replaced watcher compared the bare name")
}
