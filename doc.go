// Package pgchangestream turns a trigger-filled PostgreSQL changelog table into a change stream
// that never loses an event: MongoDB-style change events (insert, update, delete) on a channel,
// and a per-client resume token, saved in the database, from which a restarted consumer carries
// on.
//
// A trigger on each watched table writes every change into the changelog table (default
// datastore_changelog) and sends pg_notify on a channel (default nvsentinel_changes).
// The schema package ([github.com/pgchangestream/pgchangestream/schema]) creates the tables, the
// indexes reads need and the trigger (schema.Install, schema.Capture), and restricts roles to
// their tables and clients; on an existing database, schema.Install upgrades the changelog
// online with a txid column (the writing transaction's id, filled by a column default:
// existing triggers keep working). A
// [Watcher] reads the changelog rows of one table and delivers them on [Watcher.Events]: on an
// upgraded changelog in snapshot deltas (the rows that became visible between two snapshots,
// each delta in changelog id order); on a changelog without the column, as the watcher it
// replaces did, in (changed_at, id) order, with no per-row order guarantee.
//
//	w, err := pgchangestream.New(pgchangestream.Config{
//		DB:         db,  // *sql.DB with the pgx stdlib driver
//		ConnString: dsn, // for the LISTEN connection
//		ClientName: "billing",
//		TableName:  "orders",
//	})
//	if err != nil {
//		return err
//	}
//	w.Start(ctx)
//	defer w.Close(context.Background())
//	for ev := range w.Events() {
//		if err := handle(ev.Event); err != nil {
//			return err
//		}
//		if err := w.MarkProcessed(ctx, ev.ResumeToken); err != nil {
//			return err
//		}
//	}
//
// # Delivery guarantees
//
// Delivery is at-least-once. Every delivery is recorded as pending before it is sent. The saved
// token is the minimum of the read cursor and the predecessors of all pending deliveries, so it
// never passes an event that was handed out but not acknowledged, including events still
// buffered in the channel and sends abandoned by Close. After a restart, everything after the
// saved token is delivered again: consumers must be idempotent.
//
// On an upgraded changelog no committed row is skipped, in any mode: every committed row becomes
// visible in exactly one step from one snapshot to the next, so it is read in exactly one delta,
// whenever its transaction commits: while the watcher runs, between a Close and the next Start,
// during a crash, a server restart or a LISTEN outage. A transaction left open delays only its own
// rows. NOTIFY only wakes the reader. The saved token records the delta and the position in it,
// so a restart finishes an interrupted delta exactly. One row's changes (one table_name and
// record_id) are delivered in the order they committed: deltas follow each other in commit
// order, and each is delivered in changelog id order, which for one row is commit order (the
// trigger row of a change is written only after the row's previous change committed). Rows of
// concurrent transactions may come in either order. A changelog id sequence with a CACHE above
// 1 breaks this.
//
// On a changelog without the txid column (not upgraded, or PostgreSQL 12), reads are by
// (changed_at, id), which is insert order, not commit order: rows that commit late (a
// transaction that started earlier commits after rows with later positions were read) are
// recovered only when their NOTIFY arrives. The watcher says so in a warning at Start.
//
// # Acknowledgements
//
// [Watcher.MarkProcessed] is cumulative in delivery order, like MongoDB resume tokens and Kafka
// offsets: it acknowledges the earliest pending delivery with that token and every delivery
// handed out before it. Acknowledge in delivery order, or acknowledge a contiguous watermark
// (everything up to this event is done). A caller that acknowledges a later event while an
// earlier one is still being worked on certifies the earlier one too; to work out of order or in
// parallel, use [Watcher.Process], which acknowledges the low-water mark of finished events.
//
// An empty token, or the token of no pending delivery, acknowledges nothing. A token that is not
// a decimal changelog id is an error ([ErrInvalidToken]).
//
// # Checkpoints
//
// By default every MarkProcessed saves the checkpoint before it returns, in one statement (the
// token upsert; with [Config.ProcessedFlag], the legacy processed flag of the rows it certifies
// is set afterwards by a background marker, at most every 10ms for any number of saves), and
// returns an error if the save fails; the
// acknowledgement is kept, so calling MarkProcessed again (with any token) retries. Concurrent
// saves are ordered, and a call whose position was already saved by another does not write
// again. With [Config.CheckpointInterval] set, acknowledgements are saved by a background saver
// at most once per interval instead: faster, at the cost of replaying the events acknowledged
// since the last save after a crash. When rows rejected by [Config.Filter] move the position with
// nothing pending, the watcher saves it by itself (at most once per
// [Config.IdleCheckpointInterval]).
//
// A client with no saved token starts after the newest row of its table as the database sees it
// (or at the oldest row with [Config.StartFromBeginning]), and saves that start at once. If the
// saved token cannot be read, the watcher retries; it never guesses a position.
//
// # Shutdown
//
// [Watcher.Close] stops reading, waits for the watcher's goroutines, closes the LISTEN connection
// and the Events channel (exactly once, never racing a send) and saves the checkpoint. Close is
// idempotent. MarkProcessed and [Watcher.Flush] keep working after Close, so a consumer can
// acknowledge its final watermark after closing. Cancelling Start's context stops the watcher
// the same way, without the final save; [Watcher.Err] then says why Events closed.
//
// # Operations
//
// [Watcher.Health] is nil while the watcher works, else describes each failing operation, its
// object and how long it has failed; [Watcher.Stats] carries the counters and the lag (the age
// of the oldest row not yet acknowledged or read, from its changed_at). With
// [Config.Exclusive], watchers sharing a client name hold a session advisory lock: one
// delivers, the others wait as standbys and take over from the saved token; an owner epoch in
// the token row fences the saves of a watcher that lost the lock ([ErrFenced]). The package
// github.com/pgchangestream/pgchangestream/admin administers saved tokens (ListTokens,
// ResetToken, DeleteToken) and changelog retention (Prune).
// The Prometheus collector is the module github.com/pgchangestream/pgchangestream/prometheus;
// OpenTelemetry metrics and spans are the module github.com/pgchangestream/pgchangestream/otel,
// whose spans come from [Config.Observer].
//
// # Known limits
//
//   - On a changelog without the txid column only: a row that commits behind the cursor is only
//     found through its NOTIFY. Polling mode never sees it, and neither does any mode while the
//     LISTEN connection is down or while no watcher runs. Hybrid mode, the default, recovers such
//     rows while it runs. Upgrade with schema.Install to lift this.
//   - A watcher started before the upgrade reads as before until it switches over: at its next
//     Start, or by itself within seconds once nothing is pending. Rows after its position are
//     then read once, then deltas; a row that committed behind its legacy position before the
//     switch-over is not replayed (the legacy limit above).
//   - A database restored from a logical dump has a transaction counter below the stored txids:
//     the watcher refuses to start ([ErrRestoredDatabase]) until the ids are cleared, which an
//     operator does only once the restore is confirmed (docs/operations.md).
//   - Tracking is bounded by [Config.MaxPending]. When it is full, the oldest pending delivery is
//     folded into a floor the saved token cannot pass, so nothing is lost. But if the same row is
//     delivered again while its earlier delivery has been evicted, an acknowledgement of the
//     later copy can certify more than was processed. This needs saturation and a redelivered id
//     together.
package pgchangestream
