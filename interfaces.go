package pgchangestream

import (
	"context"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/document"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// Mode selects how the watcher learns about new changelog rows.
type Mode string

const (
	// ModePolling reads the changelog every [Config.PollInterval].
	ModePolling Mode = "polling"
	// ModeNotify reads when a NOTIFY arrives on [Config.NotifyChannel], and after every LISTEN
	// (re)connect. It needs [Config.ConnString].
	ModeNotify Mode = "notify"
	// ModeHybrid reads on NOTIFY and also polls every [Config.FallbackPollInterval] (jittered), so
	// a silent or broken LISTEN connection only delays events. It is the default. Without
	// [Config.ConnString] it degrades to polling.
	ModeHybrid Mode = "hybrid"
)

// Event is one change as a MongoDB-style change event document:
//
//	{"_id": {"_data": "<changelog id>"}, "operationType": "insert|update|delete",
//	 "clusterTime": time.Time, "fullDocument": {...} (nil for a delete),
//	 "fullDocumentBeforeChange": {...} (a delete only),
//	 "updateDescription": {"updatedFields": {"a.b": v}}, "documentKey": {"_id": "<record id>"},
//	 "ns": {"coll": "<table>"}}
//
// Nested documents are plain map[string]any values.
type Event map[string]any

// EventWithToken is one delivery on [ChangeStreamWatcher.Events].
type EventWithToken struct {
	Event Event
	// ResumeToken is the changelog id in decimal ("452"). Pass it to
	// [ChangeStreamWatcher.MarkProcessed] once the event is processed.
	ResumeToken []byte

	// raw is what the watcher kept to decode fullDocument from the changelog's JSON text (see
	// [EventWithToken.UnmarshalDocument]); nil for events built otherwise. Never written after
	// the event is sent.
	raw *document.Raw
}

// ChangeStreamWatcher is a change stream with per-client resume tokens.
//
// Delivery is at-least-once: after a restart every event after the saved token is delivered
// again, so consumers must be idempotent.
//
// Acknowledgements are cumulative in delivery order, like MongoDB resume tokens and Kafka
// offsets: MarkProcessed(token) acknowledges the earliest outstanding delivery with that token
// and every delivery handed out before it. Callers must therefore ack in delivery order, or ack
// a contiguous watermark (everything up to this event is done). A caller that acks a later event
// while an earlier one is still being worked on certifies the earlier one too; callers that work
// out of order use Watcher.Process, which acks the low-water mark of finished events.
type ChangeStreamWatcher interface {
	// Events returns the channel of deliveries. It is closed when the watcher stops.
	Events() <-chan EventWithToken
	// Start loads the saved token and starts reading. Cancelling ctx stops the watcher.
	Start(ctx context.Context)
	// MarkProcessed acknowledges the delivery with this token and every delivery handed out
	// before it, then saves the checkpoint. It works after Close.
	MarkProcessed(ctx context.Context, token []byte) error
	// Close stops the watcher and waits for its goroutines. It is idempotent.
	Close(ctx context.Context) error
}

// ChangeStreamMetrics reports how far a consumer is behind.
type ChangeStreamMetrics interface {
	// GetUnprocessedEventCount counts the changelog rows of the watched table with an id above
	// lastProcessedID that are not marked processed.
	GetUnprocessedEventCount(ctx context.Context, lastProcessedID string) (int64, error)
}

var (
	_ ChangeStreamWatcher = (*Watcher)(nil)
	_ ChangeStreamMetrics = (*Watcher)(nil)
)

// Position is a place in the change stream. Reading resumes strictly after a position.
//
// On a legacy changelog (no txid column) a position is (changed_at, id), ordered by changed_at,
// then id, with changed_at compared at PostgreSQL's microsecond precision. On an upgraded
// changelog the stream is read in snapshot deltas, each in changelog id order, and a position is
// (delta, id): of the delta's rows, those with an id up to ID are passed (at the start of a
// delta, none). Positions are ordered as the rows are delivered in both cases (see
// Position.Compare). ChangedAt and ID always name the row at (or, between deltas, last read
// before) the position, for logs and tools; Xid names the row's transaction, for logs.
type Position = position.Position

// Observer is told of each changelog read and each checkpoint save once it has ended, for
// tracing: the otel module turns them into spans. Set it as [Config.Observer]; nil (the
// default) costs nothing. Its methods run on the goroutine that did the work (the reader, a
// prefetch of the next batch, the background saver, or the caller of MarkProcessed, Flush or
// Close), never with a lock of the watcher held, and may call the watcher (Stats, Health,
// Flush). They must be safe for concurrent use, should return quickly, since reads and
// acknowledgements wait for them, and must not panic.
type Observer interface {
	// ObserveRead is called after each query of changelog rows ([ReadObservation]), with the
	// watcher's context, which Close cancels.
	ObserveRead(ctx context.Context, r ReadObservation)
	// ObserveSave is called after each write of the checkpoint to the token table
	// ([SaveObservation]), with the context of the call that saved (MarkProcessed, Flush,
	// Close) or, for the background saver, the watcher's. A save that has nothing to write
	// is not observed, nor is the start position of a new client, written by the load.
	ObserveSave(ctx context.Context, s SaveObservation)
}

// ReadObservation is one query of changelog rows: a batch after From.
type ReadObservation struct {
	// Start is when the query began; Duration how long it took, rows included.
	Start    time.Time
	Duration time.Duration
	// From is the position the rows follow.
	From Position
	// Rows is the number of rows read.
	Rows int
	// Err is the query's failure, or nil.
	Err error
}

// SaveObservation is one write of the checkpoint to the token table.
type SaveObservation struct {
	// Start is when the write began; Duration how long it took.
	Start    time.Time
	Duration time.Duration
	// Checkpoint is the position written.
	Checkpoint Position
	// Err is the write's failure, or nil. It is the error the save returns (a [ErrFenced] or
	// [ErrServerRecovered] refusal included).
	Err error
}
