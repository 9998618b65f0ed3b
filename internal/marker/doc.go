// Package marker sets the legacy processed flag of a changelog's rows (rule 12): the flag the
// existing schema's cleanup_changelog(days) deletes by, kept only for it. The saved token is the
// truth about what a client has processed; the flag is a convenience that follows it, a little
// later, and never leads it.
//
// # Passes
//
// The flag is set by a marker, not by the saves. A save writes the token alone and wakes the
// marker (AfterSave), which sets the flag of the rows certified since the rows it last marked,
// in one pass however many saves came in between: one query selects their ids, and one
// statement (two at once for thousands of rows) updates them. So an acknowledgement never waits
// for the flag's row rewrites, and many saves share one pass. The marker goroutine (Start) runs
// at most one pass per 100 ms; before Start and after Stop a save's pass runs at once, in the
// saving goroutine. The marker only marks up to a position that was saved (Config.Saved), so the
// flag never leads the saved token; it may lag it, by about a pass.
//
// # Failures
//
// A failed pass marks nothing as done: the next pass selects the same rows again (those already
// marked are skipped by "processed = FALSE"). If one of a pass's two statements fails, the
// other keeps what it marked. The marker goroutine retries a failed pass with backoff (100 ms
// to 10 s) and reports it (Report.Retrying); a panic in a pass fails that pass only
// (Report.Panicked), and the watcher's health reports it until a pass succeeds
// (Report.Passed). The watcher never stops because of the flag.
//
// # Catching up after a load
//
// The marker's state is in memory. A process that stops between a save and the pass after it
// (a crash, a kill, Start's context ending, a pass cancelled while a row lock holds it back)
// leaves rows the saved token certifies unmarked, and the next watcher's marking starts from
// the token it loads. So after each load (and rewind) the watcher calls SetMarked, and the
// first pass catches up: it marks the rows of the table that the loaded token certifies, and
// that the saved position certifies too (should it have moved back behind a late row since),
// with "processed = FALSE", in pages of 10,000 (CatchUpPage) in (changed_at, id) order, each
// after the last row of the one before, through the partial index of the rows not marked. So
// the catch-up reads the table's rows not marked, once, not the changelog. A failed page is
// selected again by the next pass. A row that commits behind a legacy position after that
// position was saved is never marked.
//
// # Switch-over
//
// A watcher that switches over in place to snapshot deltas records the switch-over's span
// under its own delivery lock (Saved.Switched), so its reader never waits for a marking
// statement; the next pass gives its legacy marked position that snapshot, which certifies no
// more rows than before, and marks from there.
package marker
