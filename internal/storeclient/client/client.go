// Package client copies the declarations of the store-client library's client package that a
// change-stream consumer and the adapter of docs/migrating.md use, as the store-client declares
// them, so that the adapter compiles and runs in tests. The library cannot import the
// store-client module. Interfaces list only the methods the adapter calls; functions stand in
// for the store-client's with the behaviour the adapter relies on.
package client

import (
	"context"
	"time"
)

// Event is a change event with accessors.
type Event interface {
	GetDocumentID() (string, error)
	GetRecordUUID() (string, error)
	GetNodeName() (string, error)
	GetResumeToken() []byte
	UnmarshalDocument(v any) error
}

// EventUpdatesOnly reports whether event is an update that changed exactly the named field,
// read from the event's optional UpdatedFields method.
func EventUpdatesOnly(event Event, field string) bool {
	updated, ok := event.(interface{ UpdatedFields() map[string]any })
	if !ok {
		return false
	}
	fields := updated.UpdatedFields()
	_, changed := fields[field]
	return changed && len(fields) == 1
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

// TokenConfig names a consumer's resume token.
type TokenConfig struct {
	ClientName      string
	TokenDatabase   string
	TokenCollection string
}

// DatabaseClient is the store-client's database client; of its methods, the adapter's code
// path uses DeleteResumeToken (through ResetResumeTokenOnStartIfConfigured).
type DatabaseClient interface {
	DeleteResumeToken(ctx context.Context, tokenConfig TokenConfig) error
}

// ResumeControlDecision describes the startup behavior selected by resume-control.
type ResumeControlDecision struct {
	StartFresh      bool
	ColdStartCutoff time.Time
}

// ChangeStreamWatcherWithResumeControl exposes the resume-control decision attached to a watcher.
type ChangeStreamWatcherWithResumeControl interface {
	ChangeStreamWatcher
	ResumeControlDecision() ResumeControlDecision
}

// PipelineOptions carries a pipeline and its opt-in filter semantics.
type PipelineOptions struct {
	Pipeline              any
	EnableExtendedFilters bool
}

// WithExtendedFilters asks the PostgreSQL provider for MongoDB-compatible $exists.
func WithExtendedFilters(pipeline any) PipelineOptions {
	return PipelineOptions{Pipeline: pipeline, EnableExtendedFilters: true}
}

// ResolvePipelineOptions returns the pipeline and whether extended filters were asked for.
func ResolvePipelineOptions(pipeline any) (any, bool) {
	if o, ok := pipeline.(PipelineOptions); ok {
		return o.Pipeline, o.EnableExtendedFilters
	}
	return pipeline, false
}

// ResumeControlModes stands for the store-client's resume-control ConfigMap in tests: the
// mode ("RESUME" or "CREATE") of each client name. Tests set it before creating watchers.
var ResumeControlModes = map[string]string{}

// ResetResumeTokenOnStartIfConfigured stands for the store-client's: for a client whose mode is
// CREATE it deletes the client's resume token and returns StartFresh with a cold-start
// cutoff; otherwise it returns the zero decision. The event-exporter is never reset.
func ResetResumeTokenOnStartIfConfigured(ctx context.Context, dbClient DatabaseClient, tokenConfig TokenConfig) (ResumeControlDecision, error) {
	if tokenConfig.ClientName == "event-exporter" || ResumeControlModes[tokenConfig.ClientName] != "CREATE" {
		return ResumeControlDecision{}, nil
	}
	if err := dbClient.DeleteResumeToken(ctx, tokenConfig); err != nil {
		return ResumeControlDecision{}, err
	}
	return ResumeControlDecision{StartFresh: true, ColdStartCutoff: time.Now().UTC()}, nil
}
