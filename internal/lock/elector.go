package lock

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
)

// Exclusive lock timing. A standby tries the lock every StandbyPoll (jittered). The active
// watcher checks its lock session every checkInterval, each check bounded by checkTimeout, and
// stops delivering when a check fails: at most checkInterval + checkTimeout after the session
// ended. A standby that gets the lock waits SettleTime, longer than that, before it loads the
// token, so the two never deliver at the same time.
const (
	StandbyPoll   = time.Second
	SettleTime    = 2 * time.Second
	checkInterval = 500 * time.Millisecond
	checkTimeout  = time.Second
	retryMin      = 100 * time.Millisecond
	retryMax      = 5 * time.Second
)

// ErrNotHeld is the cause of a loss found by a query on the lock session.
var ErrNotHeld = errors.New("the lock session no longer holds the lock")

// Halves returns the pg_locks classid and objid of key: PostgreSQL shows a bigint advisory key
// as classid (high half) and objid (low half), both unsigned, with objsubid 1.
func Halves(key int64) (classid, objid int64) {
	return int64(uint64(key) >> 32), int64(uint64(key) & 0xffffffff)
}

// HeldBySessionSQL is a condition: this session holds the lock (classid, objid) in exclusive
// mode. Its arguments are SQL expressions, such as parameters ("$1").
func HeldBySessionSQL(classid, objid string) string {
	return `EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND granted AND mode = 'ExclusiveLock'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid::bigint = ` + classid + ` AND objid::bigint = ` + objid + ` AND objsubid = 1 AND pid = pg_backend_pid())`
}

// ElectorConfig is what an [Elector] needs.
type ElectorConfig struct {
	DB             *sql.DB       // sessions are connections held out of its pool, unless ConnString is set
	ConnString     string        // when set, each session is a connection of its own
	AppName        string        // application_name of such a connection, unless ConnString sets one
	ConnectTimeout time.Duration // its connect timeout, unless ConnString sets one
	// SessionTimeout bounds how long the server keeps a session whose host stopped answering
	// (TCP keepalives and user timeout, set on both ends); at least 4s.
	SessionTimeout time.Duration
	Key            int64 // the client's lock (see Key)
	Logger         *slog.Logger

	// TryFailed is told of each failed try (a session could not be opened, or the lock not
	// tried) and of the wait before the next one; Tried of each try that got an answer, the
	// lock taken or held by another session. Both run on the goroutine that called Wait.
	TryFailed func(err error, retryIn time.Duration)
	Tried     func()
}

// Elector is the exclusive lock of one watcher: [Elector.Wait] waits as a standby until its
// session holds the client's lock, [Elector.Settle] waits until a watcher that lost the lock
// has stopped, and [Elector.Keep] checks the session while the watcher is active. The watcher
// acts on what they return: it becomes active after Settle, and stops when Keep reports a loss.
type Elector struct {
	cfg         ElectorConfig // immutable
	boundWarned atomic.Bool   // the warning that a lock session cannot be bounded was logged
}

// NewElector returns an elector for cfg. It does not connect.
func NewElector(cfg ElectorConfig) *Elector { return &Elector{cfg: cfg} }

// Wait opens a lock session and tries the lock until it gets it, with a capped, jittered
// backoff after failures; it returns nil when ctx ends first.
func (e *Elector) Wait(ctx context.Context) Session {
	retry := backoff.Backoff{Min: retryMin, Max: retryMax}
	var s Session
	standby := false
	for {
		var (
			got bool
			err error
		)
		if s == nil {
			s, err = e.open(ctx)
		}
		if err == nil {
			if got, err = s.TryLock(ctx, e.cfg.Key); err != nil {
				s.Close()
				s = nil
			}
		}
		if ctx.Err() != nil {
			if s != nil {
				s.Close()
			}
			return nil
		}
		wait := backoff.Jitter(StandbyPoll)
		switch {
		case err != nil:
			wait = retry.Next()
			e.cfg.TryFailed(err, wait)
		case got:
			e.cfg.Tried()
			return s
		default:
			e.cfg.Tried()
			retry.Reset()
			if !standby {
				standby = true
				e.cfg.Logger.Info("another watcher of this client holds the exclusive lock: waiting as a standby")
			}
		}
		if !backoff.Sleep(ctx, wait) {
			if s != nil {
				s.Close()
			}
			return nil
		}
	}
}

// Settle waits SettleTime after the lock was taken, so that a watcher that lost it stops
// delivering first. It checks the session every checkInterval meanwhile, and at the end that
// the session still holds the lock; an error means it does not (ctx's error when ctx ended).
func (e *Elector) Settle(ctx context.Context, s Session) error {
	end := time.Now().Add(SettleTime)
	for {
		if !backoff.Sleep(ctx, min(checkInterval, time.Until(end))) {
			return ctx.Err()
		}
		last := !time.Now().Before(end)
		checkCtx, cancel := context.WithTimeout(ctx, checkTimeout)
		err := s.Ping(checkCtx)
		if err == nil && last {
			err = e.checkHeld(checkCtx, s)
		}
		cancel()
		if err != nil || last {
			return err
		}
	}
}

// checkHeld returns ErrNotHeld unless the session holds the client's lock.
func (e *Elector) checkHeld(ctx context.Context, s Session) error {
	c, o := Halves(e.cfg.Key)
	row, err := s.Query(ctx, `SELECT `+HeldBySessionSQL("$1", "$2"), strconv.FormatInt(c, 10), strconv.FormatInt(o, 10))
	switch {
	case err != nil:
		return err
	case len(row) != 1 || row[0].String != "t":
		return ErrNotHeld
	}
	return nil
}

// Keep checks the session every checkInterval while the watcher is active. It returns nil when
// ctx ends, and the error of the first failed check otherwise: the session, and so the lock,
// is lost.
func (e *Elector) Keep(ctx context.Context, s Session) error {
	t := time.NewTicker(checkInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		checkCtx, cancel := context.WithTimeout(ctx, checkTimeout)
		err := s.Ping(checkCtx)
		cancel()
		if err != nil && ctx.Err() == nil {
			return err
		}
	}
}
