// Package testhooks hands the test kit (package pgchangestreamtest) the parts of the watcher it
// shares and the library does not export: the SQL statements of a configuration, the event
// builder, the token parsers and the position functions. The root package registers them in an
// init function, so the kit follows the watcher's code instead of copying it, and the public API
// stays as it is. Nothing but the root package and the kit imports this package.
package testhooks

import "time"

// Statements are the SQL statements of one watcher configuration, exactly as the watcher sends
// them.
type Statements struct {
	// Detect asks whether the changelog has the txid column and whether its incarnation table
	// exists; its arguments are DetectArg, the changelog's quoted name, and DetectIncArg, the
	// incarnation table's.
	Detect, DetectArg, DetectIncArg string
	// DeltaStart returns the current snapshot and the newest txid of the table (upgraded
	// changelogs, at start-up).
	DeltaStart string
	// LoadToken, SaveToken: the saved token alone.
	LoadToken, SaveToken string
	// AckTx: MarkProcessedTx's write of the token in the caller's transaction (unfenced, with
	// no incarnation check).
	AckTx string
	// Newest: the start position of a client without a saved token.
	Newest string
	// TableCheck: the start-up check that some changelog row or trigger has the table name.
	TableCheck string
	// Read: the next batch after a legacy position.
	Read string
	// Snapshot and DeltaRange: the end snapshot of a delta, and the first page of a delta read
	// as one range (the mock's snapshots have no running transactions, so every delta is one).
	Snapshot, DeltaRange string
	// Unprocessed: GetUnprocessedEventCount.
	Unprocessed string
}

// Row is one changelog row as the watcher reads it.
type Row struct {
	ID        int64
	RecordID  string
	Operation string
	OldValues []byte // JSON text; nil: NULL
	NewValues []byte
	ChangedAt time.Time
}

// Hooks are the watcher's functions the kit shares. C is the watcher's Config and P its
// Position.
type Hooks[C, P any] struct {
	// Defaults fills the zero fields of a configuration with their defaults.
	Defaults func(C) C
	// Statements returns the statements of a configuration (defaults filled in).
	Statements func(C) Statements
	// MakePosition returns the legacy position of a row.
	MakePosition func(changedAt time.Time, id int64) P
	// Predecessor returns the position just before a position's row.
	Predecessor func(P) P
	// DecodeToken parses a saved token's JSON.
	DecodeToken func([]byte) (P, error)
	// ParseToken parses a delivery's resume token; ok is false for an empty token.
	ParseToken func([]byte) (id int64, ok bool, err error)
	// BuildEvent returns the change event document of a row.
	BuildEvent func(row Row, table, documentField string) (map[string]any, error)
}

var registered any

// Register records the hooks; the root package calls it once, from init.
func Register[C, P any](h Hooks[C, P]) { registered = h }

// Get returns the registered hooks.
func Get[C, P any]() Hooks[C, P] {
	h, ok := registered.(Hooks[C, P])
	if !ok {
		panic("testhooks: the watcher's hooks are not registered")
	}
	return h
}
