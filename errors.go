package pgchangestream

import (
	"errors"
	"fmt"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/internal/procface"
)

// The errors the library returns, matched with errors.Is.

// ErrInvalidConfig is wrapped by every error [New] returns for a bad [Config].
var ErrInvalidConfig = changelog.ErrInvalidConfig

// ErrInvalidToken is wrapped by the error MarkProcessed returns for a token that is not a
// decimal int64.
var ErrInvalidToken = position.ErrInvalidToken

// ErrInvalidSavedToken is wrapped by the error admin.Backlog returns for a saved token a
// watcher cannot load.
var ErrInvalidSavedToken = changelog.ErrInvalidSavedToken

// ErrClientActive is returned by admin.ResetToken and admin.DeleteToken while a watcher of the
// client holds its lock: an exclusive watcher, or one with a LISTEN connection (see
// [Config.Exclusive]).
var ErrClientActive = changelog.ErrClientActive

// ErrNotParked is returned by admin.RetryParked and admin.DropParked for an id that is not a
// parked event of the client.
var ErrNotParked = changelog.ErrNotParked

// ErrExclusiveLost is wrapped by [Watcher.Err] (and by saves refused afterwards) when an
// exclusive watcher lost the session that held its lock, so that a standby may take over.
var ErrExclusiveLost = errors.New("pgchangestream: exclusive lock lost")

// ErrFenced is wrapped by the errors of saves refused because a later owner claimed the
// client (or the token row was deleted or reset) since this watcher became active. It wraps
// [ErrExclusiveLost]: the watcher stops as if it had lost its lock.
var ErrFenced = fmt.Errorf("%w: fenced off by a later owner of the client", ErrExclusiveLost)

// ErrPanic is wrapped by the error a watcher reports when one of its goroutines panicked (a bug,
// in this package or in a callback such as [Config.Filter]). The panic is recovered, logged with
// its stack and reported by [Watcher.Health] and [Stats].LastError, so it never takes down the
// process. A panic in the reader, the saver, the LISTEN connection or the exclusive lock's check
// stops the watcher: [Watcher.Err] wraps ErrPanic (or [ErrExclusiveLost]) and Events closes. A
// panic in a prefetched read or in the processed-flag marker fails that step only: the reader
// reads again, and the marker retries (the flag may lag the token).
var ErrPanic = procface.ErrPanic

// ErrLegacyChangelog is returned by [Watcher.ProcessTx] and [Watcher.MarkProcessedTx] on a
// legacy changelog (one without the txid column: not upgraded, or on PostgreSQL 12). There a row
// that commits behind the saved token moves the token back (late-row recovery), so a restart
// would deliver again events whose effects already committed, after their acknowledgement rows
// were deleted as certified: exactly-once cannot be kept. Nothing is claimed or written.
var ErrLegacyChangelog = errors.New("pgchangestream: ProcessTx and MarkProcessedTx need an upgraded changelog " +
	"(a txid column, PostgreSQL 13 or later): on a legacy one a row that commits behind the saved token moves it back " +
	"and events already done would run again; upgrade the changelog with schema.Install, or the statements it lists with " +
	"DryRun (a running watcher switches over by itself)")

// ErrServerRecovered is wrapped by the error of a save refused because the server recovered
// from a crash, failed over or was restored since the position was read: transaction ids the
// watcher saw finish may be handed out again. The watcher goes back to its saved token and
// delivers again from there; acknowledgements are kept, and the next save after that succeeds.
var ErrServerRecovered = errors.New("pgchangestream: the server recovered from a crash, failed over or was restored " +
	"since this position was read; the watcher goes back to its saved token and delivers again from there")

// ErrRestoredDatabase is returned through [Watcher.Err] when transaction ids stored in the
// changelog or in the saved token are ahead of the database's transaction counter, as after a
// logical dump and restore. The watcher refuses to start rather than skip or replay rows. A
// token saved while the watcher starts is not taken for one: it is checked again against a
// snapshot taken after it was read. docs/operations.md ("Restoring a database") says how to
// confirm that the database was restored, and only then what to change.
var ErrRestoredDatabase = errors.New("pgchangestream: stored transaction ids are ahead of the database's transaction counter, " +
	"as after a logical dump and restore; first confirm that this database was restored from a dump, and change nothing " +
	"if it was not: docs/operations.md, \"Restoring a database\", says how to check and what to do")

// ErrSharedSchema is returned through [Watcher.Err] by a Shared watcher whose changelog lacks
// what shared members need: the txid column (skip-free reads) and the unit column, the
// _members and _ranges tables schema.Install creates.
var ErrSharedSchema = errors.New("pgchangestream: Config.Shared needs an upgraded changelog: run schema.Install " +
	"(it adds the txid and unit columns and the _members and _ranges tables)")
