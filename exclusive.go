package pgchangestream

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgchangestream/pgchangestream/internal/lock"
)

// lockHoldersSQL counts the sessions other than this one holding a client's lock, in any mode
// (see lock.Halves).
const lockHoldersSQL = `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 1 AND pid <> pg_backend_pid()`

// exclusive is the state of the exclusive lock.
type exclusive struct {
	mu      sync.Mutex
	active  bool         // the watcher delivers: it holds the lock, or is not exclusive
	lost    error        // the lock session was lost; saves are refused
	session lock.Session // held lock; nil when none
	warned  atomic.Bool  // the second-watcher warning was logged

	// gone is cancelled (once, by stopOwning) when the watcher stops owning its events: the
	// contexts of an exclusive watcher's handlers end with it. Set by newWatcher.
	gone     context.Context
	markGone context.CancelFunc
}

func (x *exclusive) isActive() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.active
}

// current returns the held lock session, nil when none.
func (x *exclusive) current() lock.Session {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.session
}

func (x *exclusive) lostErr() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.lost
}

// release ends the lock session, if one is held; later calls do nothing.
func (x *exclusive) release() {
	x.mu.Lock()
	s := x.session
	x.session, x.active = nil, false
	x.mu.Unlock()
	if s != nil {
		s.Close()
	}
}

// newElector returns the exclusive lock's service (internal/lock) for a watcher of
// Config.Exclusive: its sessions are bounded by Config.LockSessionTimeout, its failed tries go
// to Health.
func (w *Watcher) newElector() *lock.Elector {
	retrying := newRetryReport(&w.health, w.log, opLock, "cannot try the exclusive lock; retrying")
	return lock.NewElector(lock.ElectorConfig{
		DB:             w.cfg.DB,
		ConnString:     w.cfg.ConnString,
		AppName:        defaultAppName,
		ConnectTimeout: listenConnTimeout,
		SessionTimeout: w.cfg.LockSessionTimeout,
		Key:            lock.Key(w.cfg.TokenTable, w.cfg.ClientName),
		Logger:         w.log,
		TryFailed:      retrying.failed,
		Tried:          retrying.ok,
	})
}

// becomeActive returns true when the reader may start: at once without Config.Exclusive;
// otherwise once this watcher holds its client's lock, after waiting as a standby. It returns
// false when ctx ends first.
func (w *Watcher) becomeActive(ctx context.Context) bool {
	if !w.cfg.Exclusive {
		w.excl.mu.Lock()
		w.excl.active = true
		w.excl.mu.Unlock()
		w.health.startWork()
		return true
	}
	var s lock.Session
	for s == nil {
		if s = w.elector.Wait(ctx); s == nil {
			return false
		}
		w.excl.mu.Lock()
		w.excl.session = s
		w.excl.mu.Unlock()
		err := w.elector.Settle(ctx, s)
		if ctx.Err() != nil {
			w.excl.release()
			return false
		}
		if err != nil { // lost before delivering anything: wait for the lock again
			w.excl.release()
			s = nil
			w.health.fail(opLock, fmt.Errorf("%s: %w", opLock, err))
			w.log.Warn("lost the exclusive lock session before becoming active; waiting as a standby again", "error", err)
		}
	}
	w.excl.mu.Lock()
	w.excl.active = true
	w.excl.mu.Unlock()
	w.ownGen.Add(1)
	w.hints.Take() // ids notified while a standby: the read after the saved token covers them
	w.log.Info("holding the exclusive lock: active")
	w.wg.Add(1)
	go w.keepLock(ctx, s)
	w.health.startWork()
	return true
}

// keepLock checks the lock session while the watcher is active (lock.Elector.Keep). When ctx
// ends without Close it releases the lock (Close releases it after its final save); when the
// session is lost it stops the watcher.
func (w *Watcher) keepLock(ctx context.Context, s lock.Session) {
	defer w.wg.Done()
	defer w.recoverPanic(opLock, "exclusive lock check", w.loseLock) // the session can no longer be vouched for
	if err := w.elector.Keep(ctx, s); err != nil {
		w.loseLock(err)
		return
	}
	if !w.isClosed() {
		w.excl.release()
	}
}

// loseLock stops the watcher after its lock session was lost: the reader stops delivering and
// later saves are refused, since a standby may now hold the lock.
func (w *Watcher) loseLock(cause error) {
	err := fmt.Errorf("%w: %s session: %v", ErrExclusiveLost, opLock, cause)
	w.stopOwning(err, "lost the exclusive lock session; stopping so that a standby can take over")
}

// stopOwning stops a watcher that no longer owns its client, for err: it releases the lock
// session, refuses later saves with err and stops the reader.
func (w *Watcher) stopOwning(err error, msg string) {
	w.excl.mu.Lock()
	if w.excl.lost == nil {
		w.excl.lost = err
	}
	w.excl.mu.Unlock()
	w.excl.release()
	w.excl.markGone()
	if w.sh != nil {
		w.sh.markLost()
	}
	w.health.fail(opLock, err)
	w.log.Error(msg, "error", err)
	w.stopWith(err)
}

// warnOtherWatchers runs on a new LISTEN connection of a watcher without Config.Exclusive. It
// takes the client's lock in shared mode for the connection's life (so that an exclusive watcher
// or a token command waits for it) and logs, once, when another session holds the lock: another
// watcher with the same client name, whose deliveries and saves interleave with this one's.
func (w *Watcher) warnOtherWatchers(ctx context.Context, conn *pgconn.PgConn) {
	if w.cfg.Exclusive {
		return
	}
	key := lock.Key(w.cfg.TokenTable, w.cfg.ClientName)
	c, o := lock.Halves(key)
	res := conn.ExecParams(ctx, `SELECT pg_try_advisory_lock_shared($3), (`+lockHoldersSQL+`)`,
		[][]byte{itoa(c), itoa(o), itoa(key)}, nil, nil, nil).Read()
	if res.Err != nil || len(res.Rows) != 1 {
		if ctx.Err() == nil { // a watcher that is stopping has nothing to warn about
			w.log.Warn("cannot check for other watchers of this client", "error", res.Err)
		}
		return
	}
	if others := string(res.Rows[0][1]); others != "0" && !w.cfg.Shared && !w.excl.warned.Swap(true) { // members share by design
		w.log.Warn("another watcher with this client name is running; their deliveries and saved tokens interleave "+
			"(use Config.Exclusive, or a client name each)", "other_sessions", others)
	}
}

func itoa(n int64) []byte { return strconv.AppendInt(nil, n, 10) }
