package pgchangestream

import (
	"context"
	"database/sql"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pgchangestream/pgchangestream/internal/lock"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/schema"
	"github.com/stretchr/testify/require"
)

// lockHolder returns the backend pid holding client "c"'s lock in exclusive mode, 0 if none.
func (e *liveEnv) lockHolder() int {
	e.t.Helper()
	c, o := lock.Halves(lock.Key(DefaultTokenTable, "c"))
	var pid int
	err := e.db.QueryRow(`SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND mode = 'ExclusiveLock'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 1`, c, o).Scan(&pid)
	if err == sql.ErrNoRows {
		return 0
	}
	require.NoError(e.t, err)
	return pid
}

// terminate ends a backend, as an administrator's pg_terminate_backend or a network failure.
func (e *liveEnv) terminate(pid int) {
	e.t.Helper()
	var ok bool
	require.NoError(e.t, e.db.QueryRow(`SELECT pg_terminate_backend($1)`, pid).Scan(&ok))
	require.True(e.t, ok, "terminate backend %d", pid)
}

// timedDelivery is one delivery and when the consumer got it.
type timedDelivery struct {
	id int64
	at time.Time
}

// ackingConsumer takes every delivery of w, records it and acknowledges it, counting the
// acknowledgements whose save succeeded, until Events closes.
type ackingConsumer struct {
	mu    sync.Mutex
	got   []timedDelivery
	saves atomic.Int64
	done  chan struct{}
}

func consumeAndAck(t *testing.T, w *Watcher) *ackingConsumer {
	c := &ackingConsumer{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for ev := range w.Events() {
			id, ok, err := position.ParseToken(ev.ResumeToken)
			if err != nil || !ok {
				t.Errorf("bad token %q", ev.ResumeToken)
				return
			}
			c.mu.Lock()
			c.got = append(c.got, timedDelivery{id, time.Now()})
			c.mu.Unlock()
			if w.MarkProcessed(context.Background(), ev.ResumeToken) == nil {
				c.saves.Add(1)
			}
		}
	}()
	return c
}

func (c *ackingConsumer) deliveries() []timedDelivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]timedDelivery(nil), c.got...)
}

// overlapping counts the deliveries of a made after b's first one, and those of b made before
// a's last one: rows the two delivered at the same time.
func overlapping(a, b []timedDelivery) int {
	if len(a) == 0 || len(b) == 0 {
		return 0
	}
	n := 0
	for _, d := range a {
		if !d.at.Before(b[0].at) {
			n++
		}
	}
	for _, d := range b {
		if !d.at.After(a[len(a)-1].at) {
			n++
		}
	}
	return n
}

// TestLiveExclusiveLockLostWhileSettling: contract rule 18. The lock session of a watcher that
// has just taken the lock is terminated during its settle wait, and a second watcher takes the
// lock at once. The first must not become active: the two never deliver at the same time, and
// the first saves nothing.
func TestLiveExclusiveLockLostWhileSettling(t *testing.T) {
	t.Parallel()
	for try := 1; try <= 3; try++ {
		if lockLostWhileSettling(t) {
			return
		}
		t.Logf("try %d: the first watcher took the lock again, on a new session, before the second tried: trying again", try)
	}
	t.Fatal("the second watcher never got the lock first")
}

// lockLostWhileSettling runs one trial of TestLiveExclusiveLockLostWhileSettling. It reports
// false, having checked nothing, when the first watcher, back to waiting as a standby, took the
// lock again on a new session (as it may) before the second watcher tried.
func lockLostWhileSettling(t *testing.T) bool {
	e := newLive(t)
	writers := e.startWriters(2, 0)
	defer writers.stop()
	cfg := e.config(ModeHybrid)
	cfg.Exclusive, cfg.StartFromBeginning = true, true
	first := e.start(cfg)
	var pid int
	waitFor(t, func() bool { pid = e.lockHolder(); return pid != 0 }, "the first watcher takes the lock")
	require.False(t, first.Stats().Active, "settling")
	e.terminate(pid)
	lost := time.Now()
	a := consumeAndAck(t, first)
	second := e.start(cfg)
	b := consumeAndAck(t, second)
	waitFor(t, func() bool { return second.Stats().Active || first.Stats().Active }, "a watcher takes over")
	if !second.Stats().Active {
		_ = first.Close(context.Background())
		_ = second.Close(context.Background())
		<-a.done
		<-b.done
		return false
	}
	time.Sleep(lock.SettleTime) // the first watcher's settle wait has long ended
	writers.stop()
	_ = first.Close(context.Background()) // an error when it lost the lock after activating
	<-a.done
	da, db := a.deliveries(), b.deliveries()
	require.NotEmpty(t, db, "the second watcher delivers")
	overlap := overlapping(da, db)
	t.Logf("lock session lost while settling: first watcher delivered %d rows and saved %d times (%d writes), "+
		"%d rows delivered by both at once; second took over %v after the loss",
		len(da), a.saves.Load(), first.Stats().CheckpointWrites, overlap, db[0].at.Sub(lost).Round(time.Millisecond))
	require.Zero(t, overlap, "rows delivered by both watchers at once")
	require.Zero(t, first.Stats().CheckpointWrites, "the watcher that lost the lock saves nothing")
	return true
}

// pausingTracer holds back, once armed, the next token save of its connections until released:
// a process paused (GC, SIGSTOP, a frozen VM) right before its save reaches the server.
type pausingTracer struct {
	armed   atomic.Bool
	paused  chan struct{} // closed when a save is held
	release chan struct{} // closed by the test to let it go
}

func (p *pausingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	save := strings.Contains(d.SQL, `"resume_tokens"`) && strings.Contains(d.SQL, "resume_token =")
	if save && p.armed.CompareAndSwap(true, false) {
		close(p.paused)
		<-p.release
	}
	return ctx
}

func (p *pausingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestLiveExclusivePausedOwnerIsFenced: contract rule 18. The active watcher is paused right
// before a save, longer than the settle time, and loses its lock session meanwhile; a standby
// takes over, delivers, and acknowledges only part of what it delivered. When the paused
// watcher wakes up, its save is refused and the successor's token is untouched: it never
// passes the successor's unacknowledged deliveries.
func TestLiveExclusivePausedOwnerIsFenced(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	pausedDB, tracer := e.pausableDB()

	cfg := e.config(ModePolling) // the lock session is a connection of DB
	cfg.Exclusive, cfg.StartFromBeginning = true, true
	ownerCfg := cfg
	ownerCfg.DB = pausedDB
	owner := e.start(ownerCfg)
	waitFor(t, func() bool { return owner.Stats().Active }, "the owner takes the lock")
	standby := e.start(cfg)
	var wake sync.Once
	t.Cleanup(func() { wake.Do(func() { close(tracer.release) }) }) // before the watchers close
	ids := e.insert(10)
	require.Equal(t, ids, receiveWithin(t, owner, 10, liveWait))
	waitFor(t, func() bool { return owner.Stats().CheckpointWrites > 0 }, "the owner saved its start")

	tracer.armed.Store(true)
	saved := make(chan error, 1)
	go func() { saved <- owner.MarkProcessed(context.Background(), tok(ids[9])) }()
	<-tracer.paused
	e.terminate(e.lockHolder())
	requireClosed(t, owner)
	require.Equal(t, ids, receiveWithin(t, standby, 10, takeoverWait), "the successor resumes after the owner's start")
	require.NoError(t, standby.MarkProcessed(context.Background(), tok(ids[4])))
	successor := e.savedToken("c")
	require.Equal(t, ids[4], successor.ID)
	successorRaw := e.rawToken("c")

	wake.Do(func() { close(tracer.release) }) // the owner wakes up and saves
	err := <-saved
	after, afterRaw := e.savedToken("c"), e.rawToken("c")
	skipped := 0
	for _, id := range ids[5:] {
		if id <= after.ID {
			skipped++
		}
	}
	t.Logf("paused owner woke up: save error %v; token after %d (successor's %d): %d of the successor's "+
		"unacknowledged deliveries passed", err, after.ID, successor.ID, skipped)
	require.ErrorIs(t, err, ErrExclusiveLost, "the paused owner's save is refused")
	require.Equal(t, successorRaw, afterRaw, "the successor's token is untouched")
}

// TestLiveExclusiveMixedTokenStates: contract rule 18 across upgrades. A token row written by an
// old release (owner_epoch NULL) is claimed; a token table without the column (not upgraded)
// leaves exclusive watchers lock-only, with one warning at Start, and their hand-over works.
func TestLiveExclusiveMixedTokenStates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("old row", func(t *testing.T) {
		e := newLive(t)
		ids := e.insert(3)
		_, err := e.db.Exec(`INSERT INTO resume_tokens (client_name, resume_token) VALUES ('c', $1::jsonb)`,
			string(position.EncodeToken(e.position(ids[0]), liveTable)))
		require.NoError(t, err)
		cfg := e.config(ModeHybrid)
		cfg.Exclusive = true
		w := e.start(cfg)
		require.Equal(t, ids[1:], receiveWithin(t, w, 2, takeoverWait), "resumes after the old row's token")
		var epoch sql.NullInt64
		require.NoError(t, e.db.QueryRow(`SELECT owner_epoch FROM resume_tokens WHERE client_name = 'c'`).Scan(&epoch))
		require.Equal(t, sql.NullInt64{Int64: 1, Valid: true}, epoch, "the NULL epoch is claimed")
		require.NoError(t, w.MarkProcessed(ctx, tok(ids[2])))
		require.Equal(t, e.position(ids[2]), e.savedToken("c"))
	})
	t.Run("table not upgraded", func(t *testing.T) {
		e := newLive(t)
		_, err := e.db.Exec(`ALTER TABLE resume_tokens DROP COLUMN owner_epoch`)
		require.NoError(t, err)
		logs := newLogCounter()
		cfg := e.config(ModeHybrid)
		cfg.Exclusive, cfg.StartFromBeginning, cfg.Logger = true, true, slog.New(logs)
		unfenced := "the token table has no owner_epoch column: saves of exclusive watchers are not fenced, " +
			"so a watcher paused past the hand-over could overwrite its successor's token; upgrade it with " +
			"schema.Install, or the statements it lists with DryRun"
		active := e.start(cfg)
		waitFor(t, func() bool { return active.Stats().Active }, "the first watcher takes the lock")
		standby := e.start(cfg)
		ids := e.insert(3)
		require.Equal(t, ids, receiveWithin(t, active, 3, takeoverWait))
		require.NoError(t, active.MarkProcessed(ctx, tok(ids[1])))
		logs.waitFor(t, unfenced, 1, liveWait)
		require.NoError(t, active.Close(ctx))
		requireTakeover(t, e, standby, ids[2], time.Now())
		logs.waitFor(t, unfenced, 2, liveWait) // once per watcher

		before := e.rawToken("c")
		require.NoError(t, errOf(schema.Install(ctx, e.db, schema.Options{})), "the upgrade adds the column beside a running watcher")
		var epoch sql.NullInt64
		require.NoError(t, e.db.QueryRow(`SELECT owner_epoch FROM resume_tokens WHERE client_name = 'c'`).Scan(&epoch))
		require.False(t, epoch.Valid, "existing rows keep a NULL epoch")
		require.Equal(t, before, e.rawToken("c"))
	})
}

// TestLiveTokenResetFencesAPausedOwner: a reset while the owner is paused past the loss of its
// lock moves the owner epoch on, so the owner's late save does not undo the reset.
func TestLiveTokenResetFencesAPausedOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLive(t)
	pausedDB, tracer := e.pausableDB()
	cfg := e.config(ModePolling)
	cfg.DB, cfg.Exclusive, cfg.StartFromBeginning = pausedDB, true, true
	owner := e.start(cfg)
	var wake sync.Once
	t.Cleanup(func() { wake.Do(func() { close(tracer.release) }) })
	ids := e.insert(3)
	require.Equal(t, ids, receiveWithin(t, owner, 3, takeoverWait))
	tracer.armed.Store(true)
	saved := make(chan error, 1)
	go func() { saved <- owner.MarkProcessed(ctx, tok(ids[2])) }()
	<-tracer.paused
	e.terminate(e.lockHolder())
	requireClosed(t, owner)
	require.NoError(t, resetTo(ctx, e.db, "c", e.position(ids[0]), ""))
	reset := e.rawToken("c")
	wake.Do(func() { close(tracer.release) })
	require.ErrorIs(t, <-saved, ErrFenced)
	require.Equal(t, reset, e.rawToken("c"), "the reset stands")
}

// pausableDB opens a pool on the test's database whose statements tracer can hold back, as a
// paused process would.
func (e *liveEnv) pausableDB() (*sql.DB, *pausingTracer) {
	e.t.Helper()
	connCfg, err := pgx.ParseConfig(e.dsn)
	require.NoError(e.t, err)
	tracer := &pausingTracer{paused: make(chan struct{}), release: make(chan struct{})}
	connCfg.Tracer = tracer
	db := stdlib.OpenDB(*connCfg)
	e.t.Cleanup(func() { _ = db.Close() })
	return db, tracer
}
