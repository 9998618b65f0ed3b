package pgchangestream

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// repeatLogInterval is the most often a repeatLog writes a line about the same failure.
const repeatLogInterval = 30 * time.Second

// repeatLog logs the failures of one background operation that retries (a save, a read, a
// reconnect), so that an outage writes a few lines, not one per attempt: the first failure at
// once, then at most one summary per repeatLogInterval ("N more times in the last X", with the
// last error), and one line when the operation succeeds again. It is safe for concurrent use;
// the lines are written after its lock is released.
type repeatLog struct {
	log   *slog.Logger // immutable
	level slog.Level   // immutable
	msg   string       // immutable

	mu      sync.Mutex
	failing bool      // a failure was logged and no success since
	first   time.Time // when the failure began
	last    time.Time // when the last line about it was written
	unseen  int       // failures since that line, not yet logged
	total   int       // failures since the failure began
}

// newRepeatLog returns a repeatLog writing msg at level to log.
func newRepeatLog(log *slog.Logger, level slog.Level, msg string) *repeatLog {
	return &repeatLog{log: log, level: level, msg: msg}
}

// fail records a failure described by args (slog key-value pairs, the error among them): it is
// logged if it is the first, or if the last line is repeatLogInterval old, as a summary.
func (r *repeatLog) fail(args ...any) {
	now := time.Now()
	r.mu.Lock()
	r.total++
	switch {
	case !r.failing:
		r.failing, r.first, r.last, r.unseen = true, now, now, 0
		r.mu.Unlock()
		r.log.Log(context.Background(), r.level, r.msg, args...)
		return
	case now.Sub(r.last) < repeatLogInterval:
		r.unseen++
		r.mu.Unlock()
		return
	}
	n, since := r.unseen+1, now.Sub(r.last)
	r.last, r.unseen = now, 0
	r.mu.Unlock()
	r.log.Log(context.Background(), r.level, r.msg,
		append(args, "repeated", n, "in_last", since.Round(time.Second))...)
}

// ok records a success: after failures, it logs that the operation recovered, with how many
// times it failed and for how long.
func (r *repeatLog) ok() {
	now := time.Now()
	r.mu.Lock()
	if !r.failing {
		r.mu.Unlock()
		return
	}
	total, lasted := r.total, now.Sub(r.first)
	r.failing, r.total, r.unseen = false, 0, 0
	r.mu.Unlock()
	r.log.Info(r.msg+": recovered", "failures", total, "failing_for", lasted.Round(time.Second))
}
