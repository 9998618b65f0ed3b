package pgchangestream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// LISTEN connection timing: reconnect backoff, and how long the connection may stay silent
// before it is pinged.
const (
	listenRetryMin     = 100 * time.Millisecond
	listenRetryMax     = 5 * time.Second
	listenPingInterval = 5 * time.Second
	listenPingTimeout  = 5 * time.Second
	listenConnTimeout  = 10 * time.Second
	maxHints           = 1 << 16
	defaultAppName     = "pgchangestream"
)

// setListenConfig prepares the LISTEN connection's configuration. Notifications are handled by
// onNotification on the listener goroutine.
func (w *Watcher) setListenConfig(pc *pgconn.Config) {
	if _, ok := pc.RuntimeParams["application_name"]; !ok {
		pc.RuntimeParams["application_name"] = defaultAppName
	}
	pc.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		w.onNotification(n.Payload)
	}
	if pc.ConnectTimeout == 0 {
		pc.ConnectTimeout = listenConnTimeout
	}
	w.listen = pc
}

// listenLoop is the listener goroutine: it owns the LISTEN connection, reconnects with capped
// exponential backoff and jitter, pings when idle, and wakes the reader after every (re)connect
// for a catch-up read, since notifications sent while disconnected are lost. It never sends
// events itself.
func (w *Watcher) listenLoop(ctx context.Context) {
	defer w.wg.Done()
	first := true
	firstAttemptDone := func() {
		if first {
			first = false
			close(w.ready)
		}
	}
	defer firstAttemptDone()
	defer w.recoverPanic(opPanic, "LISTEN connection", w.stopWith)
	retry := backoff.Backoff{Min: listenRetryMin, Max: listenRetryMax}
	failed := newRepeatLog(w.log, slog.LevelWarn, "LISTEN connection failed; retrying")
	for {
		conn, err := w.connectListener(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			w.health.fail(opListen, fmt.Errorf("%s: %w", opListen, err))
			firstAttemptDone()
			wait := retry.Next()
			failed.fail("error", err, "retry_in", wait)
			if !backoff.Sleep(ctx, wait) {
				return
			}
			continue
		}
		retry.Reset()
		failed.ok()
		w.health.ok(opListen)
		firstAttemptDone()
		w.wakeReader()
		err = w.receive(ctx, conn)
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = conn.Close(closeCtx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		w.health.fail(opListen, fmt.Errorf("%s lost: %w", opListen, err))
		w.log.Warn("LISTEN connection lost; reconnecting", "error", err)
	}
}

// connectListener opens the connection and runs LISTEN.
func (w *Watcher) connectListener(ctx context.Context) (*pgconn.PgConn, error) {
	conn, err := pgconn.ConnectConfig(ctx, w.listen)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+changelog.Quote(w.cfg.NotifyChannel)).ReadAll(); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("listen %q: %w", w.cfg.NotifyChannel, err)
	}
	w.log.Info("listening", "channel", w.cfg.NotifyChannel)
	w.warnOtherWatchers(ctx, conn)
	return conn, nil
}

// receive waits for notifications in short slices, pinging the server when it has been silent,
// until the connection fails or ctx ends.
func (w *Watcher) receive(ctx context.Context, conn *pgconn.PgConn) error {
	for {
		waitCtx, cancel := context.WithTimeout(ctx, listenPingInterval)
		err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case err == nil:
			continue
		case ctx.Err() != nil:
			return ctx.Err()
		case !pgconn.Timeout(err) || conn.IsClosed():
			return err
		}
		pingCtx, cancel := context.WithTimeout(ctx, listenPingTimeout)
		err = conn.Ping(pingCtx)
		cancel()
		if err != nil {
			return fmt.Errorf("ping: %w", err)
		}
	}
}

// notifyPayload is the trigger's NOTIFY payload.
type notifyPayload struct {
	ID        *int64 `json:"id"`
	Table     string `json:"table"`
	Operation string `json:"operation"`
}

// onNotification turns a NOTIFY for this table into a wake-up and, on a legacy changelog, an id
// hint. A payload that cannot be parsed is logged and still wakes the reader.
func (w *Watcher) onNotification(payload string) {
	var p notifyPayload
	if err := json.Unmarshal([]byte(payload), &p); err != nil || p.ID == nil {
		if err == nil {
			err = errors.New(`no "id"`)
		}
		w.log.Warn("ignoring a malformed NOTIFY payload", "payload", payload, "error", err)
		w.wakeReader()
		return
	}
	if p.Table != "" && p.Table != w.cfg.TableName {
		return
	}
	if w.skipFree.Load() { // snapshot deltas find every row: the id is not needed
		w.wakeReader()
		return
	}
	w.hintMu.Lock()
	firstLost := false
	if len(w.hints) < maxHints {
		w.hints = append(w.hints, *p.ID)
	} else if !w.hintsLost {
		w.hintsLost, firstLost = true, true
	}
	w.hintMu.Unlock()
	if firstLost {
		w.log.Warn("too many NOTIFY ids waiting for the reader; dropping ids (a late row may be missed)", "max", maxHints)
	}
	w.wakeReader()
}

// wakeReader asks the reader for a read, coalescing with a wake-up already waiting.
func (w *Watcher) wakeReader() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// takeHints returns the ids named by notifications since the last call.
func (w *Watcher) takeHints() []int64 {
	w.hintMu.Lock()
	defer w.hintMu.Unlock()
	h := w.hints
	w.hints = nil
	w.hintsLost = false
	return h
}

// returnHints puts back ids the reader could not look at yet, ahead of newer ones.
func (w *Watcher) returnHints(ids []int64) {
	if len(ids) == 0 {
		return
	}
	w.hintMu.Lock()
	defer w.hintMu.Unlock()
	w.hints = append(ids, w.hints...)
	if len(w.hints) > maxHints {
		w.hints = w.hints[:maxHints]
	}
}

// recentIDs remembers the ids of the last rows read (delivered or filtered), so that a NOTIFY
// for a row already read is not mistaken for a late row. Reader goroutine only.
type recentIDs struct {
	ring  []int64
	next  int
	full  bool
	count map[int64]int32
}

func newRecentIDs(capacity int) *recentIDs {
	return &recentIDs{ring: make([]int64, capacity), count: make(map[int64]int32, capacity)}
}

func (r *recentIDs) add(id int64) {
	if r.full {
		old := r.ring[r.next]
		if r.count[old]--; r.count[old] <= 0 {
			delete(r.count, old)
		}
	}
	r.ring[r.next] = id
	r.count[id]++
	r.next++
	if r.next == len(r.ring) {
		r.next = 0
		r.full = true
	}
}

func (r *recentIDs) contains(id int64) bool {
	_, ok := r.count[id]
	return ok
}
