package pgchangestream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/lock"
)

// Exclusive lock timing. A standby tries the lock every standbyPoll (jittered). The active
// watcher checks its lock session every lockCheckInterval, each check bounded by
// lockCheckTimeout, and stops delivering when a check fails: at most lockCheckInterval +
// lockCheckTimeout after the session ended. A standby that gets the lock waits lockSettle,
// longer than that, before it loads the token, so the two never deliver at the same time.
const (
	standbyPoll       = time.Second
	lockCheckInterval = 500 * time.Millisecond
	lockCheckTimeout  = time.Second
	lockSettle        = 2 * time.Second
	lockRetryMin      = 100 * time.Millisecond
	lockRetryMax      = 5 * time.Second
)

// lockHoldersSQL counts the sessions other than this one holding a client's lock, in any mode.
// PostgreSQL shows a bigint advisory key as classid (high half) and objid (low half), objsubid 1.
const lockHoldersSQL = `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 1 AND pid <> pg_backend_pid()`

// heldBySessionSQL is a condition: this session holds the lock (classid, objid) in exclusive
// mode.
func heldBySessionSQL(classid, objid string) string {
	return `EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND granted AND mode = 'ExclusiveLock'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid::bigint = ` + classid + ` AND objid::bigint = ` + objid + ` AND objsubid = 1 AND pid = pg_backend_pid())`
}

// errNotHeld is the cause of a loss found by a query on the lock session.
var errNotHeld = errors.New("the lock session no longer holds the lock")

// lockHalves returns the pg_locks classid and objid of key.
func lockHalves(key int64) (classid, objid int64) {
	return int64(uint64(key) >> 32), int64(uint64(key) & 0xffffffff)
}

// exclusive is the state of the exclusive lock.
type exclusive struct {
	mu      sync.Mutex
	active  bool        // the watcher delivers: it holds the lock, or is not exclusive
	lost    error       // the lock session was lost; saves are refused
	session lockSession // held lock; nil when none
	warned  atomic.Bool // the second-watcher warning was logged

	boundWarned atomic.Bool // the warning that the lock session cannot be bounded was logged

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
func (x *exclusive) current() lockSession {
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
		s.close()
	}
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
	var s lockSession
	for s == nil {
		if s = w.waitForLock(ctx); s == nil {
			return false
		}
		w.excl.mu.Lock()
		w.excl.session = s
		w.excl.mu.Unlock()
		err := w.settle(ctx, s)
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

// settle waits lockSettle after the lock was taken, so that a watcher that lost it stops
// delivering first. It checks the session every lockCheckInterval meanwhile, and at the end
// that the session still holds the lock; an error means it does not.
func (w *Watcher) settle(ctx context.Context, s lockSession) error {
	end := time.Now().Add(lockSettle)
	for {
		if !backoff.Sleep(ctx, min(lockCheckInterval, time.Until(end))) {
			return ctx.Err()
		}
		last := !time.Now().Before(end)
		checkCtx, cancel := context.WithTimeout(ctx, lockCheckTimeout)
		err := s.ping(checkCtx)
		if err == nil && last {
			err = w.checkHeld(checkCtx, s)
		}
		cancel()
		if err != nil || last {
			return err
		}
	}
}

// checkHeld returns errNotHeld unless the session holds the client's lock.
func (w *Watcher) checkHeld(ctx context.Context, s lockSession) error {
	c, o := lockHalves(lock.Key(w.cfg.TokenTable, w.cfg.ClientName))
	row, err := s.query(ctx, `SELECT `+heldBySessionSQL("$1", "$2"), string(itoa(c)), string(itoa(o)))
	switch {
	case err != nil:
		return err
	case len(row) != 1 || row[0].String != "t":
		return errNotHeld
	}
	return nil
}

// waitForLock opens a lock session and tries the lock until it gets it (nil when ctx ends).
func (w *Watcher) waitForLock(ctx context.Context) lockSession {
	key := lock.Key(w.cfg.TokenTable, w.cfg.ClientName)
	retry := backoff.Backoff{Min: lockRetryMin, Max: lockRetryMax}
	failed := newRepeatLog(w.log, slog.LevelWarn, "cannot try the exclusive lock; retrying")
	var s lockSession
	standby := false
	for {
		var (
			got bool
			err error
		)
		if s == nil {
			s, err = w.openLockSession(ctx)
		}
		if err == nil {
			if got, err = s.tryLock(ctx, key); err != nil {
				s.close()
				s = nil
			}
		}
		if ctx.Err() != nil {
			if s != nil {
				s.close()
			}
			return nil
		}
		wait := backoff.Jitter(standbyPoll)
		switch {
		case err != nil:
			w.health.fail(opLock, fmt.Errorf("%s: %w", opLock, err))
			wait = retry.Next()
			failed.fail("error", err, "retry_in", wait)
		case got:
			failed.ok()
			w.health.ok(opLock)
			return s
		default:
			failed.ok()
			w.health.ok(opLock)
			retry.Reset()
			if !standby {
				standby = true
				w.log.Info("another watcher of this client holds the exclusive lock: waiting as a standby")
			}
		}
		if !backoff.Sleep(ctx, wait) {
			if s != nil {
				s.close()
			}
			return nil
		}
	}
}

// keepLock checks the lock session while the watcher is active. When ctx ends without Close it
// releases the lock (Close releases it after its final save); when the session is lost it stops
// the watcher.
func (w *Watcher) keepLock(ctx context.Context, s lockSession) {
	defer w.wg.Done()
	defer w.recoverPanic(opLock, "exclusive lock check", w.loseLock) // the session can no longer be vouched for
	t := time.NewTicker(lockCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if !w.isClosed() {
				w.excl.release()
			}
			return
		case <-t.C:
		}
		checkCtx, cancel := context.WithTimeout(ctx, lockCheckTimeout)
		err := s.ping(checkCtx)
		cancel()
		if err != nil && ctx.Err() == nil {
			w.loseLock(err)
			return
		}
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
	c, o := lockHalves(key)
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
