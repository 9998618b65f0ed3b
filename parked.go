package pgchangestream

import (
	"context"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/procrun"
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

// blockedKeyError is the Error of an event parked without running because an earlier parked
// event blocks its key.
const blockedKeyError = "not run: an earlier event of its key is parked under BlockOnFailure"

// deadLetters adapts a parkedStore to the processing engine's store.
type deadLetters struct {
	client string
	s      parkedStore
}

var _ procrun.Store[EventWithToken] = deadLetters{}

func (d deadLetters) Park(ctx context.Context, j *procrun.Job[EventWithToken], blocking bool) error {
	id, _, _ := parseToken(j.Ev.ResumeToken)
	errText := blockedKeyError
	if j.LastErr != nil {
		errText = j.LastErr.Error()
	}
	_, err := d.s.park(ctx, ParkedEvent{Client: d.client, Key: j.Key, Table: eventTable(j.Ev), ChangelogID: id,
		Event: j.Ev.Event, Error: errText, Attempts: j.Attempts, Blocking: blocking})
	return err
}

func (d deadLetters) BlockedKeys(ctx context.Context) ([]string, error) { return d.s.blockedKeys(ctx) }

func (d deadLetters) Released(ctx context.Context, limit int) ([]procrun.Parked[EventWithToken], error) {
	ps, err := d.s.released(ctx, limit)
	return toParked(ps), err
}

func (d deadLetters) KeyEvents(ctx context.Context, key string) ([]procrun.Parked[EventWithToken], error) {
	ps, err := d.s.keyEvents(ctx, key)
	return toParked(ps), err
}

func (d deadLetters) Repark(ctx context.Context, j *procrun.Job[EventWithToken]) error {
	return d.s.repark(ctx, j.Parked, j.Attempts, j.LastErr.Error())
}

func (d deadLetters) Finish(ctx context.Context, id int64) error { return d.s.finish(ctx, id) }

// toParked turns parked rows into reruns: the event as delivered, with its token.
func toParked(ps []ParkedEvent) []procrun.Parked[EventWithToken] {
	out := make([]procrun.Parked[EventWithToken], len(ps))
	for i, p := range ps {
		out[i] = procrun.Parked[EventWithToken]{ID: p.ID, Key: p.Key, Blocking: p.Blocking,
			Ev: EventWithToken{Event: p.Event, ResumeToken: formatToken(p.ChangelogID)}}
	}
	return out
}
