package pgchangestream

import (
	"context"
	"log/slog"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// ackSaver is Process's side of acknowledgements: the engine calls ack (one call at a time, in
// the mark's order) each time the low-water mark advances; ack acknowledges in memory and wakes the
// saver goroutine, which saves one checkpoint at a time, each covering every acknowledgement
// made before it started. A failed save is retried with backoff; the acknowledgement stays in
// memory meanwhile, and the failure shows in Health and Stats through the save path. A positive
// gap is the least time from the end of one save to the start of the next. With a batched
// Config.CheckpointInterval the watcher's save loop saves, and there is no saver.
type ackSaver struct {
	w      *Watcher
	gap    time.Duration // immutable
	wake   chan struct{} // capacity 1: a save is wanted
	cancel context.CancelFunc
	done   chan struct{} // closed when the saver goroutine exited
}

func (w *Watcher) startAckSaver(ctx context.Context, gap time.Duration) *ackSaver {
	s := &ackSaver{w: w, gap: gap, wake: make(chan struct{}, 1), done: make(chan struct{})}
	ctx, s.cancel = context.WithCancel(ctx)
	if w.cfg.CheckpointInterval > 0 {
		close(s.done)
		return s
	}
	go s.loop(ctx)
	return s
}

// ack acknowledges the delivery of last, the newest event of the finished prefix: the earliest
// pending delivery of its id, which is in the prefix, and every one before it.
func (s *ackSaver) ack(last EventWithToken) {
	if id, ok, _ := position.ParseToken(last.ResumeToken); ok {
		s.w.ack(id)
	}
	select {
	case s.wake <- struct{}{}:
	default: // a save is already wanted: it will cover this one
	}
}

func (s *ackSaver) loop(ctx context.Context) {
	defer close(s.done)
	b := backoff.Backoff{Min: loadRetryMin, Max: loadRetryMax}
	failed := newRepeatLog(s.w.log, slog.LevelWarn, "checkpoint save after Process acknowledgements failed; trying again")
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		}
		for {
			err := s.w.saveInBackground(ctx, saveChanged)
			if err == nil {
				b.Reset()
				failed.ok()
				break
			}
			failed.fail("error", err)
			if !backoff.Sleep(ctx, b.Next()) {
				return
			}
		}
		if s.gap > 0 && !backoff.Sleep(ctx, s.gap) { // a wake meanwhile waits in s.wake
			return
		}
	}
}

// stop ends the saver goroutine and waits for it. Process saves once more after it.
func (s *ackSaver) stop() {
	s.cancel()
	<-s.done
}
