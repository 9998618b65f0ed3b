// Package schema installs what the change stream reads, and limits what roles may do with it.
//
// Every call takes an [Options] that names the objects (zero values: the defaults the watcher's
// Config uses) and returns a [Result] listing the statements it ran. With [Options.DryRun] it
// returns the statements it would run and changes nothing: review them, or run them yourself
// (psql). Every call is idempotent, and errors for bad names, keys, roles or lists wrap
// [ErrInvalidConfig] before anything is sent to the database.
//
// # What each call creates
//
//   - [Install] creates the changelog table (default datastore_changelog) with its indexes, the
//     token table (default resume_tokens), the tables beside the changelog that the watcher's
//     options use ("<changelog>_parked", "_acks", "_members", "_ranges", "_captured",
//     "_incarnation"), the unit function "<changelog>_unit", the retention function
//     "<changelog>_prune", and the trigger function (default log_table_changes) that writes a
//     changelog row and a NOTIFY for every change of a captured table. On an existing
//     database it upgrades the changelog online: the txid and unit columns, and indexes built
//     without blocking writes.
//   - [Capture] attaches the trigger function to one table and lists it among the captured
//     tables, optionally with a key ([Options.Key]) that keeps the rows of one key in one unit
//     for shared clients, or without NOTIFY ([Options.WithoutNotify]) for tables written by
//     prepared transactions.
//   - [RestrictReads] and [RestrictTokens] enable row-level security and limit one role to the
//     changelog rows of some tables, or to the saved tokens (and the dead-letter,
//     acknowledgement, member and range rows) of some clients. [RemoveRestrictions] lifts both.
//   - [RevokeWriterGrants] takes away the grants writers needed before the trigger function
//     ran as the changelog's owner (INSERT on the changelog, SELECT on its id, USAGE on its
//     sequence), refusing where that would break writes.
//
// # Order
//
// Run them as the owner of the tables (a migration role), in this order:
//
//  1. Install, once per database, and again after every upgrade of the library and after any
//     DDL that replaced the trigger function (a service's start-up or migration);
//  2. Capture, once per captured table, and again, with the same options, after such DDL;
//  3. RevokeWriterGrants, once, after the upgrade of an existing installation: with DryRun
//     first, to review what it revokes;
//  4. RestrictReads and RestrictTokens, per tenant role, if roles are to be kept apart.
//
// Watchers may run throughout: Install upgrades the changelog beside running watchers, which
// switch to snapshot deltas by themselves.
//
// # Dry runs and the database
//
// Install, Capture and RemoveRestrictions render their statements without a database: with
// DryRun, db may be nil. RestrictReads and RestrictTokens have the server quote the policy's
// values, and RevokeWriterGrants reads the catalog to find the grants and to check that
// revoking them is safe: with DryRun they query db and write nothing.
//
// The roles, the privileges each needs and the threat model the restrictions answer are in
// docs/operations.md, sections "Grants" and "Restricting consumers and clients (opt-in)".
package schema
