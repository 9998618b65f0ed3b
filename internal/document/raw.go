package document

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Raw is what the watcher keeps of a delivered row so that the root package's
// EventWithToken.UnmarshalDocument and Document can decode fullDocument from the changelog's
// JSON text instead of through the map (see DecodeBytes). It is written once, before the
// delivery is sent, and only read after, so an event can be used from several goroutines.
type Raw struct {
	row   Row     // a copy: the watcher reuses its row buffers; the JSON columns are not reused
	table string  // Config.TableName, for rebuilding the event
	docs  Options // Config.DocumentField and how updatedFields is computed
	// built is the fullDocument map the watcher delivered and keys its length then; nil when
	// lazy.
	built map[string]any
	keys  int
	// lazy says the watcher did not decode the row's documents (Config.RawDocuments): the
	// event has fullDocument nil and no updateDescription, and event decodes them on demand.
	lazy bool
}

// lazy returns the event of row without its documents and what is kept to decode them
// on demand (Config.RawDocuments), or nil when the row's documents must be decoded now: a
// delete (fullDocumentBeforeChange is published as today), an unknown operation, or a column
// that fails to decode (not valid JSON, not an object), whose error must be reported when the
// row is read. missed is what Build would report.
func lazy(row *Row, table string, docs Options) (ev map[string]any, raw *Raw, missed bool) {
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
		if docs.Field == "" {
			continue
		}
		inner, _, ok := objectMembers(data, docs.Field, "")
		if !ok {
			return nil, nil, false
		}
		missed = missed || len(inner) == 0 || inner[0] != '{'
	}
	bare := Row{ID: row.ID, RecordID: row.RecordID, Operation: row.Operation, ChangedAt: row.ChangedAt}
	ev, _, _ = Build(&bare, table, docs) // no columns: nothing decoded, nothing fails
	return ev, &Raw{row: *row, table: table, docs: docs, lazy: true}, missed
}

// newRaw returns what the watcher keeps of row, whose event is ev: nil when ev has no
// fullDocument map (a delete, a NULL column or a decoding error), which has nothing to decode.
func newRaw(row *Row, table string, docs Options, ev map[string]any) *Raw {
	full, ok := ev["fullDocument"].(map[string]any)
	if !ok {
		return nil
	}
	return &Raw{row: *row, table: table, docs: docs, built: full, keys: len(full)}
}

// event returns the full event of the row, decoded afresh: the event the watcher delivers
// without Config.RawDocuments.
func (r *Raw) event() map[string]any {
	ev, _, _ := Build(&r.row, r.table, r.docs)
	return ev
}

// FullEvent returns the event whose fullDocument the methods of a delivery of ev read: ev, or,
// for an event the watcher delivered without decoding its documents, the full event decoded
// afresh (the cost of one decode per call; the result is not kept, so the event stays safe to
// share). r may be nil (an event not built by the watcher).
func (r *Raw) FullEvent(ev map[string]any) map[string]any {
	if r != nil && r.lazy {
		if full, ok := ev["fullDocument"]; ok && full == nil {
			return r.event()
		}
	}
	return ev
}

// DocumentJSON returns the JSON object the fullDocument of a delivery of ev can be decoded
// from, or nil: ev was delivered by the watcher (r is not nil) and its fullDocument is still
// the map the watcher built, with as many keys (or, delivered without decoding, still nil).
func (r *Raw) DocumentJSON(ev map[string]any) []byte {
	if r == nil {
		return nil
	}
	full, ok := ev["fullDocument"]
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

// Unmarshal decodes the fullDocument of a delivery of ev into v, straight from the JSON text
// when DecodeBytes can, else through the map round trip of [UnmarshalMap]: the body of the root
// package's EventWithToken.UnmarshalDocument. r may be nil.
func (r *Raw) Unmarshal(ev map[string]any, v any) error {
	if decoded, err := DecodeBytes(r.DocumentJSON(ev), v); decoded {
		if err != nil {
			return fmt.Errorf("pgchangestream: decode fullDocument: %w", err)
		}
		return nil
	}
	return UnmarshalMap(r.FullEvent(ev), v)
}

// IsUpdate reports whether r was kept of an update row, whose updateDescription FullEvent
// rebuilds. r may be nil.
func (r *Raw) IsUpdate() bool { return r != nil && r.row.Operation == "UPDATE" }

// fullDocumentJSON returns the JSON object fullDocument is decoded from when it passes
// canonicalJSON, else nil: the column new_values of an insert or update, or, when the document is
// unwrapped from DocumentField, that object with the members unwrapDocument adds ("id", and
// "createdAt" from created_at) written first. It reads the column once and allocates only the
// text it returns. DocumentJSON calls it only for a row whose fullDocument was decoded, or
// vouched for by lazy, so the column is valid JSON.
func (r *Raw) fullDocumentJSON() []byte {
	if r.row.Operation != "INSERT" && r.row.Operation != "UPDATE" {
		return nil
	}
	data := r.row.NewValues
	if r.docs.Field == "" {
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
		case r.docs.Field:
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
