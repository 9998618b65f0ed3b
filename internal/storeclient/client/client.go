// Package client copies the declarations of the store-client library's client package that a
// change-stream consumer and the adapter of docs/migrating.md use, as the store-client declares
// them, so that the adapter compiles and runs in tests. The library cannot import the
// store-client module. Interfaces list only the methods the adapter calls; functions stand in
// for the store-client's with the behaviour the adapter relies on.
package client

import (
	"context"
	"fmt"
	"strings"
	"sync"
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

// resumeControl stands for the store-client's resume-control ConfigMap in tests: each client's
// mode ("RESUME", "CREATE") and the cold-start cutoff its last CREATE recorded.
var resumeControl = struct {
	sync.Mutex
	modes   map[string]string    // guarded by the mutex
	cutoffs map[string]time.Time // guarded by the mutex
}{modes: map[string]string{}, cutoffs: map[string]time.Time{}}

// SetResumeControlMode sets the mode of clientName in the stand-in for the ConfigMap, as an
// operator edits it; "" removes the client, and its cutoff, again.
func SetResumeControlMode(clientName, mode string) {
	resumeControl.Lock()
	defer resumeControl.Unlock()
	if mode == "" {
		delete(resumeControl.modes, clientName)
		delete(resumeControl.cutoffs, clientName)
		return
	}
	resumeControl.modes[clientName] = mode
}

// ResetResumeTokenOnStartIfConfigured stands for the store-client's, with the same decisions:
// the event-exporter is never reset; in RESUME mode (the default) the decision carries the
// cutoff of the client's last CREATE; in CREATE mode the client's token is deleted, the mode
// goes back to RESUME, and the decision says StartFresh with a cutoff of now for node-drainer
// and fault-remediation (the clients that use one) and the recorded one for the others.
func ResetResumeTokenOnStartIfConfigured(ctx context.Context, dbClient DatabaseClient, tokenConfig TokenConfig) (ResumeControlDecision, error) {
	name := tokenConfig.ClientName
	if name == "event-exporter" {
		return ResumeControlDecision{}, nil
	}
	resumeControl.Lock()
	mode, cutoff := strings.ToUpper(strings.TrimSpace(resumeControl.modes[name])), resumeControl.cutoffs[name]
	resumeControl.Unlock()
	switch mode {
	case "", "RESUME":
		return ResumeControlDecision{ColdStartCutoff: cutoff}, nil
	case "CREATE":
	default:
		return ResumeControlDecision{}, fmt.Errorf("invalid change stream resume control mode %q for %s", mode, name)
	}
	if name == "node-drainer" || name == "fault-remediation" {
		cutoff = time.Now().UTC()
	}
	if err := dbClient.DeleteResumeToken(ctx, tokenConfig); err != nil {
		return ResumeControlDecision{}, fmt.Errorf("failed to delete change stream resume token: %w", err)
	}
	resumeControl.Lock()
	resumeControl.modes[name], resumeControl.cutoffs[name] = "RESUME", cutoff
	resumeControl.Unlock()
	return ResumeControlDecision{StartFresh: true, ColdStartCutoff: cutoff}, nil
}
