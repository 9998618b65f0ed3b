package document

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Row is one row of the changelog as read by the watcher.
type Row struct {
	ID       int64
	RecordID string
	// Operation is "INSERT", "UPDATE" or "DELETE"; anything else becomes operationType "unknown".
	Operation string
	// OldValues and NewValues are the JSONB text of the row before and after the change, nil
	// when the column is NULL.
	OldValues []byte
	NewValues []byte
	ChangedAt time.Time
	// Xid is the writing transaction's id, read by snapshot-delta reads only.
	Xid uint64
	// Unit is the row's unit (see the root package's UnitOf), read by the reads of Shared members only.
	Unit int16
}

// Options say how the documents of an event are built from its row.
type Options struct {
	Field string // Config.DocumentField; empty: the whole value is the document
	// StoreClientDiff: updatedFields is the replaced watcher's diff (diffStoreClient), not
	// diffInto's (Config.StoreClientCompat).
	StoreClientDiff bool
	// Lazy: the documents of a row are not decoded when the event is built, where Decode can
	// vouch for them (Config.RawDocuments); see Raw.
	Lazy bool
}

// Decode is the path of one event: it builds the event document of row (see [Build]), read
// from the watched table, and returns with it what is kept to decode its fullDocument from the
// JSON text later (see [Raw]). missed reports a row whose value has no object under
// opts.Field. With opts.Lazy the documents are not decoded when [lazy] can vouch for them.
func Decode(row *Row, table string, opts Options) (ev map[string]any, raw *Raw, missed bool, err error) {
	if opts.Lazy {
		ev, raw, missed = lazy(row, table, opts)
	}
	if ev == nil {
		ev, missed, err = Build(row, table, opts)
		raw = newRaw(row, table, opts, ev)
	}
	return ev, raw, missed, err
}

// Build turns a changelog row into its change event document (see the root package's Event).
// table is the watched table, reported as ns.coll. If opts.Field is not empty and a decoded old or new
// value holds an object under that field, the inner object is the document (see
// [unwrapDocument]); otherwise the whole value is the document and missed reports it.
//
// Only the columns the operation needs are decoded: new_values for INSERT, both for UPDATE,
// old_values for DELETE, none for an unknown operation. A column that is not NULL must hold a
// JSON object. If one does not, the error names the changelog id and the column, and the
// returned event is still complete except for its document fields (fullDocument is nil), so
// the caller can deliver it instead of stalling on the row.
func Build(row *Row, table string, opts Options) (ev map[string]any, missed bool, err error) {
	ev = make(map[string]any, 8)
	ev["_id"] = map[string]any{"_data": strconv.FormatInt(row.ID, 10)}
	ev["clusterTime"] = row.ChangedAt
	ev["fullDocument"] = nil
	ev["documentKey"] = map[string]any{"_id": row.RecordID}
	ev["ns"] = map[string]any{"coll": table}

	d := documentDecoder{row: row, field: opts.Field, storeClientDiff: opts.StoreClientDiff}
	switch row.Operation {
	case "INSERT":
		ev["operationType"] = "insert"
		var doc map[string]any
		if doc, err = d.document("new_values", row.NewValues); doc != nil {
			ev["fullDocument"] = doc
		}
	case "UPDATE":
		ev["operationType"] = "update"
		err = d.addUpdate(ev)
	case "DELETE":
		ev["operationType"] = "delete"
		var doc map[string]any
		if doc, err = d.document("old_values", row.OldValues); doc != nil {
			ev["fullDocumentBeforeChange"] = doc
		}
	default:
		ev["operationType"] = "unknown"
	}
	return ev, d.missed, err
}

// documentDecoder decodes the JSON columns of one row into documents, unwrapping field.
type documentDecoder struct {
	row             *Row
	field           string // Config.DocumentField; empty: the whole value is the document
	storeClientDiff bool   // see Options
	missed          bool   // a decoded value had no object under field
}

// addUpdate sets fullDocument and, when a field changed, updateDescription for an UPDATE row.
// The diff is taken before the record id is injected into the new document, so an injected
// "id" never shows up as changed. Without old values there is nothing to diff against and no
// updateDescription is set.
func (d *documentDecoder) addUpdate(ev map[string]any) error {
	newDoc, newOuter, err := d.decode("new_values", d.row.NewValues)
	if err != nil || newDoc == nil {
		return err
	}
	oldDoc, _, err := d.decode("old_values", d.row.OldValues)
	if err != nil {
		return err
	}
	if oldDoc != nil {
		updated := make(map[string]any)
		if d.storeClientDiff {
			diffStoreClient(updated, "", false, oldDoc, newDoc)
		} else {
			diffInto(updated, "", oldDoc, newDoc)
		}
		if len(updated) > 0 {
			ev["updateDescription"] = map[string]any{"updatedFields": updated}
		}
	}
	ev["fullDocument"] = unwrapDocument(newDoc, newOuter, d.row.RecordID)
	return nil
}

// document decodes one column into the document to publish. It returns nil for a NULL column
// or an error.
func (d *documentDecoder) document(column string, data []byte) (map[string]any, error) {
	doc, outer, err := d.decode(column, data)
	if err != nil || doc == nil {
		return nil, err
	}
	return unwrapDocument(doc, outer, d.row.RecordID), nil
}

// decode decodes the JSON text of one column and takes the object under d.field. outer is the
// whole value when the inner object was taken, nil otherwise. A NULL column (nil data) gives a
// nil document.
func (d *documentDecoder) decode(column string, data []byte) (doc, outer map[string]any, err error) {
	if data == nil {
		return nil, nil, nil
	}
	id := d.row.ID
	doc, err = UnmarshalObject(data)
	if err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return nil, nil, fmt.Errorf("changelog row %d: %s: not a JSON object: got %s", id, column, typeErr.Value)
		}
		return nil, nil, fmt.Errorf("changelog row %d: %s: invalid JSON: %w", id, column, err)
	}
	if doc == nil {
		return nil, nil, fmt.Errorf("changelog row %d: %s: not a JSON object: got null", id, column)
	}
	if d.field == "" {
		return doc, nil, nil
	}
	if inner, ok := doc[d.field].(map[string]any); ok {
		return inner, doc, nil
	}
	d.missed = true
	return doc, nil, nil
}

// unwrapDocument finishes a document taken from the field of the row's value outer: its "id"
// becomes the record id and, when outer has a created_at column and the document no
// "createdAt", "createdAt" is set to it, as the replaced watcher does for health_events. A
// document not unwrapped (outer nil) is returned as it is. A document taken from created_at
// itself (DocumentField "created_at") is not set into itself, which would make it cyclic.
func unwrapDocument(doc, outer map[string]any, recordID string) map[string]any {
	if outer == nil {
		return doc
	}
	doc["id"] = recordID
	if createdAt, ok := outer["created_at"]; ok && !isMap(createdAt, doc) {
		if _, has := doc["createdAt"]; !has {
			doc["createdAt"] = createdAt
		}
	}
	return doc
}

// isMap reports whether v is the map m itself.
func isMap(v any, m map[string]any) bool {
	vm, ok := v.(map[string]any)
	return ok && reflect.ValueOf(vm).UnsafePointer() == reflect.ValueOf(m).UnsafePointer()
}

// diffInto adds to out every leaf of newDoc that is new or differs from oldDoc, keyed by its
// dotted path under prefix. A leaf is any value other than a non-empty object, so arrays are
// compared whole and an object emptied out is reported as the empty object. A key present only
// in oldDoc is reported with a nil value (a key set to JSON null looks the same); the replaced
// watcher did not report it (see diffStoreClient). oldDoc may be nil.
func diffInto(out map[string]any, prefix string, oldDoc, newDoc map[string]any) {
	for key, newValue := range newDoc {
		oldValue, existed := oldDoc[key]
		if existed && jsonEqual(oldValue, newValue) {
			continue
		}
		path := joinPath(prefix, key)
		if newObj, ok := newValue.(map[string]any); ok && len(newObj) > 0 {
			oldObj, _ := oldValue.(map[string]any)
			diffInto(out, path, oldObj, newObj)
			continue
		}
		out[path] = newValue
	}
	for key := range oldDoc {
		if _, kept := newDoc[key]; !kept {
			out[joinPath(prefix, key)] = nil
		}
	}
}

// diffStoreClient adds to out the leaves of newDoc that the replaced watcher reported as
// updated, keyed by their dotted path under prefix. Nested (below the top level), a key absent
// from oldDoc compares as null. A changed key whose new value is an object is reported by its
// leaves, and an object without leaves (an empty one) not at all; a key removed from the
// document is not reported. oldDoc may be nil.
func diffStoreClient(out map[string]any, prefix string, nested bool, oldDoc, newDoc map[string]any) {
	for key, newValue := range newDoc {
		oldValue, existed := oldDoc[key]
		if (existed || nested) && jsonEqual(oldValue, newValue) {
			continue
		}
		path := joinPath(prefix, key)
		if newObj, ok := newValue.(map[string]any); ok {
			oldObj, _ := oldValue.(map[string]any)
			diffStoreClient(out, path, true, oldObj, newObj)
			continue
		}
		out[path] = newValue
	}
}

// joinPath returns key under the dotted path prefix.
func joinPath(prefix, key string) string {
	if prefix == "" {
		return key
	}
	return prefix + "." + key
}

// jsonEqual reports whether two values decoded by encoding/json are deeply equal.
func jsonEqual(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for key, av := range a {
			bv, ok := b[key]
			if !ok || !jsonEqual(av, bv) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !jsonEqual(a[i], b[i]) {
				return false
			}
		}
		return true
	case json.Number:
		b, ok := b.(json.Number)
		return ok && decimalForm(a) == decimalForm(b)
	default:
		// Decoded scalars (nil, bool, float64, string) are comparable; differing dynamic
		// types compare unequal without panicking (a float64 and a json.Number are never the
		// same number written the way jsonb writes numbers).
		return a == b
	}
}

// decimalForm returns the valid JSON number n written so that numbers of equal value give
// the same text: the sign, the significant digits without leading or trailing zeros, and the
// exponent of the last digit ("1.50e2", "150" and "150.0" all give "+15e1").
func decimalForm(n json.Number) string {
	s := string(n)
	sign := "+"
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	mantissa, exponent, _ := strings.Cut(strings.ToLower(s), "e")
	exp, err := strconv.ParseInt(exponent, 10, 64)
	if err != nil && exponent != "" {
		return string(n) // an exponent beyond int64: compared as written
	}
	whole, fraction, _ := strings.Cut(mantissa, ".")
	exp -= int64(len(fraction))
	digits := strings.TrimLeft(whole+fraction, "0")
	if digits == "" {
		return "0"
	}
	trimmed := strings.TrimRight(digits, "0")
	exp += int64(len(digits) - len(trimmed))
	return sign + trimmed + "e" + strconv.FormatInt(exp, 10)
}
