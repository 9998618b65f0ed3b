package storeclient_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode"

	_ "github.com/jackc/pgx/v5/stdlib" // the pgx driver for Open's pool

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/internal/storeclient/client"
	"github.com/pgchangestream/pgchangestream/internal/storeclient/datastore"
	"github.com/pgchangestream/pgchangestream/internal/storeclient/watcher"
)

// WrapDataStore returns ds, a store-client datastore, with its CreateChangeStreamWatcher
// answered by pgchangestream, for the services that type-assert GetDatabaseClient and
// CreateChangeStreamWatcher on their datastore. A datastore of another provider is returned
// as it is.
func WrapDataStore(ds datastore.DataStore) datastore.DataStore {
	if ds.Provider() != datastore.ProviderPostgreSQL {
		return ds
	}
	return &DataStore{DataStore: ds}
}

// DataStore is a PostgreSQL datastore whose change stream watchers are pgchangestream's.
type DataStore struct {
	datastore.DataStore
}

// GetDatabaseClient returns the wrapped datastore's database client.
func (s *DataStore) GetDatabaseClient() client.DatabaseClient {
	return s.DataStore.(databaseClientSource).GetDatabaseClient()
}

// CreateChangeStreamWatcher watches the table health_events, as the store-client's does.
func (s *DataStore) CreateChangeStreamWatcher(ctx context.Context, clientName string, pipeline any) (datastore.ChangeStreamWatcher, error) {
	return NewWatcher(ctx, s.DataStore, clientName, "health_events", pipeline)
}

// Factory is the watcher factory of the PostgreSQL provider: RegisterWatcherFactory installs
// it in place of the store-client's.
type Factory struct{}

// RegisterWatcherFactory makes watcher.CreateChangeStreamWatcher create pgchangestream watchers
// for PostgreSQL datastores. Call it after the store-client's PostgreSQL provider package is
// initialized (in main, before the first watcher is created).
func RegisterWatcherFactory() {
	watcher.RegisterWatcherFactory(datastore.ProviderPostgreSQL, Factory{})
}

// CreateChangeStreamWatcher watches the table named by config.CollectionName in snake case
// ("HealthEvents" is health_events), as the store-client's factory does.
func (Factory) CreateChangeStreamWatcher(ctx context.Context, ds datastore.DataStore, config watcher.WatcherConfig) (datastore.ChangeStreamWatcher, error) {
	if config.CollectionName == "" {
		return nil, fmt.Errorf("CollectionName (table name) is required for PostgreSQL watcher")
	}
	if wrapped, ok := ds.(*DataStore); ok {
		ds = wrapped.DataStore
	}
	return NewWatcher(ctx, ds, config.ClientName, snakeCase(config.CollectionName), config.Pipeline)
}

// SupportedProvider returns the PostgreSQL provider.
func (Factory) SupportedProvider() datastore.DataStoreProvider { return datastore.ProviderPostgreSQL }

// databaseClientSource is the store-client's PostgreSQL datastore's accessor of its client.
type databaseClientSource interface {
	GetDatabaseClient() client.DatabaseClient
}

// NewWatcher returns the watcher the store-client's PostgreSQL datastore would create for
// clientName on table, as a pgchangestream watcher: Open, then its resume control (which may
// delete the client's token), so that a pipeline Open refuses leaves the token as it was.
func NewWatcher(ctx context.Context, ds datastore.DataStore, clientName, table string, pipeline any) (*Watcher, error) {
	source, ok := ds.(databaseClientSource)
	if !ok || ds.Provider() != datastore.ProviderPostgreSQL {
		return nil, fmt.Errorf("expected a PostgreSQL datastore, got %T", ds)
	}
	w, err := Open(clientName, table, pipeline, client.ResumeControlDecision{})
	if err != nil {
		return nil, err
	}
	w.decision, err = client.ResetResumeTokenOnStartIfConfigured(ctx,
		source.GetDatabaseClient(), client.TokenConfig{ClientName: clientName})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("failed to reset change stream resume token on startup: %w", err),
			w.Close(context.WithoutCancel(ctx)))
	}
	return w, nil
}

// Open returns a watcher of clientName on table as the store-client built it: hybrid mode,
// the store-client's filter semantics and update descriptions, the processed flag, and the
// documents of health_events. It connects, and LISTENs, with the connection string of the
// DATASTORE_* variables, through a pool of its own (pgx driver) that Close closes.
func Open(clientName, table string, pipeline any, decision client.ResumeControlDecision) (*Watcher, error) {
	pipeline, extended := client.ResolvePipelineOptions(pipeline)
	stages, err := Stages(pipeline)
	if err != nil {
		return nil, err
	}
	dsn := pgchangestream.DatastoreConnString(nil)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	cfg := pgchangestream.Config{
		DB: db, ConnString: dsn, ClientName: clientName, TableName: table, Mode: pgchangestream.ModeHybrid,
		ProcessedFlag: true, StoreClientCompat: true, Pipeline: stages, ExtendedFilters: extended,
	}
	if table == "health_events" {
		cfg.DocumentField = "document"
	}
	w, err := pgchangestream.New(cfg)
	if err != nil {
		return nil, errors.Join(err, db.Close())
	}
	adapted := Adapt(w, decision)
	adapted.db = db
	return adapted, nil
}

// Watcher is a pgchangestream watcher as the store-client's PostgreSQL watcher: a
// datastore.ChangeStreamWatcher that Unwrap turns into a client.ChangeStreamWatcher, with its
// resume-control decision. Read events through Events or through Unwrap().Events, not both.
// The embedded watcher provides Start, MarkProcessed, LagState and GetUnprocessedEventCount.
type Watcher struct {
	*pgchangestream.Watcher
	decision        client.ResumeControlDecision    // set before the watcher is handed out, then immutable
	db              *sql.DB                         // immutable; opened by Open, closed by Close
	datastoreEvents relay[datastore.EventWithToken] // started by Events, safe for concurrent use
	clientEvents    relay[client.Event]             // started by Unwrap().Events, likewise
}

// Adapt returns w as a store-client watcher with the resume-control decision.
func Adapt(w *pgchangestream.Watcher, decision client.ResumeControlDecision) *Watcher {
	return &Watcher{Watcher: w, decision: decision}
}

// Events returns the deliveries as datastore events.
func (w *Watcher) Events() <-chan datastore.EventWithToken {
	return w.datastoreEvents.events(w.Watcher.Events(), func(ev pgchangestream.EventWithToken) datastore.EventWithToken {
		return datastore.EventWithToken{Event: datastore.Event(ev.Event), ResumeToken: ev.ResumeToken}
	})
}

// Unwrap returns the watcher as a client.ChangeStreamWatcher.
func (w *Watcher) Unwrap() client.ChangeStreamWatcher { return ClientWatcher{w} }

// ResumeControlDecision returns the resume-control decision taken when the watcher was created.
func (w *Watcher) ResumeControlDecision() client.ResumeControlDecision { return w.decision }

// Close stops the relays and the watcher, which saves the checkpoint, then closes the pool
// Open opened.
func (w *Watcher) Close(ctx context.Context) error {
	w.datastoreEvents.close()
	w.clientEvents.close()
	err := w.Watcher.Close(ctx)
	if w.db != nil {
		err = errors.Join(err, w.db.Close())
	}
	return err
}

// ClientWatcher is a Watcher as a client.ChangeStreamWatcher: its events are
// pgchangestream.EventWithToken values, which have the client.Event methods.
type ClientWatcher struct {
	*Watcher
}

// Events returns the deliveries as client events.
func (c ClientWatcher) Events() <-chan client.Event {
	return c.clientEvents.events(c.Watcher.Watcher.Events(), func(ev pgchangestream.EventWithToken) client.Event { return ev })
}

// relay converts a watcher's deliveries, from the first call of events until close.
type relay[T any] struct {
	once sync.Once
	out  <-chan T // set once, by events or close
	stop func()   // set once, by events; nil if close came first
}

// events starts the relay of in through f, once, and returns its channel.
func (r *relay[T]) events(in <-chan pgchangestream.EventWithToken, f func(pgchangestream.EventWithToken) T) <-chan T {
	r.once.Do(func() { r.out, r.stop = convert(in, f) })
	return r.out
}

// close stops the relay; a relay never started returns a closed channel from then on.
func (r *relay[T]) close() {
	r.once.Do(func() {
		out := make(chan T)
		close(out)
		r.out = out
	})
	if r.stop != nil {
		r.stop()
	}
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

// Stages converts a pipeline as the store-client's PostgreSQL provider takes it (nil, a
// datastore.Pipeline, []any or []map[string]any of stages) into Config.Pipeline stages.
func Stages(p any) ([]map[string]any, error) {
	var stages []any
	switch p := p.(type) {
	case nil:
		return nil, nil
	case datastore.Pipeline:
		for _, stage := range p {
			stages = append(stages, stage)
		}
	case []any:
		stages = p
	case []map[string]any:
		for _, stage := range p {
			stages = append(stages, stage)
		}
	default:
		return nil, fmt.Errorf("unsupported pipeline type: %T", p)
	}
	out := make([]map[string]any, len(stages))
	for i, stage := range stages {
		m, ok := plain(stage).(map[string]any)
		if !ok {
			return nil, fmt.Errorf("pipeline stage %d: want a document, got %T", i, stage)
		}
		out[i] = m
	}
	return out, nil
}

// plain turns datastore documents and arrays into the maps and slices pgchangestream reads.
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

// snakeCase turns a collection name into its table name: "HealthEvents" is "health_events".
func snakeCase(s string) string {
	var b strings.Builder
	for i, r := range s {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

var (
	_ datastore.ChangeStreamWatcher               = (*Watcher)(nil)
	_ client.ChangeStreamWatcher                  = ClientWatcher{}
	_ client.ChangeStreamWatcherWithResumeControl = ClientWatcher{}
	_ client.ChangeStreamMetrics                  = ClientWatcher{}
	_ client.Event                                = pgchangestream.EventWithToken{}
	_ watcher.WatcherFactory                      = Factory{}
	_ interface {
		Unwrap() client.ChangeStreamWatcher
	} = (*Watcher)(nil)
)
