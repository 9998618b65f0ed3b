package pgchangestream

import (
	"encoding/json"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

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

// evWant returns the event expected for an evRow row of table health_events, with extra.
func evWant(opType string, extra evObj) Event {
	ev := Event{
		"_id":           evObj{"_data": "452"},
		"operationType": opType,
		"clusterTime":   evChangedAt,
		"fullDocument":  nil,
		"documentKey":   evObj{"_id": "rec-1"},
		"ns":            evObj{"coll": "health_events"},
	}
	for k, v := range extra {
		ev[k] = v
	}
	return ev
}

func TestBuildEvent(t *testing.T) {
	const field = "document"
	tests := []struct {
		name          string
		row           *changelogRow
		documentField string
		want          Event
	}{
		{"insert", evRow("INSERT", "", `{"a":1,"b":{"c":"x","d":[1,true,null]}}`), "",
			evWant("insert", evObj{"fullDocument": evObj{"a": 1.0, "b": evObj{"c": "x", "d": []any{1.0, true, nil}}}})},
		{"insert with NULL new_values", evRow("INSERT", "", ""), "", evWant("insert", nil)},
		{"update", evRow("UPDATE", `{"a":1,"b":{"c":"x","d":2}}`, `{"a":1,"b":{"c":"y","d":2}}`), "",
			evWant("update", evObj{
				"fullDocument":      evObj{"a": 1.0, "b": evObj{"c": "y", "d": 2.0}},
				"updateDescription": evObj{"updatedFields": evObj{"b.c": "y"}},
			})},
		{"update without change has no updateDescription", evRow("UPDATE", `{"a":1,"b":[1]}`, `{"b":[1],"a":1}`), "",
			evWant("update", evObj{"fullDocument": evObj{"a": 1.0, "b": []any{1.0}}})},
		{"update with NULL old_values has no updateDescription", evRow("UPDATE", "", `{"a":1}`), "",
			evWant("update", evObj{"fullDocument": evObj{"a": 1.0}})},
		{"update with NULL new_values", evRow("UPDATE", `{"a":1}`, ""), "", evWant("update", nil)},
		{"delete", evRow("DELETE", `{"a":1}`, ""), "",
			evWant("delete", evObj{"fullDocumentBeforeChange": evObj{"a": 1.0}})},
		{"delete with NULL old_values", evRow("DELETE", "", ""), "", evWant("delete", nil)},
		{"unknown operation ignores the values", evRow("TRUNCATE", `not json`, `{"a":1}`), "", evWant("unknown", nil)},
		{"documentField unwraps and injects the record id", evRow("INSERT", "", `{"id":"x","document":{"a":1}}`), field,
			evWant("insert", evObj{"fullDocument": evObj{"a": 1.0, "id": "rec-1"}})},
		{"documentField missing keeps the whole document", evRow("INSERT", "", `{"a":1}`), field,
			evWant("insert", evObj{"fullDocument": evObj{"a": 1.0}})},
		{"documentField not an object keeps the whole document", evRow("INSERT", "", `{"document":"s"}`), field,
			evWant("insert", evObj{"fullDocument": evObj{"document": "s"}})},
		{"documentField on update diffs the inner documents without the id",
			evRow("UPDATE", `{"id":"x","document":{"s":{"q":false}}}`, `{"id":"x","document":{"s":{"q":true}}}`), field,
			evWant("update", evObj{
				"fullDocument":      evObj{"s": evObj{"q": true}, "id": "rec-1"},
				"updateDescription": evObj{"updatedFields": evObj{"s.q": true}},
			})},
		{"documentField on update without change", evRow("UPDATE", `{"document":{"a":1}}`, `{"document":{"a":1}}`), field,
			evWant("update", evObj{"fullDocument": evObj{"a": 1.0, "id": "rec-1"}})},
		{"documentField on delete", evRow("DELETE", `{"document":{"a":1}}`, ""), field,
			evWant("delete", evObj{"fullDocumentBeforeChange": evObj{"a": 1.0, "id": "rec-1"}})},
		{"documentField copies created_at into createdAt",
			evRow("INSERT", "", `{"id":"x","created_at":"2025-03-14T15:09:26.535897+00:00","document":{"a":1}}`), field,
			evWant("insert", evObj{"fullDocument": evObj{"a": 1.0, "id": "rec-1", "createdAt": "2025-03-14T15:09:26.535897+00:00"}})},
		{"documentField keeps the document's own createdAt",
			evRow("DELETE", `{"created_at":"t1","document":{"createdAt":"t0"}}`, ""), field,
			evWant("delete", evObj{"fullDocumentBeforeChange": evObj{"createdAt": "t0", "id": "rec-1"}})},
		{"created_at is left alone without documentField", evRow("INSERT", "", `{"created_at":"t1","a":1}`), "",
			evWant("insert", evObj{"fullDocument": evObj{"created_at": "t1", "a": 1.0}})},
		{"documentField on update keeps createdAt out of the diff",
			evRow("UPDATE", `{"created_at":"t1","document":{"s":1}}`, `{"created_at":"t1","document":{"s":2}}`), field,
			evWant("update", evObj{
				"fullDocument":      evObj{"s": 2.0, "id": "rec-1", "createdAt": "t1"},
				"updateDescription": evObj{"updatedFields": evObj{"s": 2.0}},
			})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, err := buildEvent(tt.row, "health_events", tt.documentField)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			fullDocument, ok := got["fullDocument"]
			require.True(t, ok, "fullDocument must always be present")
			if tt.want["fullDocument"] == nil {
				require.True(t, fullDocument == nil, "fullDocument is %#v, want untyped nil", fullDocument)
			}
		})
	}
}

func TestBuildEventUpdatedFields(t *testing.T) {
	tests := []struct {
		name     string
		old, new string
		want     evObj // nil: no updateDescription
	}{
		{"changed scalar", `{"a":1,"b":2}`, `{"a":1,"b":3}`, evObj{"b": 3.0}},
		{"type change", `{"a":1}`, `{"a":"1"}`, evObj{"a": "1"}},
		{"null to value", `{"a":null}`, `{"a":1}`, evObj{"a": 1.0}},
		{"value to null", `{"a":1}`, `{"a":null}`, evObj{"a": nil}},
		{
			"nested leaf only, siblings absent",
			`{"status":{"node":{"quarantined":false,"cordoned":true},"phase":"a"},"name":"n"}`,
			`{"status":{"node":{"quarantined":true,"cordoned":true},"phase":"a"},"name":"n"}`,
			evObj{"status.node.quarantined": true},
		},
		{"arrays compared whole", `{"t":["a","b"],"same":[1]}`, `{"t":["a","c"],"same":[1]}`, evObj{"t": []any{"a", "c"}}},
		{"array of objects compared whole", `{"l":[{"x":1}]}`, `{"l":[{"x":2}]}`, evObj{"l": []any{evObj{"x": 2.0}}}},
		{"new scalar key", `{"a":1}`, `{"a":1,"b":2}`, evObj{"b": 2.0}},
		{"new null key", `{"a":{}}`, `{"a":{"b":null}}`, evObj{"a.b": nil}},
		{"new object key", `{}`, `{"p":{"q":{"r":1},"s":2}}`, evObj{"p.q.r": 1.0, "p.s": 2.0}},
		{"object to empty object", `{"o":{"k":1},"x":1}`, `{"o":{},"x":1}`, evObj{"o": evObj{}}},
		{"nested object to empty object", `{"o":{"p":{"k":1},"q":1}}`, `{"o":{"p":{},"q":1}}`, evObj{"o.p": evObj{}}},
		{"new empty object", `{}`, `{"o":{}}`, evObj{"o": evObj{}}},
		{"scalar to object", `{"s":5}`, `{"s":{"k":{"m":1}}}`, evObj{"s.k.m": 1.0}},
		{"object to scalar", `{"o":{"k":1}}`, `{"o":7}`, evObj{"o": 7.0}},
		{"object to array", `{"o":{"k":1}}`, `{"o":[1]}`, evObj{"o": []any{1.0}}},
		{"removed key listed as nil", `{"a":1,"b":2}`, `{"a":1}`, evObj{"b": nil}},
		{"removed nested key listed as nil", `{"o":{"a":1,"b":2}}`, `{"o":{"a":1}}`, evObj{"o.b": nil}},
		{"removed object listed as nil, not its leaves", `{"a":1,"o":{"p":{"q":1}}}`, `{"a":1}`, evObj{"o": nil}},
		{"removed key beside a changed one", `{"o":{"a":1,"b":2}}`, `{"o":{"a":3}}`, evObj{"o.a": 3.0, "o.b": nil}},
		{"removed key under a new object", `{"o":{"a":1}}`, `{"o":{"b":{"c":1}}}`, evObj{"o.a": nil, "o.b.c": 1.0}},
		{"every key removed", `{"a":1,"b":2}`, `{}`, evObj{"a": nil, "b": nil}},
		{"empty to empty", `{"o":{}}`, `{"o":{}}`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, err := buildEvent(evRow("UPDATE", tt.old, tt.new), "health_events", "")
			require.NoError(t, err)
			if tt.want == nil {
				require.NotContains(t, got, "updateDescription")
				return
			}
			require.Equal(t, evObj{"updatedFields": tt.want}, got["updateDescription"])
		})
	}
}

func TestBuildEventErrors(t *testing.T) {
	tests := []struct {
		name    string
		row     *changelogRow
		wantErr string
	}{
		{"insert malformed new_values", evRow("INSERT", "", `{"a":`), "changelog row 452: new_values: invalid JSON: "},
		{"update malformed new_values", evRow("UPDATE", `{"a":1}`, `{a:1}`), "changelog row 452: new_values: invalid JSON: "},
		{"update malformed old_values", evRow("UPDATE", `{"a":1`, `{"a":1}`), "changelog row 452: old_values: invalid JSON: "},
		{"delete malformed old_values", evRow("DELETE", `nope`, ""), "changelog row 452: old_values: invalid JSON: "},
		{"empty text", &changelogRow{ID: 452, Operation: "DELETE", OldValues: []byte{}},
			"changelog row 452: old_values: invalid JSON: "},
		{"array", evRow("INSERT", "", `[1,2]`), "changelog row 452: new_values: not a JSON object: got array"},
		{"scalar", evRow("DELETE", `"text"`, ""), "changelog row 452: old_values: not a JSON object: got string"},
		{"JSON null", evRow("INSERT", "", `null`), "changelog row 452: new_values: not a JSON object: got null"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev, _, err := buildEvent(tt.row, "t", "")
			require.Error(t, err)
			require.True(t, strings.HasPrefix(err.Error(), tt.wantErr), "error %q, want prefix %q", err, tt.wantErr)
			// The event is still deliverable, without its document.
			require.Equal(t, evObj{"_data": "452"}, ev["_id"])
			require.Contains(t, ev, "fullDocument")
			require.Nil(t, ev["fullDocument"])
			require.NotContains(t, ev, "fullDocumentBeforeChange")
			require.NotContains(t, ev, "updateDescription")
		})
	}

	_, _, err := buildEvent(evRow("INSERT", "", `{"a":`), "t", "")
	var syntaxErr *json.SyntaxError
	require.ErrorAs(t, err, &syntaxErr, "the decoder error is wrapped")
}

func TestBuildEventNestedValuesArePlainMaps(t *testing.T) {
	ev, _, err := buildEvent(evRow("UPDATE", evBenchOld, evBenchNew), "health_events", "document")
	require.NoError(t, err)

	for _, key := range []string{"_id", "fullDocument", "updateDescription", "documentKey", "ns"} {
		_, ok := ev[key].(map[string]any)
		require.True(t, ok, "%s is %T, want map[string]any", key, ev[key])
	}
	fullDocument := ev["fullDocument"].(map[string]any)
	status, ok := fullDocument["healtheventstatus"].(map[string]any)
	require.True(t, ok)
	_, ok = status["userpodsevictionstatus"].(map[string]any)
	require.True(t, ok)
	require.Equal(t, "rec-1", fullDocument["id"])
	updatedFields, ok := ev["updateDescription"].(map[string]any)["updatedFields"].(map[string]any)
	require.True(t, ok)
	require.Equal(t, map[string]any{
		"healtheventstatus.nodequarantined":                "Quarantined",
		"healtheventstatus.userpodsevictionstatus.status":  "InProgress",
		"healtheventstatus.userpodsevictionstatus.message": "draining 14 pods",
	}, updatedFields)
}

func TestBuildEventClusterTime(t *testing.T) {
	changedAt := time.Date(2024, 12, 31, 23, 59, 59, 999999999, time.FixedZone("X", 3600))
	row := &changelogRow{ID: 1, RecordID: "r", Operation: "INSERT", NewValues: []byte(`{}`), ChangedAt: changedAt}
	ev, _, err := buildEvent(row, "t", "")
	require.NoError(t, err)
	got, ok := ev["clusterTime"].(time.Time)
	require.True(t, ok)
	require.Equal(t, changedAt, got)
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

func FuzzBuildEvent(f *testing.F) {
	f.Add(int64(452), "UPDATE", []byte(`{"a":{"b":1}}`), []byte(`{"a":{"b":2},"c":[]}`), false, false, false)
	f.Add(int64(-1), "INSERT", []byte(nil), []byte(`{"document":{"x":null}}`), true, false, true)
	f.Add(int64(math.MaxInt64), "DELETE", []byte(`[`), []byte(`{}`), false, true, true)
	f.Add(int64(0), "?", []byte(`1`), []byte(`"s"`), false, false, false)
	f.Fuzz(func(t *testing.T, id int64, op string, oldValues, newValues []byte, oldNull, newNull, unwrap bool) {
		row := &changelogRow{ID: id, RecordID: "r", Operation: op, OldValues: oldValues, NewValues: newValues}
		if oldNull {
			row.OldValues = nil
		}
		if newNull {
			row.NewValues = nil
		}
		documentField := ""
		if unwrap {
			documentField = "document"
		}
		ev, _, err := buildEvent(row, "t", documentField)
		require.Equal(t, evObj{"_data": strconv.FormatInt(id, 10)}, ev["_id"])
		require.Equal(t, string(position.FormatToken(id)), strconv.FormatInt(id, 10))
		if err != nil {
			require.Contains(t, err.Error(), "changelog row "+strconv.FormatInt(id, 10)+": ")
			return
		}
		if doc := ev["fullDocument"]; doc != nil {
			_, ok := doc.(evObj)
			require.True(t, ok)
		}
		if ud, ok := ev["updateDescription"]; ok {
			require.NotEmpty(t, ud.(evObj)["updatedFields"])
		}
	})
}

// evBenchOld and evBenchNew are a health_events row (about 1 KB) before and after a
// typical status update.
const evBenchOld = `{"id":"8b2f6c1e-4d3a-4f5e-9a7b-1c2d3e4f5a6b","document":{"createdAt":"2025-03-14T15:09:26.535897Z",` +
	`"healthevent":{"version":1,"agent":"gpu-health-monitor","componentclass":"GPU","checkname":"GpuXidError",` +
	`"isfatal":true,"ishealthy":false,"message":"XID 79: GPU has fallen off the bus (PCI:0000:3b:00)",` +
	`"recommendedaction":2,"errorcode":["79"],"entitiesimpacted":[{"entitytype":"GPU","entityvalue":"3"},` +
	`{"entitytype":"PCI","entityvalue":"0000:3b:00.0"},` +
	`{"entitytype":"GPU_UUID","entityvalue":"GPU-5f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"}],` +
	`"metadata":{"cluster":"train-east-2","rack":"r17","chassis_serial":"1563620001234","driver_version":"550.90.07",` +
	`"cuda_version":"12.4","kernel":"5.15.0-1061-nvidia","instance_type":"p5.48xlarge"},` +
	`"generatedtimestamp":{"seconds":1741964966,"nanos":535897000},"nodename":"gpu-node-017.train-east-2.internal",` +
	`"quarantineoverrides":{"force":false,"skip":false},"drainoverrides":{"force":false,"skip":false}},` +
	`"healtheventstatus":{"nodequarantined":null,"userpodsevictionstatus":{"status":"","message":""},` +
	`"faultremediated":null,"lastremediationtimestamp":null}}}`

var evBenchNew = strings.Replace(strings.Replace(evBenchOld,
	`"nodequarantined":null`, `"nodequarantined":"Quarantined"`, 1),
	`{"status":"","message":""}`, `{"status":"InProgress","message":"draining 14 pods"}`, 1)

var evSinkEvent Event

func BenchmarkBuildEvent(b *testing.B) {
	bench := func(row *changelogRow) func(*testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(row.OldValues) + len(row.NewValues)))
			for b.Loop() {
				ev, _, err := buildEvent(row, "health_events", "document")
				if err != nil {
					b.Fatal(err)
				}
				evSinkEvent = ev
			}
		}
	}
	b.Run("insert", bench(evRow("INSERT", "", evBenchNew)))
	b.Run("update", bench(evRow("UPDATE", evBenchOld, evBenchNew)))
}

func BenchmarkFormatToken(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		evSinkToken = position.FormatToken(123456789)
	}
}

func TestBuildEventReportsAMissingDocumentField(t *testing.T) {
	for _, tc := range []struct {
		name, field string
		row         *changelogRow
		missed      bool
	}{
		{"unwrapped", "document", evRow("UPDATE", `{"document":{"a":1}}`, `{"document":{"a":2}}`), false},
		{"no field configured", "", evRow("INSERT", "", `{"a":1}`), false},
		{"missing in new_values", "document", evRow("INSERT", "", `{"a":1}`), true},
		{"not an object in old_values", "document", evRow("UPDATE", `{"document":1}`, `{"document":{"a":2}}`), true},
		{"NULL column", "document", evRow("DELETE", "", ""), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, missed, err := buildEvent(tc.row, "t", tc.field)
			require.NoError(t, err)
			require.Equal(t, tc.missed, missed)
		})
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

// Numbers a float64 cannot hold are kept in every document of an event, and the diff compares
// them by value.
func TestBuildEventKeepsNumbersFloat64CannotHold(t *testing.T) {
	ev, _, err := buildEvent(evRow("INSERT", "", `{"huge": 1e400, "label": "keep me"}`), "t", "")
	require.NoError(t, err)
	require.Equal(t, evObj{"huge": json.Number("1e400"), "label": "keep me"}, ev["fullDocument"])

	ev, _, err = buildEvent(evRow("DELETE", `{"id": 123456789012345678901234567890}`, ""), "t", "")
	require.NoError(t, err)
	require.Equal(t, evObj{"id": json.Number("123456789012345678901234567890")}, ev["fullDocumentBeforeChange"])

	ev, _, err = buildEvent(evRow("UPDATE",
		`{"same": 1e400, "scale": 1.0e-400, "big": 9007199254740993, "n": 1}`,
		`{"same": 1e400, "scale": 1.00e-400, "big": 9007199254740995, "n": 1e400}`), "t", "")
	require.NoError(t, err)
	require.Equal(t, evObj{"updatedFields": evObj{"big": json.Number("9007199254740995"), "n": json.Number("1e400")}},
		ev["updateDescription"])
}

func TestDecimalForm(t *testing.T) {
	for _, same := range [][]json.Number{{"150", "1.50e2", "150.0", "15E1", "1500e-1"}, {"0", "-0", "0.000", "0e400"},
		{"-1e400", "-10e399", "-0.1e401"}} {
		for _, n := range same {
			require.Equal(t, decimalForm(same[0]), decimalForm(n), n)
		}
	}
	require.NotEqual(t, decimalForm("1e400"), decimalForm("-1e400"))
	require.NotEqual(t, decimalForm("9007199254740993"), decimalForm("9007199254740992"))
}
