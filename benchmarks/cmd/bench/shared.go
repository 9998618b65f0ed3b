package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/schema"
)

// Shared consumers: members of one client (Config.Shared), each a goroutine of this process
// with its own watcher and connection pool, running Process with the 2 ms handler.
const (
	// sharedTable is the captured table of the shared figures: sharedKeys rows, captured
	// without NOTIFY, so that a backlog can be written by a prepared transaction (see
	// writeSharedBacklog). Members poll.
	sharedTable = "shared_items"
	// sharedKeys is the number of rows of sharedTable: the record ids (units, keys) the events
	// spread over.
	sharedKeys = processKeys
	// sharedUpdates is the number of updates of every row that make a backlog: sharedRows events.
	sharedUpdates = 20
	sharedRows    = sharedKeys * sharedUpdates
	// sharedWorkers is ProcessOptions.Workers of each member.
	sharedWorkers = 8
	// sharedPoolSize is each member's connection pool.
	sharedPoolSize = 4
	// sharedPollInterval is the members' PollInterval: reads of a backlog run back to back
	// whatever it is; between backlogs, a slower poll keeps idle reads out of the counted ones.
	sharedPollInterval = 100 * time.Millisecond
	// sharedKillLease is the SharedLease of the members of the kill figure.
	sharedKillLease = 2 * time.Second
	// sharedWriteEvery and sharedWriteRows make the steady writes of the rebalance figures:
	// sharedWriteRows updates every sharedWriteEvery (1,000 events/s).
	sharedWriteEvery = 10 * time.Millisecond
	sharedWriteRows  = 10
)

// sharedMember is one member (or the unshared watcher compared with them).
type sharedMember struct {
	w       *pgchangestream.Watcher
	db      *sql.DB
	cancel  context.CancelFunc
	done    chan error   // Process's result
	handled atomic.Int64 // events its handler finished
	killed  bool         // its pool was closed under it; Close only releases its goroutines
}

// openPool opens a pool of at most size connections to d, its sessions named app.
func (d *database) openPool(app string, size int) (*sql.DB, error) {
	u, err := url.Parse(d.dsn)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", d.dsn, err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(size)
	db.SetMaxIdleConns(size)
	return db, nil
}

// sharedConfig is the configuration of a member of client (an unshared watcher unless shared).
func sharedConfig(db *sql.DB, client, name string, shared bool, lease time.Duration) pgchangestream.Config {
	return pgchangestream.Config{
		DB: db, ClientName: client, TableName: sharedTable, Mode: pgchangestream.ModePolling,
		PollInterval: sharedPollInterval, CheckpointInterval: batchedInterval, Logger: quietLogger,
		Shared: shared, SharedLease: lease, MemberName: name,
	}
}

// startMember starts a watcher of cfg on a pool of its own named app and runs Process on it
// with the 2 ms handler, which then calls onEvent with the event's changelog id.
func (d *database) startMember(ctx context.Context, cfg pgchangestream.Config, app string, onEvent func(int64)) (*sharedMember, error) {
	db, err := d.openPool(app, sharedPoolSize)
	if err != nil {
		return nil, err
	}
	cfg.DB = db
	w, err := pgchangestream.New(cfg)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	mctx, cancel := context.WithCancel(ctx)
	m := &sharedMember{w: w, db: db, cancel: cancel, done: make(chan error, 1)}
	w.Start(mctx)
	go func() {
		m.done <- w.Process(mctx, pgchangestream.ProcessOptions{Workers: sharedWorkers},
			func(_ context.Context, ev pgchangestream.EventWithToken) error {
				time.Sleep(processHandleTime)
				id, err := strconv.ParseInt(string(ev.ResumeToken), 10, 64)
				if err != nil {
					return fmt.Errorf("token %q: %w", ev.ResumeToken, err)
				}
				onEvent(id)
				m.handled.Add(1)
				return nil
			})
	}()
	return m, nil
}

// kill stops the member as a crash would: its context is cancelled and its pool closed, so it
// neither leaves nor renews its lease; its ranges are free once the lease runs out.
func (m *sharedMember) kill() {
	m.killed = true
	m.cancel()
	_ = m.db.Close()
}

// stop stops Process and closes the watcher (a member leaves) and its pool. For a killed member
// it only releases the goroutines (the final save fails on the closed pool).
func (m *sharedMember) stop(ctx context.Context) error {
	m.cancel()
	perr := <-m.done
	cerr := m.w.Close(ctx)
	_ = m.db.Close()
	if m.killed {
		return nil
	}
	if perr != nil {
		return fmt.Errorf("process: %w", perr)
	}
	return cerr
}

// stopAll stops the members, returning the first error.
func stopAll(ctx context.Context, ms []*sharedMember) error {
	var first error
	for _, m := range ms {
		if err := m.stop(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// fairSplit reports whether the members own every range once, each its share (the ranges
// divided by the members, give or take one).
func fairSplit(ms []*sharedMember) bool {
	var owned [pgchangestream.SharedRanges]bool
	count, lo, hi := 0, pgchangestream.SharedRanges/len(ms), (pgchangestream.SharedRanges+len(ms)-1)/len(ms)
	for _, m := range ms {
		rs := m.w.Stats().Shared.Ranges
		if len(rs) < lo || len(rs) > hi {
			return false
		}
		for _, r := range rs {
			if owned[r] {
				return false
			}
			owned[r] = true
			count++
		}
	}
	return count == pgchangestream.SharedRanges
}

// waitFor polls cond every millisecond until it holds, failing with what if ctx ends or a
// member stops first.
func waitFor(ctx context.Context, ms []*sharedMember, what string, cond func() bool) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		for _, m := range ms {
			if err := m.w.Err(); err != nil {
				return fmt.Errorf("waiting until %s: a member stopped: %w", what, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting until %s: %w", what, ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// newSharedDatabase copies the template and creates sharedTable with its sharedKeys rows,
// through a pool named app that is closed before it returns.
func (e *env) newSharedDatabase(ctx context.Context) (*database, error) {
	d, err := e.newDatabase(ctx, upgraded)
	if err != nil {
		return nil, err
	}
	err = d.withSetupPool(ctx, func(db *sql.DB) error {
		if _, err := db.ExecContext(ctx, `CREATE TABLE `+sharedTable+` (id int PRIMARY KEY, n bigint NOT NULL, doc jsonb NOT NULL)`); err != nil {
			return err
		}
		if _, err := schema.Capture(ctx, db, sharedTable, schema.Options{WithoutNotify: true}); err != nil {
			return err
		}
		_, err := db.ExecContext(ctx, `INSERT INTO `+sharedTable+` (id, n, doc) SELECT g, 0, `+docSQL+`
			FROM generate_series(1, $1::int) g`, sharedKeys)
		return err
	})
	if err != nil {
		d.drop(ctx)
		return nil, fmt.Errorf("create %s: %w", sharedTable, err)
	}
	return d, nil
}

// setupApp names the sessions that write setups and backlogs.
const setupApp = "bench-setup"

// withSetupPool runs f on a pool of its own and closes it, then waits until its sessions have
// ended: a session's statistics reach the pg_stat views at the latest when it ends, so what f
// did is then counted, and nothing of it comes later.
func (d *database) withSetupPool(ctx context.Context, f func(*sql.DB) error) error {
	db, err := d.openPool(setupApp, 1)
	if err != nil {
		return err
	}
	err = f(db)
	_ = db.Close()
	if err != nil {
		return err
	}
	return d.waitSessionsGone(ctx, setupApp)
}

// waitSessionsGone waits until no session named app (or app-…) is connected to the database.
func (d *database) waitSessionsGone(ctx context.Context, app string) error {
	for {
		var n int
		if err := d.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND (application_name = $1 OR application_name LIKE $1 || '-%')`,
			app).Scan(&n); err != nil || n == 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d sessions %s still connected: %w", n, app, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// backlogGID is the prepared transaction holding a backlog.
const backlogGID = "bench_shared_backlog"

// writeSharedBacklog updates every row of sharedTable sharedUpdates times in one transaction
// and prepares it: its sharedRows changelog rows exist, their writing is counted in the
// pg_stat views, and no reader sees them until COMMIT PREPARED.
func (d *database) writeSharedBacklog(ctx context.Context) error {
	return d.withSetupPool(ctx, func(db *sql.DB) error {
		conn, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		stmts := []string{`BEGIN`}
		for range sharedUpdates {
			stmts = append(stmts, `UPDATE `+sharedTable+` SET n = n + 1`)
		}
		for _, stmt := range append(stmts, `PREPARE TRANSACTION '`+backlogGID+`'`) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				_, _ = conn.ExecContext(ctx, `ROLLBACK`)
				return fmt.Errorf("write the backlog (%s): %w", stmt, err)
			}
		}
		return nil
	})
}

// changelogReads are the pg_stat counters of the changelog and its indexes.
type changelogReads struct {
	indexEntries, indexBlocks, heapBlocks int64
}

// readCounters returns the changelog's counters as the pg_stat views have them.
func (d *database) readCounters(ctx context.Context) (changelogReads, error) {
	var c changelogReads
	if _, err := d.ExecContext(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		return c, err
	}
	err := d.QueryRowContext(ctx, `SELECT
		(SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes WHERE relid = $1::regclass),
		(SELECT coalesce(sum(idx_blks_hit + idx_blks_read), 0) FROM pg_statio_user_indexes WHERE relid = $1::regclass),
		(SELECT heap_blks_hit + heap_blks_read FROM pg_statio_user_tables WHERE relid = $1::regclass)`,
		changelogTable).Scan(&c.indexEntries, &c.indexBlocks, &c.heapBlocks)
	return c, err
}
