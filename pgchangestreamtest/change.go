package pgchangestreamtest

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/internal/document"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// DefaultChangedAt is the changed_at of a [Change] that has none: changes without a time are
// ordered by their ids alone.
var DefaultChangedAt = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Change is one changelog row, as the capture trigger writes it for an insert, update or
// delete of a watched row. Build one with [Insert], [Update] or [Delete]; set ID or ChangedAt
// where a test needs them.
type Change struct {
	// ID is the changelog id, which is also the delivery's resume token. Zero: the next id,
	// one above the highest given so far.
	ID int64
	// RecordID is the changed row's key (the event's documentKey._id).
	RecordID string
	// Operation is "INSERT", "UPDATE" or "DELETE".
	Operation string
	// OldValues and NewValues are the row before and after the change, as the JSON the
	// trigger stores; nil is NULL.
	OldValues, NewValues json.RawMessage
	// ChangedAt is the writing transaction's start time. Zero: [DefaultChangedAt].
	ChangedAt time.Time
}

// Insert returns the change of a row inserted as doc (any value encoding/json encodes as an
// object).
func Insert(recordID string, doc any) Change {
	return Change{RecordID: recordID, Operation: "INSERT", NewValues: mustJSON(recordID, doc)}
}

// Update returns the change of a row updated from before to after. Its event lists the
// changed fields in updateDescription, as the watcher computes them.
func Update(recordID string, before, after any) Change {
	return Change{RecordID: recordID, Operation: "UPDATE", OldValues: mustJSON(recordID, before), NewValues: mustJSON(recordID, after)}
}

// Delete returns the change of a row deleted while it was before.
func Delete(recordID string, before any) Change {
	return Change{RecordID: recordID, Operation: "DELETE", OldValues: mustJSON(recordID, before)}
}

// mustJSON encodes a test document; a value encoding/json cannot encode is a mistake in the
// test, reported by a panic.
func mustJSON(recordID string, doc any) json.RawMessage {
	b, err := json.Marshal(doc)
	if err != nil {
		panic(fmt.Sprintf("pgchangestreamtest: document of record %q: %v", recordID, err))
	}
	return b
}

// row returns the change as the watcher reads it.
func (c Change) row() *document.Row {
	return &document.Row{ID: c.ID, RecordID: c.RecordID, Operation: c.Operation,
		OldValues: c.OldValues, NewValues: c.NewValues, ChangedAt: c.ChangedAt}
}

// position returns the change's position in the stream.
func (c Change) position() pgchangestream.Position { return position.Make(c.ChangedAt, c.ID) }

// ids gives changes without an id or time the next id and DefaultChangedAt. Ids start at 1.
type ids struct{ next int64 }

// fill completes c and moves the next id past it.
func (n *ids) fill(c Change) Change {
	n.next = max(n.next, 1)
	if c.ID == 0 {
		c.ID = n.next
	}
	if c.ChangedAt.IsZero() {
		c.ChangedAt = DefaultChangedAt
	}
	n.next = max(n.next, c.ID+1)
	return c
}
