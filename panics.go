package pgchangestream

import (
	"fmt"
	"runtime/debug"
)

// opPanic is the Health failure of a goroutine that stopped the watcher after a panic.
const opPanic = "panic"

// recoverPanic, deferred in a watcher goroutine (or around one step of it), recovers a panic in
// where: it logs it with its stack, reports it as a failure of op, and hands the error to then
// (which stops the watcher, or fails the step). A panic leaves no lock held: the locked
// sections that call code that could panic unlock by defer.
func (w *Watcher) recoverPanic(op, where string, then func(error)) {
	r := recover()
	if r == nil {
		return
	}
	err := w.panicError(where, r)
	w.health.fail(op, err)
	then(err)
}

// panicError logs a recovered panic r in where with its stack, and returns it as an error
// wrapping ErrPanic.
func (w *Watcher) panicError(where string, r any) error {
	w.log.Error("recovered from a panic", "in", where, "panic", r, "stack", string(debug.Stack()))
	return fmt.Errorf("%w in the %s: %v", ErrPanic, where, r)
}

// stopWith stops the watcher because of err, which Err then reports: its goroutines end and the
// reader closes Events. The saved token stays where the last save put it.
func (w *Watcher) stopWith(err error) {
	w.lifeMu.Lock()
	if w.stopErr == nil {
		w.stopErr = err
	}
	cancel := w.cancel
	w.lifeMu.Unlock()
	if cancel != nil { // nil before Start
		cancel()
	}
}
