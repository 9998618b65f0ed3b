package procface

import (
	"context"

	"github.com/pgchangestream/pgchangestream/internal/deadletter"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

// ParkedStore is a client's dead-letter table as Process uses it: the watcher's (fenced as its
// saves are) or the test kit's in-memory one.
type ParkedStore interface {
	// Park inserts p (ID and ParkedAt are filled by the store) and returns its id.
	Park(ctx context.Context, p deadletter.Event) (int64, error)
	// BlockedKeys returns the keys that have a Blocking parked event.
	BlockedKeys(ctx context.Context) ([]string, error)
	// Released returns the parked events an operator asked to retry, oldest first, at most limit.
	Released(ctx context.Context, limit int) ([]deadletter.Event, error)
	// KeyEvents returns every parked event of key, oldest first.
	KeyEvents(ctx context.Context, key string) ([]deadletter.Event, error)
	// Repark records a failed rerun of a parked event: new error and attempts, RetryRequested cleared.
	Repark(ctx context.Context, id int64, attempts int, errText string) error
	// Finish deletes a parked event that ran successfully.
	Finish(ctx context.Context, id int64) error
}

// BlockedKeyError is the Error of an event parked without running because an earlier parked
// event blocks its key.
const BlockedKeyError = "not run: an earlier event of its key is parked under BlockOnFailure"

// Events are what the dead-letter adapter needs of the event type E: its document and its
// resume token, and an event made of both.
type Events[E any] struct {
	Doc   func(E) map[string]any
	Token func(E) []byte
	Make  func(doc map[string]any, token []byte) E
}

// DeadLetters adapts a client's ParkedStore to the engine's store.
type DeadLetters[E any] struct {
	Client string
	Store  ParkedStore
	Events Events[E]
}

var _ procrun.Store[struct{}] = DeadLetters[struct{}]{}

// Park parks j after its last failure, or without running it (BlockedKeyError).
func (d DeadLetters[E]) Park(ctx context.Context, j *procrun.Job[E], blocking bool) error {
	id, _, _ := position.ParseToken(d.Events.Token(j.Ev))
	errText := BlockedKeyError
	if j.LastErr != nil {
		errText = j.LastErr.Error()
	}
	doc := d.Events.Doc(j.Ev)
	_, err := d.Store.Park(ctx, deadletter.Event{Client: d.Client, Key: j.Key, Table: Table(doc), ChangelogID: id,
		Event: doc, Error: errText, Attempts: j.Attempts, Blocking: blocking})
	return err
}

// BlockedKeys returns the keys held by a blocking parked event.
func (d DeadLetters[E]) BlockedKeys(ctx context.Context) ([]string, error) {
	return d.Store.BlockedKeys(ctx)
}

// Released returns the parked events released for a rerun.
func (d DeadLetters[E]) Released(ctx context.Context, limit int) ([]procrun.Parked[E], error) {
	ps, err := d.Store.Released(ctx, limit)
	return d.toParked(ps), err
}

// KeyEvents returns the parked events of key.
func (d DeadLetters[E]) KeyEvents(ctx context.Context, key string) ([]procrun.Parked[E], error) {
	ps, err := d.Store.KeyEvents(ctx, key)
	return d.toParked(ps), err
}

// Repark records a failed rerun.
func (d DeadLetters[E]) Repark(ctx context.Context, j *procrun.Job[E]) error {
	return d.Store.Repark(ctx, j.Parked, j.Attempts, j.LastErr.Error())
}

// Finish deletes a parked event that ran successfully.
func (d DeadLetters[E]) Finish(ctx context.Context, id int64) error { return d.Store.Finish(ctx, id) }

// toParked turns parked rows into reruns: the event as delivered, with its token.
func (d DeadLetters[E]) toParked(ps []deadletter.Event) []procrun.Parked[E] {
	out := make([]procrun.Parked[E], len(ps))
	for i, p := range ps {
		out[i] = procrun.Parked[E]{ID: p.ID, Key: p.Key, Blocking: p.Blocking,
			Ev: d.Events.Make(p.Event, position.FormatToken(p.ChangelogID))}
	}
	return out
}

// Table returns an event document's ns.coll, or "".
func Table(doc map[string]any) string {
	ns, _ := doc["ns"].(map[string]any)
	table, _ := ns["coll"].(string)
	return table
}
