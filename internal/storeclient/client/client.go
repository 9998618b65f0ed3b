// Package client copies the shapes of the store-client library's client interfaces that a
// change-stream consumer uses, so that the adapter of docs/migrating.md compiles and runs in
// tests. Only the shapes matter: the library cannot import the store-client module.
package client

import "context"

// Event is a change event with accessors.
type Event interface {
	GetDocumentID() (string, error)
	GetRecordUUID() (string, error)
	GetNodeName() (string, error)
	GetResumeToken() []byte
	UnmarshalDocument(v any) error
}

// ChangeStreamWatcher is the store-client change stream of Events.
type ChangeStreamWatcher interface {
	Start(ctx context.Context)
	Events() <-chan Event
	MarkProcessed(ctx context.Context, token []byte) error
	Close(ctx context.Context) error
}

// ChangeStreamMetrics reports a consumer's backlog.
type ChangeStreamMetrics interface {
	GetUnprocessedEventCount(ctx context.Context, lastProcessedID string) (int64, error)
}
