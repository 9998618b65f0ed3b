package pgchangestream

import (
	"context"
	"time"
)

// ParkedEvent is one event in the dead-letter table of a client.
type ParkedEvent struct {
	ID             int64 // the parked row's id
	Client         string
	Key            string
	Table          string // ns.coll of the event
	ChangelogID    int64  // the changelog id (the resume token)
	Event          Event  // the document as delivered
	Error          string // the last handler error
	Attempts       int
	Blocking       bool // parked under BlockOnFailure: holds its key
	RetryRequested bool // an operator asked to run it again
	ParkedAt       time.Time
}

// parkedStore is the dead-letter table of one client, as Process uses it.
type parkedStore interface {
	// park inserts p (ID and ParkedAt are filled by the store) and returns its id.
	park(ctx context.Context, p ParkedEvent) (int64, error)
	// blockedKeys returns the keys that have a Blocking parked event.
	blockedKeys(ctx context.Context) ([]string, error)
	// released returns the parked events an operator asked to retry, oldest first, at most limit.
	released(ctx context.Context, limit int) ([]ParkedEvent, error)
	// keyEvents returns every parked event of key, oldest first.
	keyEvents(ctx context.Context, key string) ([]ParkedEvent, error)
	// repark records a failed rerun of a parked event: new error and attempts, RetryRequested cleared.
	repark(ctx context.Context, id int64, attempts int, errText string) error
	// finish deletes a parked event that ran successfully.
	finish(ctx context.Context, id int64) error
}
