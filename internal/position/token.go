package position

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
)

// savedToken is the JSON of a saved token. The existing watcher's format is
// {"timestamp": "<RFC3339Nano>", "eventID": <id>}, and old tokens carry only eventID: both mean
// "resume after the legacy position (timestamp, eventID)". An upgraded changelog adds fields that
// let a restart resume exactly, while timestamp and eventID keep naming the last row passed, so
// tools that read them and a rollback to the old watcher keep working:
//
//   - "snapshot": every row this pg_snapshot sees, and every row written before the upgrade, is
//     passed. With "deltaEnd" and "deltaAfterID" the token is inside the delta from snapshot to
//     deltaEnd: of its rows, those with an id up to deltaAfterID (the eventID) are passed too.
//     Earlier releases read deltas in (txid, id) order and wrote "deltaEnd", "deltaXid" and
//     "deltaID" instead; such a token resumes at the start of its delta (replaying the rows it
//     passed there, never skipping), and those releases refuse a token with deltaEnd and no
//     deltaXid, rather than misread it.
//   - "switchover": the client is switching over from a legacy token: of the rows this
//     pg_snapshot sees (and those written before the upgrade), the ones up to the legacy
//     position (timestamp, eventID) are passed; no row it does not see is passed.
//
// "table" names the table the client reads (the changelog's table_name): a token certifies
// nothing about the rows of other tables, so the admin package's Prune lets them go. Tokens without it (written
// by older watchers) count for every table.
type savedToken struct {
	Timestamp  string      `json:"timestamp,omitempty"`
	EventID    json.Number `json:"eventID"`
	Snapshot   string      `json:"snapshot,omitempty"`
	DeltaEnd   string      `json:"deltaEnd,omitempty"`
	DeltaAfter json.Number `json:"deltaAfterID,omitempty"`
	DeltaXid   string      `json:"deltaXid,omitempty"` // earlier releases' (txid, id) order
	DeltaID    json.Number `json:"deltaID,omitempty"`
	Switchover string      `json:"switchover,omitempty"`
	Table      string      `json:"table,omitempty"`
}

// EncodeToken returns the saved-token JSON for p, a position of the client of table ("": none
// recorded).
func EncodeToken(p Position, table string) []byte {
	b := make([]byte, 0, 96)
	b = append(b, `{"timestamp":"`...)
	b = p.ChangedAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","eventID":`...)
	b = strconv.AppendInt(b, p.ID, 10)
	switch {
	case p.Span == nil:
	case p.Span.Seq == 0:
		b = appendField(b, "switchover", p.Span.Base.String())
	default:
		b = appendField(b, "snapshot", p.Span.Base.String())
		if p.InRows {
			b = appendField(b, "deltaEnd", p.Span.End.String())
			b = append(b, `,"deltaAfterID":`...)
			b = strconv.AppendInt(b, p.ID, 10)
		}
	}
	if table != "" {
		name, _ := json.Marshal(table) // a string always marshals
		b = append(b, `,"table":`...)
		b = append(b, name...)
	}
	return append(b, '}')
}

// appendField appends ,"name":"value" for a value that needs no escaping.
func appendField(b []byte, name, value string) []byte {
	b = append(b, `,"`...)
	b = append(b, name...)
	b = append(b, `":"`...)
	b = append(b, value...)
	return append(b, '"')
}

// ErrInvalidToken is wrapped by the error MarkProcessed returns for a token that is not a
// decimal int64.
var ErrInvalidToken = errors.New("pgchangestream: invalid resume token")

// ErrTokenNeedsLookup is returned by DecodeToken for an id-only token: the position's time must
// be looked up from the changelog row.
var ErrTokenNeedsLookup = errors.New("token has no timestamp")

// DecodeToken parses saved-token JSON. For an id-only token it returns the id with
// ErrTokenNeedsLookup.
func DecodeToken(data []byte) (Position, error) {
	p, _, err := DecodeTableToken(data)
	return p, err
}

// DecodeTableToken is DecodeToken that also returns the table the token records ("" for none).
func DecodeTableToken(data []byte) (Position, string, error) {
	var t savedToken
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&t); err != nil {
		return Position{}, "", fmt.Errorf("saved token %q is not valid JSON: %w", data, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Position{}, t.Table, fmt.Errorf("saved token %q has data after its JSON object", data)
	}
	p, err := t.position(data)
	return p, t.Table, err
}

// position returns the position of a decoded token; data is its JSON, for messages.
func (t savedToken) position(data []byte) (Position, error) {
	if t.EventID == "" {
		return Position{}, fmt.Errorf("saved token %q has no eventID", data)
	}
	id, err := savedID(t.EventID)
	if err != nil {
		return Position{}, fmt.Errorf("saved token %q: eventID: %w", data, err)
	}
	if t.Timestamp == "" {
		if t.Snapshot != "" || t.Switchover != "" {
			return Position{}, fmt.Errorf("saved token %q has a snapshot but no timestamp", data)
		}
		return Position{ID: id}, ErrTokenNeedsLookup
	}
	ts, err := time.Parse(time.RFC3339Nano, t.Timestamp)
	if err != nil {
		return Position{}, fmt.Errorf("saved token %q: timestamp: %w", data, err)
	}
	p := Make(ts, id)
	if err := t.decodeSpan(&p); err != nil {
		return Position{}, fmt.Errorf("saved token %q: %w", data, err)
	}
	return p, nil
}

// decodeSpan sets the snapshot part of p from the token's fields.
func (t savedToken) decodeSpan(p *Position) error {
	switch {
	case t.Switchover != "":
		if t.Snapshot != "" || t.hasDelta() {
			return errors.New("switchover goes with no snapshot, deltaEnd, deltaAfterID, deltaXid or deltaID")
		}
		s, err := ParseSnapshot(t.Switchover)
		if err != nil {
			return fmt.Errorf("switchover: %w", err)
		}
		p.Span = &Span{Base: s}
	case t.Snapshot != "":
		s, err := ParseSnapshot(t.Snapshot)
		if err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		p.Span = &Span{Seq: 1, Base: s}
		return t.decodeDelta(p)
	case t.hasDelta():
		return errors.New("deltaEnd, deltaAfterID, deltaXid and deltaID need a snapshot")
	}
	return nil
}

// hasDelta reports whether the token has a field of a position inside a delta.
func (t savedToken) hasDelta() bool {
	return t.DeltaEnd != "" || t.DeltaAfter != "" || t.DeltaXid != "" || t.DeltaID != ""
}

// decodeDelta sets the position inside a delta, if the token has one.
func (t savedToken) decodeDelta(p *Position) error {
	older := t.DeltaXid != "" || t.DeltaID != ""
	if t.DeltaEnd == "" && t.DeltaAfter == "" && !older {
		return nil
	}
	if t.DeltaEnd == "" {
		return errors.New("deltaAfterID, deltaXid and deltaID need a deltaEnd")
	}
	e, err := ParseSnapshot(t.DeltaEnd)
	if err != nil {
		return fmt.Errorf("deltaEnd: %w", err)
	}
	b := p.Span.Base
	if e.Xmax < b.Xmax {
		return fmt.Errorf("deltaEnd %s is before snapshot %s", e, b)
	}
	p.Span.End, p.Span.HasEnd = e, true
	if older {
		return t.checkOlderDelta(b, e)
	}
	if t.DeltaAfter == "" {
		return errors.New("deltaEnd needs deltaAfterID")
	}
	id, err := savedID(t.DeltaAfter)
	if err != nil {
		return fmt.Errorf("deltaAfterID: %w", err)
	}
	if id != p.ID {
		return fmt.Errorf("deltaAfterID %d is not the eventID %d", id, p.ID)
	}
	p.InRows = true
	return nil
}

// checkOlderDelta checks the in-delta fields an earlier release wrote, in (txid, id) order. The
// position they name cannot be placed in id order, so the token resumes at the start of its
// delta (from snapshot to deltaEnd): the caller leaves p there.
func (t savedToken) checkOlderDelta(b, e Snapshot) error {
	if t.DeltaAfter != "" {
		return errors.New("deltaAfterID goes without deltaXid and deltaID")
	}
	if t.DeltaXid == "" || t.DeltaID == "" {
		return errors.New("deltaEnd, deltaXid and deltaID go together")
	}
	x, err := strconv.ParseUint(t.DeltaXid, 10, 64)
	if err != nil {
		return fmt.Errorf("deltaXid: %w", err)
	}
	if _, err := savedID(t.DeltaID); err != nil {
		return fmt.Errorf("deltaID: %w", err)
	}
	if x < FirstNormalXid || e.Running(x) || !b.Running(x) {
		return fmt.Errorf("deltaXid %d is not in the delta from %s to %s", x, b, e)
	}
	return nil
}

// savedID parses a changelog id of a saved token, accepting the float form JSON writers
// produce, and refusing a negative one (ids count from 1; 0 is before every row).
func savedID(n json.Number) (int64, error) {
	id, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil {
		f, ferr := n.Float64()
		if ferr != nil || f != float64(int64(f)) {
			return 0, errors.New("not an integer")
		}
		id = int64(f)
	}
	if id < 0 {
		return 0, fmt.Errorf("%d is negative", id)
	}
	return id, nil
}

// FormatToken returns the resume token for a changelog id: the id in decimal, e.g.
// []byte("452"). It allocates once.
func FormatToken(id int64) []byte {
	// 20 bytes hold any int64, including "-9223372036854775808".
	return strconv.AppendInt(make([]byte, 0, 20), id, 10)
}

// ParseToken parses a delivery's resume token (a decimal changelog id). ok is false for an empty
// token, which certifies nothing.
func ParseToken(token []byte) (id int64, ok bool, err error) {
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

// Token returns the saved-token JSON of p for a client of table ("": none recorded): what a
// watcher saves at p, and what the admin package's ResetToken saves for a client of table.
func (p Position) Token(table string) string { return string(EncodeToken(p, table)) }
