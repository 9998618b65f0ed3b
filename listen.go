package pgchangestream

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgchangestream/pgchangestream/internal/listen"
)

// The connection defaults of the watcher's own sessions (LISTEN and the exclusive lock).
const (
	listenConnTimeout = 10 * time.Second
	defaultAppName    = "pgchangestream"
)

// newListener returns the LISTEN service (internal/listen) on pc: its notifications wake the
// reader and note id hints; its failures go to Health.
func (w *Watcher) newListener(pc *pgconn.Config) *listen.Listener {
	failed := newRepeatLog(w.log, slog.LevelWarn, "LISTEN connection failed; retrying")
	return listen.New(listen.Config{
		Conn:           pc,
		AppName:        defaultAppName,
		ConnectTimeout: listenConnTimeout,
		Channel:        w.cfg.NotifyChannel,
		Table:          w.cfg.TableName,
		Hints:          &w.hints,
		Logger:         w.log,
		NoIDs:          w.skipFree.Load,
		Wake:           w.wakeReader,
		OnConnect:      w.warnOtherWatchers,
		Failed: func(err error, retryIn time.Duration) {
			w.health.fail(opListen, fmt.Errorf("%s: %w", opListen, err))
			failed.fail("error", err, "retry_in", retryIn)
		},
		Connected: func() {
			failed.ok()
			w.health.ok(opListen)
		},
		Lost: func(err error) { w.health.fail(opListen, fmt.Errorf("%s lost: %w", opListen, err)) },
	})
}

// listenLoop is the listener goroutine: it runs the LISTEN service until ctx ends. A panic in
// it stops the watcher.
func (w *Watcher) listenLoop(ctx context.Context) {
	defer w.wg.Done()
	defer w.recoverPanic(opPanic, "LISTEN connection", w.stopWith)
	w.listen.Run(ctx)
}

// wakeReader asks the reader for a read, coalescing with a wake-up already waiting.
func (w *Watcher) wakeReader() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}
