package storeclient_test

import (
	"context"
	"sync"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/internal/storeclient/client"
	"github.com/pgchangestream/pgchangestream/internal/storeclient/datastore"
)

// DatastoreWatcher is a pgchangestream watcher as a datastore.ChangeStreamWatcher. The embedded
// watcher provides Start, MarkProcessed, LagState and GetUnprocessedEventCount.
type DatastoreWatcher struct {
	*pgchangestream.Watcher
	events <-chan datastore.EventWithToken
	stop   func()
}

// NewDatastoreWatcher adapts w. Read events only through the adapter.
func NewDatastoreWatcher(w *pgchangestream.Watcher) *DatastoreWatcher {
	events, stop := convert(w.Events(), func(ev pgchangestream.EventWithToken) datastore.EventWithToken {
		return datastore.EventWithToken{Event: datastore.Event(ev.Event), ResumeToken: ev.ResumeToken}
	})
	return &DatastoreWatcher{Watcher: w, events: events, stop: stop}
}

// Events returns the deliveries.
func (d *DatastoreWatcher) Events() <-chan datastore.EventWithToken { return d.events }

// Close stops the watcher, which saves the checkpoint.
func (d *DatastoreWatcher) Close(ctx context.Context) error {
	d.stop()
	return d.Watcher.Close(ctx)
}

// ClientWatcher is a pgchangestream watcher as a client.ChangeStreamWatcher: its events are
// pgchangestream.EventWithToken values, which have the client.Event methods.
type ClientWatcher struct {
	*pgchangestream.Watcher
	events <-chan client.Event
	stop   func()
}

// NewClientWatcher adapts w. Read events only through the adapter.
func NewClientWatcher(w *pgchangestream.Watcher) *ClientWatcher {
	events, stop := convert(w.Events(), func(ev pgchangestream.EventWithToken) client.Event { return ev })
	return &ClientWatcher{Watcher: w, events: events, stop: stop}
}

// Events returns the deliveries.
func (c *ClientWatcher) Events() <-chan client.Event { return c.events }

// Close stops the watcher, which saves the checkpoint.
func (c *ClientWatcher) Close(ctx context.Context) error {
	c.stop()
	return c.Watcher.Close(ctx)
}

// convert relays in through f until in closes or stop is called. An event dropped by stop was
// never acknowledged, so it is delivered again after a restart.
func convert[T any](in <-chan pgchangestream.EventWithToken, f func(pgchangestream.EventWithToken) T) (<-chan T, func()) {
	out, done := make(chan T), make(chan struct{})
	go func() {
		defer close(out)
		for ev := range in {
			select {
			case out <- f(ev):
			case <-done:
				return
			}
		}
	}()
	return out, sync.OnceFunc(func() { close(done) })
}

// MatchFilter compiles a store-client pipeline into a pgchangestream.Config Filter.
func MatchFilter(p datastore.Pipeline) (func(pgchangestream.Event) bool, error) {
	stages := make([]map[string]any, len(p))
	for i, stage := range p {
		stages[i] = plain(stage).(map[string]any)
	}
	return pgchangestream.MatchFilter(stages)
}

// plain turns datastore documents and arrays into the maps and slices MatchFilter reads.
func plain(v any) any {
	switch v := v.(type) {
	case datastore.Document:
		m := make(map[string]any, len(v))
		for _, e := range v {
			m[e.Key] = plain(e.Value)
		}
		return m
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[k] = plain(x)
		}
		return m
	case datastore.Array:
		return plain([]any(v))
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = plain(x)
		}
		return out
	}
	return v
}

var (
	_ datastore.ChangeStreamWatcher = (*DatastoreWatcher)(nil)
	_ client.ChangeStreamWatcher    = (*ClientWatcher)(nil)
	_ client.ChangeStreamMetrics    = (*ClientWatcher)(nil)
	_ client.Event                  = pgchangestream.EventWithToken{}
)
