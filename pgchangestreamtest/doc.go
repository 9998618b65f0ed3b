// Package pgchangestreamtest helps services unit-test their consumers of a
// [pgchangestream.ChangeStreamWatcher] without a database and without copying the watcher's SQL.
//
// [FakeWatcher] is an in-memory watcher for consumers written against the
// [pgchangestream.ChangeStreamWatcher] interface. A test pushes changes built with [Insert],
// [Update] and [Delete] (the events carry the watcher's own documents), runs the consumer, then
// checks what it acknowledged ([FakeWatcher.Acked]) and what the watcher would have saved
// ([FakeWatcher.Saved]). It shares the watcher's pending ring, positions and token parser, so
// acknowledgements, eviction and checkpoints behave as in production.
//
// [Mock] is for code that runs a real [pgchangestream.Watcher] on a sqlmock database: it expects
// the watcher's start-up, reads and saves from the watcher's own statements, and
// [Mock.StartWatcher] fails fast, with the unmet expectations and the watcher's log, when an
// expectation is wrong.
package pgchangestreamtest
