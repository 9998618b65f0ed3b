// Package admin is what an operator does to the clients of a changelog, beside the watchers:
// read and move their saved tokens, delete the rows every client has passed, count what a token
// has not passed, handle the events Process parked, and look at shared clients.
//
// Every call takes the *sql.DB of the changelog's database and [Options] naming its tables; zero
// values take the watcher's defaults. Errors match the sentinels of the root package with
// errors.Is: pgchangestream.ErrInvalidConfig for a bad name or target, ErrClientActive,
// ErrInvalidSavedToken and ErrNotParked as each call says.
//
// # Tokens
//
// [ListTokens] returns every client's saved token. [ResetToken] places a client at the
// beginning, after the newest row, at a time, after a row or at a [Position], for its table;
// with [ResetTarget].DryRun it only resolves the position, and the position's Token method
// gives the token it would save. [DeleteToken] deletes a client's token, so that its next
// watcher starts as a new client. Both refuse with ErrClientActive while a watcher of the
// client holds its lock (an exclusive watcher, or one with a LISTEN connection); they move the
// client's owner epoch on and free a shared client's ranges, so that a watcher that lost its
// lock without noticing saves nothing over them (it stops with ErrFenced).
//
// # Retention
//
// [Prune] deletes the changelog rows that every client of their table has passed, older than
// [PruneOptions].OlderThan, and names the clients whose tokens held rows back. It refuses a role
// that sees only some tokens (RestrictTokens), and deletes nothing while a token names a row
// that no longer exists. [Backlog] counts the rows a saved token has not passed, as a watcher
// restarting from it would deliver them; a token a watcher cannot load is ErrInvalidSavedToken.
//
// # Parked events
//
// [ListParked] returns the events the watchers' Process parked in the dead-letter table
// "<changelog>_parked" under ParkOnFailure and BlockOnFailure. [RetryParked] asks the running
// Process of the client that owns an event to run it again (for an event of a held key: every
// parked event of the key, in order); [DropParked] deletes one without running it.
//
// # Shared clients
//
// [ListShared] returns every Config.Shared client with its members and ranges.
package admin

import "github.com/pgchangestream/pgchangestream/internal/position"

// Position is a place in the change stream, the root package's Position: a client resumes
// strictly after it.
type Position = position.Position
