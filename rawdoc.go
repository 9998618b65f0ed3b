package pgchangestream

import (
	"bytes"
	"encoding"
	"encoding/json"
	"reflect"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	gojson "github.com/goccy/go-json"
)

// rawDocument is what the watcher keeps of a delivered row so that [EventWithToken.UnmarshalDocument]
// and [Document] can decode fullDocument from the changelog's JSON text instead of through the
// map (see decodeBytes). It is written once, before the delivery is sent, and only read after,
// so an event can be used from several goroutines.
type rawDocument struct {
	row   changelogRow    // a copy: the watcher reuses its row buffers; the JSON columns are not reused
	table string          // Config.TableName, for rebuilding the event
	docs  documentOptions // Config.DocumentField and how updatedFields is computed
	// built is the fullDocument map the watcher delivered and keys its length then; nil when
	// lazy.
	built map[string]any
	keys  int
	// lazy says the watcher did not decode the row's documents (Config.RawDocuments): the
	// event has fullDocument nil and no updateDescription, and event decodes them on demand.
	lazy bool
}

// lazyEvent returns the event of row without its documents and what is kept to decode them
// on demand (Config.RawDocuments), or nil when the row's documents must be decoded now: a
// delete (fullDocumentBeforeChange is published as today), an unknown operation, or a column
// that fails to decode (not valid JSON, not an object), whose error must be reported when the
// row is read. missed is what buildEvent would report.
func lazyEvent(row *changelogRow, table string, docs documentOptions) (ev Event, raw *rawDocument, missed bool) {
	if row.Operation != "INSERT" && row.Operation != "UPDATE" || row.NewValues == nil {
		return nil, nil, false
	}
	columns := [][]byte{row.NewValues}
	if row.Operation == "UPDATE" && row.OldValues != nil {
		columns = append(columns, row.OldValues)
	}
	for _, data := range columns {
		if object, _ := scanObject(data); !object {
			return nil, nil, false
		}
		if docs.field == "" {
			continue
		}
		inner, _, ok := objectMembers(data, docs.field, "")
		if !ok {
			return nil, nil, false
		}
		missed = missed || len(inner) == 0 || inner[0] != '{'
	}
	bare := changelogRow{ID: row.ID, RecordID: row.RecordID, Operation: row.Operation, ChangedAt: row.ChangedAt}
	ev, _, _ = buildEvent(&bare, table, docs.field) // no columns: nothing decoded, nothing fails
	return ev, &rawDocument{row: *row, table: table, docs: docs, lazy: true}, missed
}

// newRawDocument returns what the watcher keeps of row, whose event is ev: nil when ev has no
// fullDocument map (a delete, a NULL column or a decoding error), which has nothing to decode.
func newRawDocument(row *changelogRow, table string, docs documentOptions, ev Event) *rawDocument {
	full, ok := ev["fullDocument"].(map[string]any)
	if !ok {
		return nil
	}
	return &rawDocument{row: *row, table: table, docs: docs, built: full, keys: len(full)}
}

// event returns the full event of the row, decoded afresh: the event the watcher delivers
// without Config.RawDocuments.
func (r *rawDocument) event() Event {
	ev, _, _ := buildEventWith(&r.row, r.table, r.docs)
	return ev
}

// documentEvent returns the event whose fullDocument e's methods read: e.Event, or, for an event
// the watcher delivered without decoding its documents, the full event decoded afresh (the cost
// of one decode per call; the result is not kept, so the event stays safe to share).
func (e EventWithToken) documentEvent() Event {
	if e.raw != nil && e.raw.lazy {
		if full, ok := e.Event["fullDocument"]; ok && full == nil {
			return e.raw.event()
		}
	}
	return e.Event
}

// documentJSON returns the JSON object fullDocument of e can be decoded from, or nil: e was
// delivered by the watcher and its fullDocument is still the map the watcher built, with as
// many keys (or, delivered without decoding, still nil).
func (e EventWithToken) documentJSON() []byte {
	r := e.raw
	if r == nil {
		return nil
	}
	full, ok := e.Event["fullDocument"]
	switch {
	case !ok:
		return nil
	case r.lazy:
		if full != nil {
			return nil
		}
	default:
		if m, _ := full.(map[string]any); !isMap(full, r.built) || len(m) != r.keys {
			return nil
		}
	}
	return r.fullDocumentJSON()
}

// fullDocumentJSON returns the JSON object fullDocument is decoded from when it passes
// canonicalJSON, else nil: the column new_values of an insert or update, or, when the document is
// unwrapped from DocumentField, that object with the members unwrapDocument adds ("id", and
// "createdAt" from created_at) written first. It reads the column once and allocates only the
// text it returns. documentJSON calls it only for a row whose fullDocument was decoded, or
// vouched for by lazyEvent, so the column is valid JSON.
func (r *rawDocument) fullDocumentJSON() []byte {
	if r.row.Operation != "INSERT" && r.row.Operation != "UPDATE" {
		return nil
	}
	data := r.row.NewValues
	if r.docs.field == "" {
		return canonicalOrNil(data)
	}
	var (
		inner, createdAt []byte
		names            nameSet // of the unwrapped document, "id" first
		whole            bool    // the member is not an object: the column is published whole
		ok               bool
	)
	names.add(idName)
	i := skipSpace(data, 0) + 1
	for {
		if i = skipSpace(data, i); data[i] == '}' {
			break
		}
		end := skipValidString(data, i)
		name := data[i+1 : end-1]
		if bytes.IndexByte(name, '\\') >= 0 {
			return nil // it may or may not spell the member's name
		}
		start := skipSpace(data, skipSpace(data, end)+1) // past the colon
		switch string(name) {
		case r.docs.field:
			if inner != nil {
				return nil // repeated: left to the round trip
			}
			if whole = data[start] != '{'; whole {
				i = skipValue(data, start)
			} else if i, ok = canonicalObject(data, start, 1, &names); !ok {
				return nil
			}
			inner = data[start:i]
		case "created_at":
			if createdAt != nil {
				return nil
			}
			if i, ok = canonicalValue(data, start, 1); !ok {
				return nil
			}
			createdAt = data[start:i]
		default:
			i = skipValue(data, start)
		}
		if i = skipSpace(data, i); data[i] == ',' {
			i++
		}
	}
	if inner == nil || whole {
		return canonicalOrNil(data) // published whole, as decode does
	}
	id := r.row.RecordID
	if !plainString(id) {
		return nil
	}
	if createdAt != nil {
		if taken, found := names.find([]byte("createdAt")); found && string(taken) == "createdAt" {
			createdAt = nil // the document's own is kept
		} else if found {
			return nil // two names that are equal ignoring case
		}
	}
	out := make([]byte, 0, len(inner)+len(id)+len(createdAt)+24)
	out = append(append(append(out, `{"id":"`...), id...), '"')
	if createdAt != nil {
		out = append(append(out, `,"createdAt":`...), createdAt...)
	}
	if rest := skipSpace(inner, 1); inner[rest] != '}' {
		out = append(out, ',')
	}
	return append(out, inner[1:]...)
}

// idName is the name of the member fullDocumentJSON writes first.
var idName = []byte("id")

// canonicalOrNil returns data if it passes canonicalJSON, else nil.
func canonicalOrNil(data []byte) []byte {
	if !canonicalJSON(data) {
		return nil
	}
	return data
}

// plainString reports whether json.Marshal writes s as s between quotes, as canonicalString
// requires of a string in the text.
func plainString(s string) bool {
	if !utf8.ValidString(s) || strings.ContainsAny(s, "\u2028\u2029") {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c < utf8.RuneSelf && stringStop[c] {
			return false
		}
	}
	return true
}

// objectMembers returns the values of the last members named a and b of the JSON object data,
// which must be valid, nil for a name without a member. ok is false when a member name holds an
// escape, so that it may or may not spell a or b.
func objectMembers(data []byte, a, b string) (va, vb []byte, ok bool) {
	i := skipSpace(data, 0) + 1
	for {
		if i = skipSpace(data, i); data[i] == '}' {
			return va, vb, true
		}
		end := skipValidString(data, i)
		name := data[i+1 : end-1]
		if bytes.IndexByte(name, '\\') >= 0 {
			return nil, nil, false
		}
		start := skipSpace(data, skipSpace(data, end)+1) // past the colon
		i = skipValue(data, start)
		switch string(name) {
		case a:
			va = data[start:i]
		case b:
			vb = data[start:i]
		}
		if i = skipSpace(data, i); data[i] == ',' {
			i++
		}
	}
}

// skipValue returns the index after the JSON value starting at data[i], which must be valid.
func skipValue(data []byte, i int) int {
	depth := 0
	for {
		switch c := data[i]; {
		case c == '"':
			i = skipValidString(data, i)
		case c == '{' || c == '[':
			depth++
			i++
		case c == '}' || c == ']':
			depth--
			i++
		case c == 't' || c == 'n':
			i += len("true")
		case c == 'f':
			i += len("false")
		case c == '-' || isDigit(c):
			i = skipNumber(data, i)
		default: // white space, a comma or a colon inside a container
			i++
		}
		if depth == 0 {
			return i
		}
	}
}

// skipValidString returns the index after the string starting at data[i] == '"' of valid JSON:
// after the next quote not escaped by an odd number of backslashes.
func skipValidString(data []byte, i int) int {
	for i++; ; i++ {
		i += bytes.IndexByte(data[i:], '"')
		escapes := 0
		for data[i-1-escapes] == '\\' {
			escapes++
		}
		if escapes%2 == 0 {
			return i + 1
		}
	}
}

// decodeBytes decodes data, a JSON object that passes canonicalJSON, into v, and reports
// whether it could: whether decoding data gives v the value and the error-ness that decoding
// json.Marshal of its map gives, the round trip of unmarshalDocumentMap. That holds when data
// passes canonicalJSON (every scalar is written as json.Marshal writes it, no two member names
// of an object fold to the same name, no name is changed by the round trip) and v's type passes
// plainType (only a scalar's bytes reach its decoders, never the spacing or member order of an
// object).
//
// A zero target whose type reaches no encoding.TextUnmarshaler but time.Time is decoded by
// github.com/goccy/go-json, which, for such texts and types, gives encoding/json's values when it
// succeeds (FuzzUnmarshalDocumentMatchesTheMapRoundTrip holds it to that); when it fails, the
// target is zeroed and encoding/json decodes it, so every error is encoding/json's own.
func decodeBytes(data []byte, v any) (bool, error) {
	rv := reflect.ValueOf(v)
	if data == nil || rv.Kind() != reflect.Pointer || rv.IsNil() {
		return false, nil
	}
	t := rv.Type().Elem()
	info, ok := plainTargets.Load(t)
	if !ok {
		info, _ = plainTargets.LoadOrStore(t, inspectType(t, false, map[reflect.Type]bool{}))
	}
	p := info.(plainType)
	zero := rv.Elem().IsZero()
	if !p.plain || p.iface && !zero {
		return false, nil // an interface may hold a pointer to a json.Unmarshaler
	}
	if p.fast && zero {
		if err := gojson.Unmarshal(data, v); err == nil {
			return true, nil
		}
		rv.Elem().SetZero() // what the faster decoder filled in before it failed
	}
	return true, json.Unmarshal(data, v)
}

// plainTargets caches plainType by type.
var plainTargets sync.Map // reflect.Type -> plainType

// plainType is what decodeBytes needs to know of a type.
type plainType struct {
	plain bool // no json.Unmarshaler other than time.Time can be reached
	iface bool // an interface can be reached other than as a map element
	fast  bool // plain, and no encoding.TextUnmarshaler other than time.Time can be reached
}

var (
	unmarshalerType     = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	timeType            = reflect.TypeFor[time.Time]()
)

// inspectType walks t; inMap says t is a map's element type. seen holds the types on the way.
func inspectType(t reflect.Type, inMap bool, seen map[reflect.Type]bool) plainType {
	if t == timeType {
		return plainType{plain: true, fast: true}
	}
	if t.Kind() == reflect.Pointer { // its methods are those of the type it points to
		return inspectType(t.Elem(), inMap, seen)
	}
	if t.Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerType) {
		return plainType{}
	}
	if seen[t] {
		return plainType{plain: true, fast: true}
	}
	seen[t] = true
	defer delete(seen, t)
	fast := !t.Implements(textUnmarshalerType) && !reflect.PointerTo(t).Implements(textUnmarshalerType)
	join := func(a, b plainType) plainType {
		return plainType{plain: a.plain && b.plain, iface: a.iface || b.iface, fast: a.fast && b.fast}
	}
	switch t.Kind() {
	case reflect.Interface:
		return plainType{plain: true, iface: !inMap, fast: fast}
	case reflect.Slice, reflect.Array:
		return join(inspectType(t.Elem(), inMap, seen), plainType{plain: true, fast: fast})
	case reflect.Map:
		elem := inspectType(t.Elem(), true, seen)
		return join(inspectType(t.Key(), inMap, seen), plainType{plain: elem.plain, fast: fast && elem.fast})
	case reflect.Struct:
		p := plainType{plain: true, fast: fast}
		for i := range t.NumField() {
			p = join(p, inspectType(t.Field(i).Type, inMap, seen))
		}
		return p
	default:
		return plainType{plain: true, fast: fast}
	}
}
