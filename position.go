package pgchangestream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Position is a place in the changelog: (changed_at, id), ordered by changed_at, then id.
// Reading resumes strictly after a position. changed_at is compared at PostgreSQL's microsecond
// precision.
type Position struct {
	ChangedAt time.Time
	ID        int64
}

// makePosition returns a position with the time cut to microseconds, in UTC and without a
// monotonic clock reading, so that equal database values are equal positions.
func makePosition(changedAt time.Time, id int64) Position {
	return Position{ChangedAt: changedAt.Round(0).Truncate(time.Microsecond).UTC(), ID: id}
}

// Compare returns -1, 0 or +1 as p is before, equal to or after q.
func (p Position) Compare(q Position) int {
	if c := p.ChangedAt.Compare(q.ChangedAt); c != 0 {
		return c
	}
	switch {
	case p.ID < q.ID:
		return -1
	case p.ID > q.ID:
		return 1
	}
	return 0
}

// Before reports whether p is before q.
func (p Position) Before(q Position) bool { return p.Compare(q) < 0 }

// predecessor returns (changed_at, id-1): resuming after it reads p's row again.
func (p Position) predecessor() Position {
	return Position{ChangedAt: p.ChangedAt, ID: p.ID - 1}
}

// String formats the position for logs.
func (p Position) String() string {
	return fmt.Sprintf("(%s, %d)", p.ChangedAt.UTC().Format(time.RFC3339Nano), p.ID)
}

// minPosition returns the earlier of a and b.
func minPosition(a, b Position) Position {
	if b.Before(a) {
		return b
	}
	return a
}

// savedToken is the JSON of a saved token, the format of the existing watcher:
// {"timestamp": "<RFC3339Nano>", "eventID": <id>}. Old tokens carry only eventID.
type savedToken struct {
	Timestamp string      `json:"timestamp,omitempty"`
	EventID   json.Number `json:"eventID"`
}

// encodeToken returns the saved-token JSON for p.
func encodeToken(p Position) []byte {
	b := make([]byte, 0, 64)
	b = append(b, `{"timestamp":"`...)
	b = p.ChangedAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","eventID":`...)
	b = strconv.AppendInt(b, p.ID, 10)
	return append(b, '}')
}

// errTokenNeedsLookup is returned by decodeToken for an id-only token: the position's time must
// be looked up from the changelog row.
var errTokenNeedsLookup = errors.New("token has no timestamp")

// decodeToken parses saved-token JSON. For an id-only token it returns the id with
// errTokenNeedsLookup.
func decodeToken(data []byte) (Position, error) {
	var t savedToken
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&t); err != nil {
		return Position{}, fmt.Errorf("saved token %q is not valid JSON: %w", data, err)
	}
	if t.EventID == "" {
		return Position{}, fmt.Errorf("saved token %q has no eventID", data)
	}
	id, err := strconv.ParseInt(t.EventID.String(), 10, 64)
	if err != nil {
		f, ferr := t.EventID.Float64()
		if ferr != nil || f != float64(int64(f)) {
			return Position{}, fmt.Errorf("saved token %q: eventID is not an integer", data)
		}
		id = int64(f)
	}
	if t.Timestamp == "" {
		return Position{ID: id}, errTokenNeedsLookup
	}
	ts, err := time.Parse(time.RFC3339Nano, t.Timestamp)
	if err != nil {
		return Position{}, fmt.Errorf("saved token %q: timestamp: %w", data, err)
	}
	return makePosition(ts, id), nil
}

// ErrInvalidToken is wrapped by the error MarkProcessed returns for a token that is not a
// decimal int64.
var ErrInvalidToken = errors.New("pgchangestream: invalid resume token")

// parseToken parses a delivery's resume token (a decimal changelog id). ok is false for an empty
// token, which certifies nothing.
func parseToken(token []byte) (id int64, ok bool, err error) {
	if len(token) == 0 {
		return 0, false, nil
	}
	id, err = strconv.ParseInt(string(token), 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("%w %q: want a decimal changelog id", ErrInvalidToken, truncateForError(token))
	}
	return id, true, nil
}

// truncateForError keeps error messages short for long garbage tokens.
func truncateForError(b []byte) []byte {
	const max = 64
	if len(b) > max {
		return append(b[:max:max], "..."...)
	}
	return b
}
