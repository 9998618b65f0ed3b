package admin

import (
	"context"
	"database/sql"

	"github.com/pgchangestream/pgchangestream/internal/deadletter"
)

// ParkedEvent is one event in the dead-letter table of a client, the root package's
// ParkedEvent (its comment lists the fields).
type ParkedEvent = deadletter.Event

// parked validates opts and returns the dead-letter table of client.
func parked(db *sql.DB, client string, opts Options) (*deadletter.Store, error) {
	log, err := opts.changelogTable()
	if err != nil {
		return nil, err
	}
	return deadletter.New(db, log, client), nil
}

// ListParked returns the parked events of client (of every client when client is ""), oldest
// first. Events are parked by the watcher's Process under ParkOnFailure and BlockOnFailure.
func ListParked(ctx context.Context, db *sql.DB, client string, opts Options) ([]ParkedEvent, error) {
	s, err := parked(db, client, opts)
	if err != nil {
		return nil, err
	}
	return s.List(ctx)
}

// RetryParked asks the running Process of client to run the parked event id again, at its next
// look at the dead-letter table (ProcessOptions.ParkedPollInterval): the Process of the watcher
// that owns the event (not an exclusive standby; with Config.Shared, the member owning its
// range). For an event parked under BlockOnFailure it releases the event's key: every parked
// event of the key runs again, in the order they were parked, and the key's new events run
// after them; if one fails again it is parked again and holds the key. It returns an error
// wrapping pgchangestream.ErrNotParked when the client has no parked event id.
func RetryParked(ctx context.Context, db *sql.DB, client string, id int64, opts Options) error {
	s, err := parked(db, client, opts)
	if err != nil {
		return err
	}
	return s.Request(ctx, id)
}

// DropParked deletes the parked event id of client without running it again. A key held under
// BlockOnFailure stays held while it has other parked events (release it with [RetryParked]);
// once the last is dropped, Process lets the key's new events run. It returns an error
// wrapping pgchangestream.ErrNotParked when the client has no parked event id.
func DropParked(ctx context.Context, db *sql.DB, client string, id int64, opts Options) error {
	s, err := parked(db, client, opts)
	if err != nil {
		return err
	}
	return s.Drop(ctx, id)
}
