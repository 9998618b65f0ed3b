// Package procface is the face of Process over the engine (internal/procrun) that the watcher's
// Process and ProcessTx and the test kit's FakeWatcher.Process share, so that the fake behaves
// as the watcher does: the options' defaults and validation, their conversion to the engine's
// options, the handler run with its panic recovered, the wrap of a failure under StopOnFailure,
// the dead-letter adapter and the counters. It knows nothing of the database nor of ownership:
// the watcher adds its ownership gate, its deferred events and its health around it.
//
// Failure model: a handler's panic is recovered into an error wrapping [ErrPanic] and retried
// like any failure; a panic of the key function sends the event to the fallback key. An event
// that fails MaxAttempts times under StopOnFailure stops the run with an error naming its key
// and token; under ParkOnFailure and BlockOnFailure it goes to the dead-letter store, whose
// failing calls the engine retries with the options' backoff.
package procface
