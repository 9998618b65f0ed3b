// Package listen is the watcher's LISTEN service: one dedicated connection that LISTENs on the
// changelog's notify channel and turns each NOTIFY into a wake-up of the reader and, on a
// legacy changelog, an id hint ([Hints]) for the late-row recovery ([RecentIDs] tells the
// reader which notified rows it already read).
//
// # Failure model
//
// NOTIFY is a hint; the read query is the truth. A notification only asks the reader to read
// now, through a coalescing wake-up, and a payload's id is only used to look for a row that
// committed behind the reader's cursor. A lost, malformed or duplicated notification therefore
// costs latency, not an event (hybrid mode also polls); only on a legacy changelog can a lost
// id hide a late row, which reads after the cursor never find.
//
// The connection is suspected all the time: the listener waits for notifications in short
// slices and pings the server after a silent one, so a dead peer is found within seconds. A
// failed connect, LISTEN or ping ends the connection; the listener reconnects with a capped,
// jittered exponential backoff ([backoff.Backoff], reset after each success) and reports each
// failure and recovery through its hooks (the watcher's Health). Notifications sent while it
// was disconnected are lost, so after every (re)connect it wakes the reader for a catch-up read
// of everything after the cursor.
//
// # Ready
//
// [Listener.Ready] is closed after the first connect attempt, successful or not (or when Run
// returns before one). The reader waits for it before its first read: on success the LISTEN
// is in place before that read, so a row committed after the read is notified; on failure the
// reader starts anyway and the reconnects' catch-up reads cover the gap.
//
// # Bounds
//
// At most 1<<16 ids wait for the reader; further ids are dropped (logged once until the reader
// takes them), and a late row among them may be missed. Once the changelog is read by snapshot
// deltas (NoIDs), ids are not kept at all.
package listen
