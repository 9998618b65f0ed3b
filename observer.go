package pgchangestream

import (
	"context"
	"time"
)

// Observer is told of each changelog read and each checkpoint save once it has ended, for
// tracing: the otel module turns them into spans. Set it as [Config.Observer]; nil (the
// default) costs nothing. Its methods run on the goroutine that did the work (the reader, a
// prefetch of the next batch, the background saver, or the caller of MarkProcessed, Flush or
// Close), never with a lock of the watcher held, and may call the watcher (Stats, Health,
// Flush). They must be safe for concurrent use, should return quickly, since reads and
// acknowledgements wait for them, and must not panic.
type Observer interface {
	// ObserveRead is called after each query of changelog rows ([ReadObservation]), with the
	// watcher's context, which Close cancels.
	ObserveRead(ctx context.Context, r ReadObservation)
	// ObserveSave is called after each write of the checkpoint to the token table
	// ([SaveObservation]), with the context of the call that saved (MarkProcessed, Flush,
	// Close) or, for the background saver, the watcher's. A save that has nothing to write
	// is not observed, nor is the start position of a new client, written by the load.
	ObserveSave(ctx context.Context, s SaveObservation)
}

// ReadObservation is one query of changelog rows: a batch after From.
type ReadObservation struct {
	// Start is when the query began; Duration how long it took, rows included.
	Start    time.Time
	Duration time.Duration
	// From is the position the rows follow.
	From Position
	// Rows is the number of rows read.
	Rows int
	// Err is the query's failure, or nil.
	Err error
}

// SaveObservation is one write of the checkpoint to the token table.
type SaveObservation struct {
	// Start is when the write began; Duration how long it took.
	Start    time.Time
	Duration time.Duration
	// Checkpoint is the position written.
	Checkpoint Position
	// Err is the write's failure, or nil. It is the error the save returns (a [ErrFenced] or
	// [ErrServerRecovered] refusal included).
	Err error
}
