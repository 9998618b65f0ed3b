package pgchangestream

import (
	"context"
	"errors"

	"github.com/pgchangestream/pgchangestream/internal/position"
)

// MarkProcessed acknowledges the earliest pending delivery whose token is token, and every
// delivery handed out before it (acknowledgements are cumulative in delivery order), then saves
// the checkpoint if it changed.
//
// An empty token, or the token of no pending delivery, acknowledges nothing but still saves a
// changed checkpoint: calling MarkProcessed again is how a caller retries after a failed save.
// A token that is not a decimal int64 returns an error wrapping [ErrInvalidToken]. A failed save
// returns an error; the acknowledgement is kept, so the next successful save includes it.
//
// With a batched [Config.CheckpointInterval], MarkProcessed acknowledges in memory and returns
// (reporting, once, a background save failure); after Close it saves before returning again.
// MarkProcessed is safe for concurrent use and works after Close.
func (w *Watcher) MarkProcessed(ctx context.Context, token []byte) error {
	if w.cfgErr != nil {
		return w.cfgErr
	}
	id, ok, tokenErr := position.ParseToken(token)
	if ok {
		w.ack(id)
	}
	if w.cfg.CheckpointInterval > 0 && !w.isClosed() {
		return joinErrors(tokenErr, w.takeBackgroundError())
	}
	return joinErrors(tokenErr, w.saveCheckpoint(ctx, saveChanged))
}

func (w *Watcher) isClosed() bool {
	w.lifeMu.Lock()
	defer w.lifeMu.Unlock()
	return w.closed
}

// joinErrors is errors.Join that returns a lone error unchanged.
func joinErrors(a, b error) error {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return errors.Join(a, b)
}
