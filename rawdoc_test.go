package pgchangestream

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// docStruct is a decode target with the field types whose decoding depends on the exact text
// of a value: integers of each size, floats, json.Number, time.Time, ",string", []byte,
// interfaces, nested pointers, names that differ only in case, and embedded structs whose
// fields are shadowed or conflict.
type docStruct struct {
	DocEmbedded
	docEmbeddedToo
	I16       int16             `json:"i16"`
	U8        uint8             `json:"u8"`
	U32       uint32            `json:"u32"`
	I64       int64             `json:"i64"`
	QF        float64           `json:"qf,string"`
	QB        bool              `json:"qb,string"`
	Strs      map[string]string `json:"strs"`
	Ptrs      []*int            `json:"ptrs"`
	Lower     string            `json:"lower"`
	LowerCase string            `json:"LOWER"`
	ID        string            `json:"id"`
	UnderID   any               `json:"_id"`
	CreatedAt time.Time         `json:"createdAt"`
	When      *time.Time        `json:"t"`
	N         int               `json:"n"`
	I8        int8              `json:"i8"`
	U         uint64            `json:"u"`
	F         float64           `json:"f"`
	F32       float32           `json:"f32"`
	Num       json.Number       `json:"num"`
	S         string            `json:"s"`
	B         bool              `json:"b"`
	P         *int              `json:"p"`
	Quoted    int               `json:"q,string"`
	Bytes     []byte            `json:"bytes"`
	Arr       []any             `json:"arr"`
	Ints      []int             `json:"ints"`
	Fixed     [2]float64        `json:"fixed"`
	M         map[string]any    `json:"m"`
	Ranks     map[int]string    `json:"ranks"`
	Any       any               `json:"any"`
	A         *docStruct        `json:"a"`
	NodeName  string            // matches "nodename", "NODENAME", ...
	Document  map[string]int    `json:"document"`
}

// DocEmbedded and docEmbeddedToo are embedded in docStruct: "s" is shadowed by docStruct's own,
// "e" and Dup are promoted from one and two of them (Dup is then no field at all).
type DocEmbedded struct {
	E   int    `json:"e"`
	S   string `json:"s"`
	Dup string
}

type docEmbeddedToo struct {
	Dup string
	X   *int `json:"x"`
}

// textLevel decodes itself from a JSON string: a type the faster decoder is not given.
type textLevel string

func (l *textLevel) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		return errors.New("empty level")
	}
	*l = textLevel(strings.ToUpper(string(b)))
	return nil
}

// textTarget reaches an encoding.TextUnmarshaler, as a field and as a map key.
type textTarget struct {
	Level  textLevel         `json:"s"`
	Levels map[textLevel]any `json:"m"`
	N      int               `json:"n"`
}

// rawTarget holds a json.RawMessage, which sees the spacing of the text: it always takes the
// map round trip.
type rawTarget struct {
	A json.RawMessage `json:"a"`
}

// decodeTargets returns fresh values to decode into, one of each target type.
func decodeTargets() []any {
	return []any{new(map[string]any), new(any), new(docStruct), new(healthEventWithStatus), new(rawTarget),
		new(textTarget),
		new([]any), new(string)}
}

// rawDocSeeds are documents that the fast path must decode as the map round trip does, or
// leave to it: the real shapes and every kind of text the gate looks at.
var rawDocSeeds = []string{
	`{"id": "x", "n": 1, "f": 1.5, "s": "a", "createdAt": "2025-03-14T15:09:26.535897Z"}`,
	`{"n": 1.0}`, `{"n": 1e2}`, `{"n": 1E2}`, `{"u": 12345678901234567890}`, `{"n": 9007199254740993}`,
	`{"f": 0.1}`, `{"f": 1e-7}`, `{"f": 1e21}`, `{"f": 100000000000000000000}`, `{"f": -0}`, `{"i8": 300}`,
	`{"num": 1.50}`, `{"num": 12}`, `{"q": "12"}`, `{"q": "1.0"}`, `{"bytes": "aGk="}`,
	`{"createdAt": "2025-03-14T15:09:26Z", "t": "2025\u002d03-14T15:09:26Z"}`, `{"createdAt": "x<y"}`,
	`{"s": "\u00e9"}`, `{"s": "é"}`, `{"s": "a&b"}`, "{\"s\": \"\xff\"}", "{\"s\": \"\u2028\"}",
	`{"nodename": "a", "NodeName": "b"}`, `{"NODENAME": "a"}`, `{"n": 1, "n": 2}`, `{"a": {"n": 1}, "a": {"s": "x"}}`,
	`{"createdat": "2025-03-14T15:09:26Z"}`, `{"createdAt": "2025-03-14T15:09:26Z", "createdat": "bad"}`,
	`{"a": {"createdat": "2025-03-14T15:09:26Z"}}`, `{"arr": [{"createdat": 1}]}`,
	`{"id": "r9", "document": {"n": 1}}`, `{"document": 5}`, `{"document": {"n": 1}, "id": 7}`,
	`{"m": {"k": [1, {"x": null}]}, "any": {"a": 1}, "arr": [1, "s", null, true]}`, `{"ranks": {"1": "a", "x": "b"}}`,
	`{"fixed": [1, 2, 3]}`, `{"p": null, "A": {"id": "y"}}`, `{"a": {"a": {"a": {"n": 2}}}}`,
	`{"k\u0041": 1, "kA": 2}`, `{"id": 5}`, `{"ID": "z"}`, `{"_id": {"x": 1}}`, `{}`, `{"a": []}`,
	`{"a": {"x": 1, "y": [1, 2]}}`, `{"s": 5}`, `{"n": "5"}`, `{"createdAt": 5}`,
	`{"CreatedAt": "2020-01-01T00:00:00Z", "n": 1}`, `{"ID": "inner", "s": "x"}`, `{"LOWER": "a", "lower": "b"}`,
	`{"i16": 32768, "u8": 256, "u32": -1, "i64": 9223372036854775808, "s": "after"}`, `{"qf": "1.5", "qb": "true", "q": "-12"}`,
	`{"e": 1, "dup": "x", "Dup": "y", "x": 3, "unknown": {"a": [1]}}`, `{"f32": 3.5e38}`, `{"strs": {"a": null, "b": "c"}, "ptrs": [1, null]}`,
	healthRowJSON, evBenchNew,
}

// fuzzRow makes a changelog row of doc: wrap 0 publishes it whole, 1 as the "document" of a
// health_events row, 2 beside a created_at column, 3 as the created_at column, unwrapped (so it
// is also the createdAt added to itself); an odd op makes it an update of itself.
func fuzzRow(doc string, op, wrap uint8) (*changelogRow, string) {
	field, newValues := "", doc
	switch wrap % 4 {
	case 1:
		field, newValues = "document", `{"id": "outer", "document": `+doc+`}`
	case 2:
		field, newValues = "document", `{"created_at": "2025-03-14T15:09:26Z", "document": `+doc+`}`
	case 3:
		field, newValues = "created_at", `{"created_at": `+doc+`}`
	}
	row := evRow("INSERT", "", newValues)
	if op%2 == 1 {
		row = evRow("UPDATE", `{"document": {"n": 3}, "n": 3}`, newValues)
	}
	return row, field
}

// requireSameDocument checks that the watcher's deliveries of row, with and without
// RawDocuments, give what the map round trip of the event built today gives: the same values
// and error-ness from UnmarshalDocument and Document for every target, and the same results of
// the methods that read the document.
func requireSameDocument(t *testing.T, row *changelogRow, field string) {
	ref, _, refErr := buildEvent(row, "t", field)
	for _, rawDocuments := range []bool{false, true} {
		w := newWatcher(Config{ClientName: "c", TableName: "t", DocumentField: field, RawDocuments: rawDocuments,
			Logger: quietLogger, MaxPending: 1, BatchSize: 1, BufferSize: 1}.withDefaults()) // small: built per input
		ev, raw, err := w.event(row)
		require.Equal(t, refErr != nil, err != nil, "raw %v: %s: %v / %v", rawDocuments, row.NewValues, refErr, err)
		e := EventWithToken{Event: ev, raw: raw}
		for i, want := range decodeTargets() {
			wantErr := unmarshalDocumentMap(ref, want)
			got := decodeTargets()[i]
			gotErr := e.UnmarshalDocument(got)
			require.Equal(t, wantErr != nil, gotErr != nil, "target %T raw %v: %v / %v", want, rawDocuments, wantErr, gotErr)
			if wantErr == nil {
				require.Equal(t, want, got, "target %T raw %v", want, rawDocuments)
			}
		}
		refEv := EventWithToken{Event: ref}
		requireSameResult(t, refEv.GetRecordUUID, e.GetRecordUUID)
		requireSameResult(t, refEv.GetNodeName, e.GetNodeName)
		if full, _ := ref["fullDocument"].(map[string]any); !ambiguousPaths(full) {
			require.Equal(t, refEv.UpdatedFields(), e.UpdatedFields())
		}
	}
}

// ambiguousPaths reports whether two members of doc can have the same dotted path in
// updatedFields (a name that is empty or holds a dot), which makes the diff depend on the order
// of map iteration.
func ambiguousPaths(doc map[string]any) bool {
	for key, value := range doc {
		if key == "" || strings.Contains(key, ".") {
			return true
		}
		if m, ok := value.(map[string]any); ok && ambiguousPaths(m) {
			return true
		}
	}
	return false
}

// requireSameResult checks that two calls give the same value and error-ness.
func requireSameResult(t *testing.T, want, got func() (string, error)) {
	w, wErr := want()
	g, gErr := got()
	require.Equal(t, wErr != nil, gErr != nil)
	require.Equal(t, w, g)
}

func TestUnmarshalDocumentMatchesTheMapRoundTrip(t *testing.T) {
	for _, doc := range append(append([]string{}, rawDocSeeds...), decodeSeeds...) {
		for wrap := range uint8(4) {
			for op := range uint8(2) {
				row, field := fuzzRow(doc, op, wrap)
				requireSameDocument(t, row, field)
			}
		}
	}
}

func FuzzUnmarshalDocumentMatchesTheMapRoundTrip(f *testing.F) {
	for i, doc := range append(append([]string{}, rawDocSeeds...), decodeSeeds...) {
		f.Add(doc, []byte(doc), uint8(i), uint8(i/2))
	}
	f.Fuzz(func(t *testing.T, doc string, gen []byte, op, wrap uint8) {
		row, field := fuzzRow(doc, op, wrap)
		requireSameDocument(t, row, field)
		row, field = fuzzRow(generateDocument(gen), op, wrap)
		requireSameDocument(t, row, field)
	})
}

// generateDocument writes a JSON object chosen by the bytes of choices: nested objects and
// arrays, member names that match docStruct's fields (in other cases too, repeated, escaped,
// or renamed by the round trip), numbers of every form and size, strings with escapes and
// characters json.Marshal escapes, true, false and null, spaced or not.
func generateDocument(choices []byte) string {
	g := docGenerator{choices: choices}
	var b strings.Builder
	g.object(&b, 0)
	return b.String()
}

type docGenerator struct{ choices []byte }

var (
	genNames = []string{"id", "_id", "n", "i8", "u", "f", "f32", "num", "s", "b", "p", "q", "bytes", "arr", "ints", "fixed", "m", "ranks", "any", "a", "t", "nodename", "NodeName", "NODENAME", "createdAt", "createdat", "document", "k\\u0041", "kA", "healthevent", "x", "1", "",
		// other cases of field names, embedded and conflicting fields, names of no field
		"N", "I8", "ID", "Id", "S", "nOdEnAmE", "CreatedAt", "CREATEDAT", "lower", "LOWER", "Lower", "e", "E", "dup", "Dup",
		"i16", "u8", "u32", "i64", "qf", "qb", "strs", "ptrs", "unknown", "zz", "DocEmbedded", "x"}
	genScalars = []string{"0", "-0", "1", "-7", "1.0", "1e2", "1E+2", "0.1", "1e-7", "2.5e-8", "1.5e300", "300", "127", "12345678901234567890",
		"9007199254740993", "100000000000000000000", "1e21", "123456789012345.5", `"a"`, `"\u00e9"`, `"é"`, `"a<b"`, `"x&y"`, "\"\u2028\"", `"\ud83d\ude00"`,
		`"\""`, `"12"`, `"1.0"`, `"aGk="`, `"2025-03-14T15:09:26Z"`, `"2025-03-14T15:09:26.5+01:00"`, `"2025\u002d03-14T15:09:26Z"`, "true", "false", "null",
		// the edges of each integer and float size, and ",string" texts
		"128", "-128", "-129", "255", "256", "-1", "32767", "32768", "4294967295", "4294967296", "9223372036854775807",
		"9223372036854775808", "-9223372036854775808", "18446744073709551615", "18446744073709551616", "3.4e38", "3.5e38",
		"1.5", "-2.5", "1e308", "5e-324", `"-12"`, `"1.5"`, `"true"`, `"false"`, `"null"`, `" 1"`, `"1e2"`, `""`, `"x"`}
)

// next returns the next choice below n, 0 once the choices are used up.
func (g *docGenerator) next(n int) int {
	if len(g.choices) == 0 {
		return 0
	}
	c := int(g.choices[0]) % n
	g.choices = g.choices[1:]
	return c
}

func (g *docGenerator) sep(b *strings.Builder, s string) {
	b.WriteString(s)
	if g.next(2) == 1 {
		b.WriteByte(' ')
	}
}

func (g *docGenerator) object(b *strings.Builder, depth int) {
	b.WriteByte('{')
	for i := range g.next(5) {
		if i > 0 {
			g.sep(b, ",")
		}
		b.WriteString(`"` + genNames[g.next(len(genNames))] + `"`)
		g.sep(b, ":")
		g.value(b, depth+1)
	}
	b.WriteByte('}')
}

func (g *docGenerator) value(b *strings.Builder, depth int) {
	switch c := g.next(8); {
	case c == 0 && depth < 5:
		g.object(b, depth)
	case c == 1 && depth < 5:
		b.WriteByte('[')
		for i := range g.next(4) {
			if i > 0 {
				g.sep(b, ",")
			}
			g.value(b, depth+1)
		}
		b.WriteByte(']')
	default:
		b.WriteString(genScalars[g.next(len(genScalars))])
	}
}

// The text is what a health event is decoded from, with and without RawDocuments, and texts
// that would decode otherwise than the map are left to it.
func TestUnmarshalDocumentDecodesTheText(t *testing.T) {
	for _, rawDocuments := range []bool{false, true} {
		data := healthEvent(t, rawDocuments).documentJSON()
		require.NotNil(t, data)
		var v healthEventWithStatus
		decoded, err := decodeBytes(data, &v)
		require.True(t, decoded)
		require.NoError(t, err)
		require.Equal(t, "5f0c3c1e-8c1a-4c2e-9d1e-0b6a7c2d9e11", v.ID, "the record id is injected")
		require.Equal(t, "gpu-node-017.train-east-2.internal", v.HealthEvent.NodeName)
		require.Equal(t, int64(1741964966), v.HealthEvent.GeneratedTimestamp.Seconds)
	}
	// Each text decodes into docStruct otherwise than its map round trip does.
	for _, doc := range []string{`{"n": 1.0}`, `{"num": 1.50}`,
		`{"t": "2025\u002d03-14T15:09:26Z"}`, `{"nodename": "a", "NodeName": "b"}`, `{"a": {"n": 1}, "a": {"s": "x"}}`,
		`{"document": {"n": 1}}`} {
		var direct, viaMap docStruct
		directErr := json.Unmarshal([]byte(doc), &direct)
		mapErr := unmarshalDocumentMap(Event{"fullDocument": mustDecode(t, doc)}, &viaMap)
		require.False(t, directErr == nil && mapErr == nil && reflect.DeepEqual(direct, viaMap), doc)
		require.False(t, canonicalJSON([]byte(doc)), doc)
	}
	// A number a float64 cannot hold is a json.Number in the map, and decodes from the text as
	// through the map, digit for digit.
	for _, doc := range []string{`{"u": 12345678901234567890}`, `{"num": 1e400}`, `{"num": -123456789012345678901234567890}`} {
		var direct, viaMap docStruct
		decoded, err := decodeBytes([]byte(doc), &direct)
		require.True(t, decoded, doc)
		require.NoError(t, err, doc)
		require.NoError(t, unmarshalDocumentMap(Event{"fullDocument": mustDecode(t, doc)}, &viaMap), doc)
		require.Equal(t, viaMap, direct, doc)
	}
	var exact docStruct
	require.NoError(t, unmarshalDocumentMap(Event{"fullDocument": mustDecode(t, `{"u": 12345678901234567890, "num": 1e400}`)}, &exact))
	require.Equal(t, uint64(12345678901234567890), exact.U)
	require.Equal(t, json.Number("1e400"), exact.Num)
	decoded, _ := decodeBytes([]byte(`{"a": {"x": 1}}`), new(rawTarget))
	require.False(t, decoded, "a json.RawMessage sees the spacing")
	prefilled := docStruct{Any: new(json.RawMessage)}
	decoded, _ = decodeBytes([]byte(`{"any": {"x": 1}}`), &prefilled)
	require.False(t, decoded, "an interface may hold a decoder")
}

func mustDecode(t *testing.T, doc string) map[string]any {
	m, err := unmarshalObject([]byte(doc))
	require.NoError(t, err)
	return m
}

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
	w := newWatcher(Config{ClientName: "c", TableName: "health_events", DocumentField: "document", RawDocuments: true}.withDefaults())
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
			RawDocuments: rawDocuments, CheckpointInterval: time.Hour}.withDefaults())
		w.loaded = true
		row := healthRow(7)
		require.NoError(t, w.deliver(t.Context(), &row, position.Make(row.ChangedAt, row.ID), false))
		ev := <-w.events
		require.NotNil(t, ev.documentJSON())
		require.Equal(t, rawDocuments, ev.Event["fullDocument"] == nil)
		doc, err := Document[healthEventWithStatus](ev)
		require.NoError(t, err)
		require.Equal(t, row.RecordID, doc.ID)
		name, err := ev.GetNodeName()
		require.NoError(t, err)
		require.Equal(t, "gpu-node-017.train-east-2.internal", name)
	}
}
