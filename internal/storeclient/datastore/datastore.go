// Package datastore copies the declarations of the store-client library's datastore package
// that a change-stream consumer and the adapter of docs/migrating.md use, as the store-client
// declares them, so that the adapter compiles and runs in tests. The library cannot import the
// store-client module.
package datastore

import "context"

// Event is a change event document.
type Event map[string]interface{}

// EventWithToken is one delivery. FetchByID and DocumentID serve another provider's cold start;
// PostgreSQL leaves them zero.
type EventWithToken struct {
	Event       Event
	ResumeToken []byte
	FetchByID   bool
	DocumentID  any
}

// ChangeStreamWatcher is the store-client change stream.
type ChangeStreamWatcher interface {
	Events() <-chan EventWithToken
	Start(ctx context.Context)
	MarkProcessed(ctx context.Context, token []byte) error
	Close(ctx context.Context) error
}

// DataStoreProvider names a datastore implementation.
type DataStoreProvider string

// ProviderPostgreSQL is the PostgreSQL datastore.
const ProviderPostgreSQL DataStoreProvider = "postgresql"

// MaintenanceEventStore and HealthEventStore are the stores of a DataStore; the adapter uses
// none of their methods, which are not copied.
type (
	MaintenanceEventStore interface{}
	HealthEventStore      interface{}
)

// DataStore is a datastore connection.
type DataStore interface {
	MaintenanceEventStore() MaintenanceEventStore
	HealthEventStore() HealthEventStore
	Ping(ctx context.Context) error
	Close(ctx context.Context) error
	Provider() DataStoreProvider
}

// Element is one key and value of a Document.
type Element struct {
	Key   string
	Value interface{}
}

// Document is an ordered document.
type Document []Element

// Array is an array of values.
type Array []interface{}

// Pipeline is an aggregation pipeline.
type Pipeline []Document
