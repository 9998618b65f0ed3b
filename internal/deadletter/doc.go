// Package deadletter is the dead-letter table of a client, "<changelog>_parked" (created by
// schema.Install): the events Process parked under ParkOnFailure and BlockOnFailure, the keys
// they hold, and the operator's requests to run them again. A [Store] is one client's view of
// the table; [Event] is one parked row (the root package's ParkedEvent, and admin's).
//
// The watcher decides who may park, the fencing of its parks and which reruns it starts; the
// admin package lists, releases and drops parked events. This package only runs the
// statements: it keeps no state and starts no goroutine.
//
// # Failure model
//
// Every call is one statement and is not retried here; its error names what it did and the
// table ("pgchangestream: park event 7 of key \"k\" in datastore_changelog_parked: ..."). The
// caller decides what a failure means:
//
//   - A call of Process's (a park, a rerun's read, the poll of released events) that fails is
//     retried by the engine with backoff; the watcher reports it in Health and
//     Stats().LastError as a "dead-letter table" failure from its first failed try until it
//     succeeds. An event whose park keeps failing stays unfinished, so the checkpoint stays
//     behind it: nothing is lost, and nothing is acknowledged that was not parked.
//   - A missing table says so and how to create it ("dead-letter table ... is missing (run
//     schema.Install)"); a role without the table's grants (SELECT, INSERT, UPDATE, DELETE and
//     the id sequence's USAGE) fails with PostgreSQL's "permission denied", wrapped with the
//     table's name. Both are failures like any other: Process retries them and Health shows
//     them until they are fixed. Row-level security (schema.RestrictReads, RestrictTokens)
//     hides and refuses other tables' and clients' rows without an error.
//   - A key the table's text column cannot hold (a NUL byte, invalid UTF-8) is refused before
//     any statement as a procrun.Fatal error: retrying could not succeed, and a key stored
//     changed would not find its events again. Process stops with it, the event
//     unacknowledged. The handler's error text, a message only, is stored with such bytes
//     replaced.
//   - A park fenced by the caller ([Store.Insert] with a FROM clause whose condition selects no
//     row) inserts nothing and reports inserted false; the watcher turns it into ErrFenced.
//   - [Store.Request] and [Store.Drop] on an id the client has not parked return an error
//     wrapping changelog.ErrNotParked (the root package's ErrNotParked).
package deadletter
