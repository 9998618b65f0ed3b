// Package testhooks hands the test kit (package pgchangestreamtest) the parts of the watcher it
// shares and the library does not export: the SQL statements of a configuration, the event
// builder, the token parsers, the position functions and Process's runtime. The root package
// registers them in an init function, so the kit follows the watcher's code instead of copying
// it, and the public API stays as it is. Nothing but the root package and the kit imports this package.
package testhooks

import (
	"context"
	"log/slog"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

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

// ParkedStore is a client's dead-letter table as the kit keeps it in memory, with the methods of
// the watcher's table. P is the watcher's ParkedEvent.
type ParkedStore[P any] interface {
	// Park inserts p (the store fills its ID and ParkedAt) and returns its id.
	Park(ctx context.Context, p P) (int64, error)
	// BlockedKeys returns the keys that have a blocking parked event.
	BlockedKeys(ctx context.Context) ([]string, error)
	// Released returns the parked events an operator asked to retry, oldest first, at most limit.
	Released(ctx context.Context, limit int) ([]P, error)
	// KeyEvents returns every parked event of key, oldest first.
	KeyEvents(ctx context.Context, key string) ([]P, error)
	// Repark records a failed rerun: its attempts and error, and clears the retry request.
	Repark(ctx context.Context, id int64, attempts int, errText string) error
	// Finish deletes a parked event that ran successfully.
	Finish(ctx context.Context, id int64) error
}

// Engine is the watcher's Process runtime without a database: the kit's fake runs its Process
// on one. O is ProcessOptions, H Handler, E EventWithToken and S ProcessStats.
type Engine[O, H, E, S any] interface {
	// Run runs the engine over src until ctx ends, src closes or an event fails under
	// StopOnFailure, as Process does before its final save. store is nil under StopOnFailure;
	// advance is told of each advance of the low-water mark, on the engine's goroutine.
	Run(ctx context.Context, src <-chan E, o O, handle H, store procrun.Store[E], advance func(E)) error
	// Stats returns the counters of the engine's runs.
	Stats() S
}

// Process are the parts of the watcher's Process the kit shares. P is ParkedEvent.
type Process[O, H, E, P, S any] struct {
	// Check fills in the options' defaults, or says why Process refuses them and the handler.
	Check func(O, H) (O, error)
	// NewEngine returns an engine that logs to log.
	NewEngine func(log *slog.Logger) Engine[O, H, E, S]
	// DeadLetters returns the engine's dead-letter store over a client's parked events.
	DeadLetters func(client string, s ParkedStore[P]) procrun.Store[E]
}

var registeredProcess any

// RegisterProcess records the Process hooks; the root package calls it once, from init.
func RegisterProcess[O, H, E, P, S any](p Process[O, H, E, P, S]) { registeredProcess = p }

// GetProcess returns the registered Process hooks.
func GetProcess[O, H, E, P, S any]() Process[O, H, E, P, S] {
	p, ok := registeredProcess.(Process[O, H, E, P, S])
	if !ok {
		panic("testhooks: the watcher's Process hooks are not registered")
	}
	return p
}
