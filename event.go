package pgchangestream

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// changelogRow is one row of the changelog as read by the watcher.
type changelogRow struct {
	ID       int64
	RecordID string
	// Operation is "INSERT", "UPDATE" or "DELETE"; anything else becomes operationType "unknown".
	Operation string
	// OldValues and NewValues are the JSONB text of the row before and after the change, nil
	// when the column is NULL.
	OldValues []byte
	NewValues []byte
	ChangedAt time.Time
}

// buildEvent turns a changelog row into its change event document (see [Event]). table is the
// watched table, reported as ns.coll. If documentField is not empty and a decoded old or new
// value holds an object under that field, the inner object is the document and its "id" is set
// to the row's record id; otherwise the whole value is the document.
//
// Only the columns the operation needs are decoded: new_values for INSERT, both for UPDATE,
// old_values for DELETE, none for an unknown operation. A column that is not NULL must hold a
// JSON object. If one does not, the error names the changelog id and the column, and the
// returned event is still complete except for its document fields (fullDocument is nil), so
// the caller can deliver it instead of stalling on the row.
func buildEvent(row *changelogRow, table, documentField string) (Event, error) {
	ev := make(Event, 8)
	ev["_id"] = map[string]any{"_data": strconv.FormatInt(row.ID, 10)}
	ev["clusterTime"] = row.ChangedAt
	ev["fullDocument"] = nil
	ev["documentKey"] = map[string]any{"_id": row.RecordID}
	ev["ns"] = map[string]any{"coll": table}

	var err error
	switch row.Operation {
	case "INSERT":
		ev["operationType"] = "insert"
		var doc map[string]any
		if doc, err = decodeDocument(row, "new_values", row.NewValues, documentField); doc != nil {
			ev["fullDocument"] = doc
		}
	case "UPDATE":
		ev["operationType"] = "update"
		err = addUpdate(ev, row, documentField)
	case "DELETE":
		ev["operationType"] = "delete"
		var doc map[string]any
		if doc, err = decodeDocument(row, "old_values", row.OldValues, documentField); doc != nil {
			ev["fullDocumentBeforeChange"] = doc
		}
	default:
		ev["operationType"] = "unknown"
	}
	return ev, err
}

// addUpdate sets fullDocument and, when a field changed, updateDescription for an UPDATE row.
// The diff is taken before the record id is injected into the new document, so an injected
// "id" never shows up as changed. Without old values there is nothing to diff against and no
// updateDescription is set.
func addUpdate(ev Event, row *changelogRow, documentField string) error {
	newDoc, newUnwrapped, err := decodeColumn(row.ID, "new_values", row.NewValues, documentField)
	if err != nil || newDoc == nil {
		return err
	}
	oldDoc, _, err := decodeColumn(row.ID, "old_values", row.OldValues, documentField)
	if err != nil {
		return err
	}
	if oldDoc != nil {
		updated := make(map[string]any)
		diffInto(updated, "", oldDoc, newDoc)
		if len(updated) > 0 {
			ev["updateDescription"] = map[string]any{"updatedFields": updated}
		}
	}
	if newUnwrapped {
		newDoc["id"] = row.RecordID
	}
	ev["fullDocument"] = newDoc
	return nil
}

// decodeDocument decodes one column into the document to publish, with the record id injected
// when the document was unwrapped from documentField. It returns nil for a NULL column or an
// error.
func decodeDocument(row *changelogRow, column string, data []byte, documentField string) (map[string]any, error) {
	doc, unwrapped, err := decodeColumn(row.ID, column, data, documentField)
	if err != nil {
		return nil, err
	}
	if unwrapped {
		doc["id"] = row.RecordID
	}
	return doc, nil
}

// decodeColumn decodes the JSONB text of one column and unwraps documentField. unwrapped
// reports whether the inner object was taken. A NULL column (nil data) gives a nil document.
func decodeColumn(
	id int64, column string, data []byte, documentField string,
) (doc map[string]any, unwrapped bool, err error) {
	if data == nil {
		return nil, false, nil
	}
	doc, err = unmarshalObject(data)
	if err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return nil, false, fmt.Errorf("changelog row %d: %s: not a JSON object: got %s", id, column, typeErr.Value)
		}
		return nil, false, fmt.Errorf("changelog row %d: %s: invalid JSON: %w", id, column, err)
	}
	if doc == nil {
		return nil, false, fmt.Errorf("changelog row %d: %s: not a JSON object: got null", id, column)
	}
	if documentField != "" {
		if inner, ok := doc[documentField].(map[string]any); ok {
			return inner, true, nil
		}
	}
	return doc, false, nil
}

// diffInto adds to out every leaf of newDoc that is new or differs from oldDoc, keyed by its
// dotted path under prefix. A leaf is any value other than a non-empty object, so arrays are
// compared whole and an object emptied out is reported as the empty object. Keys present only
// in oldDoc are not reported. oldDoc may be nil.
func diffInto(out map[string]any, prefix string, oldDoc, newDoc map[string]any) {
	for key, newValue := range newDoc {
		oldValue, existed := oldDoc[key]
		if existed && jsonEqual(oldValue, newValue) {
			continue
		}
		path := key
		if prefix != "" {
			path = prefix + "." + key
		}
		if newObj, ok := newValue.(map[string]any); ok && len(newObj) > 0 {
			oldObj, _ := oldValue.(map[string]any)
			diffInto(out, path, oldObj, newObj)
			continue
		}
		out[path] = newValue
	}
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
	default:
		// Decoded scalars (nil, bool, float64, string) are comparable; differing dynamic
		// types compare unequal without panicking.
		return a == b
	}
}

// formatToken returns the resume token for a changelog id: the id in decimal, e.g.
// []byte("452"). It allocates once.
func formatToken(id int64) []byte {
	// 20 bytes hold any int64, including "-9223372036854775808".
	return strconv.AppendInt(make([]byte, 0, 20), id, 10)
}
