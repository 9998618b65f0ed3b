package changelog

import "errors"

// The sentinels shared by the watcher and the schema and admin packages. Each is re-exported
// by name where users see it, so errors.Is matches whichever name they use.
var (
	// ErrInvalidConfig is wrapped by every error for bad options or names.
	ErrInvalidConfig = errors.New("pgchangestream: invalid config")
	// ErrInvalidSavedToken is wrapped by the error for a saved token a watcher cannot load.
	ErrInvalidSavedToken = errors.New("pgchangestream: invalid saved token")
	// ErrClientActive is returned by token changes while a watcher of the client holds its lock.
	ErrClientActive = errors.New("pgchangestream: a watcher of the client is running")
	// ErrNotParked is returned for an id that is not a parked event of the client.
	ErrNotParked = errors.New("pgchangestream: no such parked event")
)
