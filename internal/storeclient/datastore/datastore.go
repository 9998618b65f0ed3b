// Package datastore copies the shapes of the store-client library's datastore types that a
// change-stream consumer uses, so that the adapter of docs/migrating.md compiles and runs in
// tests. Only the shapes matter: the library cannot import the store-client module.
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
