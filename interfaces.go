package pgchangestream

import (
	"context"

	"github.com/pgchangestream/pgchangestream/internal/document"
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
// Event is a map[string]any, and nested documents are plain map[string]any values.
type Event = document.Event

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
