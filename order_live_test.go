package pgchangestream

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// Contract rule 16 on the upgraded schema: one row's changes arrive in commit order. The
// transaction-id order of a delta is not commit order: a transaction that wrote elsewhere first
// holds the lower id, and its change of a row can still commit after another transaction's
// change of the same row, whose row lock it waited for.

// rowChange is one delivered change of an items row: its record and the n it set.
type rowChange struct {
	record string
	n      int
}

// changeOf returns the record and the n of a delivered items change.
func changeOf(t *testing.T, ev Event) rowChange {
	t.Helper()
	key, _ := ev["documentKey"].(map[string]any)
	doc, _ := ev["fullDocument"].(map[string]any)
	n, ok := doc["n"].(float64)
	require.True(t, ok, "event without fullDocument.n: %v", ev)
	return rowChange{record: fmt.Sprint(key["_id"]), n: int(n)}
}

// changeLog records, per record, the n of each change in first-delivery order (a redelivered
// change, replayed after a restart, is not delivered again out of order).
type changeLog struct {
	mu   sync.Mutex
	seen map[int64]bool
	byID map[string][]int
}

func newChangeLog() *changeLog { return &changeLog{seen: map[int64]bool{}, byID: map[string][]int{}} }

// consume receives w's deliveries until Events closes, recording and acknowledging each; the
// returned function waits for the end.
func (c *changeLog) consume(t *testing.T, w *Watcher) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.Events() {
			id, _, err := position.ParseToken(ev.ResumeToken)
			if err != nil {
				t.Errorf("token %q: %v", ev.ResumeToken, err)
				continue
			}
			ch := changeOf(t, ev.Event)
			c.mu.Lock()
			if !c.seen[id] {
				c.seen[id] = true
				c.byID[ch.record] = append(c.byID[ch.record], ch.n)
			}
			c.mu.Unlock()
			if err := w.MarkProcessed(context.Background(), ev.ResumeToken); err != nil {
				t.Errorf("MarkProcessed(%d): %v", id, err)
			}
		}
	}()
	t.Cleanup(func() {
		_ = w.Close(context.Background())
		<-done
	})
	return func() { <-done }
}

// count returns the number of changes delivered.
func (c *changeLog) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

// outOfOrder returns how many changes were delivered after a change of their row that
// committed later (a higher n).
func (c *changeLog) outOfOrder() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	bad := 0
	for _, ns := range c.byID {
		top := 0
		for _, n := range ns {
			if n < top {
				bad++
			}
			top = max(top, n)
		}
	}
	return bad
}

// waitCount waits until at least n changes were delivered, failing after within.
func (c *changeLog) waitCount(t *testing.T, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for c.count() < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	require.GreaterOrEqual(t, c.count(), n, "changes delivered")
}

// newItem inserts an items row with n = 0 and returns its id.
func (e *liveEnv) newItem() string {
	e.t.Helper()
	var id string
	require.NoError(e.t, e.db.QueryRow(`INSERT INTO items (n) VALUES (0) RETURNING id::text`).Scan(&id))
	return id
}

// heldDB returns a pool of one connection for a watcher, and hold, which takes that connection
// away from the watcher until release is called: the watcher's reads wait meanwhile, so commits
// made while it is held land in one delta.
func (e *liveEnv) heldDB() (db *sql.DB, hold func() (release func())) {
	e.t.Helper()
	db, err := sql.Open("pgx", e.dsn)
	require.NoError(e.t, err)
	db.SetMaxOpenConns(1)
	e.t.Cleanup(func() { db.Close() })
	return db, func() func() {
		conn, err := db.Conn(context.Background())
		require.NoError(e.t, err)
		return func() { require.NoError(e.t, conn.Close()) }
	}
}

// TestLiveSameRowCommitOrder proves rule 16 in every mode for the two-transaction case: T2
// writes elsewhere first (so it holds the lower transaction id), T1 sets row R's n to 1, T2's
// update of R to 2 waits for T1's row lock; T1 commits, then T2. Both commits land in one read
// (the watcher's only connection is held meanwhile), and R's change by T1 is delivered first.
func TestLiveSameRowCommitOrder(t *testing.T) {
	runModes(t, allModes, newLive, func(t *testing.T, e *liveEnv, mode Mode) {
		cfg := e.config(mode)
		db, hold := e.heldDB()
		cfg.DB = db
		w := e.start(cfg)
		waitStartSaved(t, w)
		got := newChangeLog()
		got.consume(t, w)
		const rounds = 3
		want := 0
		for range rounds {
			r := e.newItem()
			want++
			release := hold()
			t2, t1 := e.openTx(), e.openTx()
			insertItem(t, t2) // elsewhere first: T2 has the lower transaction id
			want++
			_, err := t1.Exec(`UPDATE items SET n = 1 WHERE id = $1`, r)
			require.NoError(t, err)
			blocked := make(chan error, 1)
			go func() {
				_, err := t2.Exec(`UPDATE items SET n = 2 WHERE id = $1`, r)
				blocked <- err
			}()
			select {
			case err := <-blocked:
				t.Fatalf("T2's update did not wait for T1's row lock: %v", err)
			case <-time.After(50 * time.Millisecond):
			}
			require.NoError(t, t1.Commit())
			require.NoError(t, <-blocked)
			require.NoError(t, t2.Commit())
			want += 2
			release()
			got.waitCount(t, want, liveWait)
		}
		require.Equal(t, want, got.count())
		require.Zero(t, got.outOfOrder(), "changes of one row delivered out of commit order, in %d rounds", rounds)
	})
}

// sameRowWriters runs n writers that each update one of rows (n = n + 1, so a row's n counts
// its commits), half of them writing another row first, holding their transactions open a
// moment so that they wait for each other's row locks, until each made perRound updates. It
// returns the number of changelog rows written.
func (e *liveEnv) sameRowWriters(n, perRound int, rows []string) int {
	e.t.Helper()
	var (
		mu      sync.Mutex
		written int
		wg      sync.WaitGroup
	)
	for k := range n {
		wg.Go(func() {
			for range perRound {
				w, err := e.sameRowUpdate(k%2 == 0, rows[rand.IntN(len(rows))])
				if err != nil {
					e.t.Errorf("writer %d: %v", k, err)
					return
				}
				mu.Lock()
				written += w
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return written
}

// sameRowUpdate is one transaction of sameRowWriters; it returns the changelog rows it wrote.
func (e *liveEnv) sameRowUpdate(elsewhereFirst bool, row string) (int, error) {
	tx, err := e.db.Begin()
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	written := 1
	if elsewhereFirst {
		if _, err := tx.Exec(`INSERT INTO items (n) VALUES (0)`); err != nil {
			return 0, err
		}
		written++
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
	}
	if _, err := tx.Exec(`UPDATE items SET n = n + 1 WHERE id = $1`, row); err != nil {
		return 0, err
	}
	time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
	return written, tx.Commit()
}

// TestLiveConcurrentSameRowUpdates proves rule 16 under concurrency in every mode: eight writers
// update six rows 320 times in all, half of them writing elsewhere first. Every change is
// delivered, and each row's changes in the order they committed.
func TestLiveConcurrentSameRowUpdates(t *testing.T) {
	runModes(t, allModes, newLive, func(t *testing.T, e *liveEnv, mode Mode) {
		cfg := e.config(mode)
		cfg.PollInterval = 5 * time.Millisecond
		rows := make([]string, 6)
		for i := range rows {
			rows[i] = e.newItem()
		}
		w := e.start(cfg)
		waitStartSaved(t, w)
		got := newChangeLog()
		got.consume(t, w)
		written := e.sameRowWriters(8, 40, rows)
		got.waitCount(t, written, liveWait)
		require.Equal(t, written, got.count(), "every change, once")
		t.Logf("%s: %d changes, %d of 320 updates out of order", mode, written, got.outOfOrder())
		require.Zero(t, got.outOfOrder(), "changes of one row delivered out of commit order")
	})
}

// TestLiveLargeDeltaInRowOrderAcrossRestart proves rule 16 for a delta larger than many pages:
// while no watcher runs, writers commit several thousand changes in many transactions, with
// same-row updates out of transaction-id order. The restarted watcher reads them as one delta;
// it is stopped part way through the delta and restarted again, and every change is delivered,
// each row's in commit order.
func TestLiveLargeDeltaInRowOrderAcrossRestart(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	cfg := e.config(ModePolling)
	cfg.BufferSize = 10
	cfg.ProcessedFlag = true // marked rows must be certified ones
	rows := make([]string, 6)
	for i := range rows {
		rows[i] = e.newItem()
	}
	first := e.start(cfg)
	waitStartSaved(t, first)
	require.NoError(t, first.Close(context.Background()))
	var before int64 // the rows up to it are behind the client's start: the checks are about the rows after it
	require.NoError(t, e.db.QueryRow(`SELECT max(id) FROM datastore_changelog`).Scan(&before))
	written := e.sameRowWriters(8, 250, rows)
	require.Greater(t, written, 20*100, "a delta of many pages")

	got := newChangeLog()
	w := e.start(cfg)
	wait := got.consume(t, w)
	got.waitCount(t, written/3, liveWait)
	require.NoError(t, w.Close(context.Background()))
	wait()
	var raw string
	require.NoError(t, e.db.QueryRow(`SELECT resume_token::text FROM resume_tokens WHERE client_name = 'c'`).Scan(&raw))
	require.Contains(t, raw, "deltaEnd", "stopped inside the delta")
	var marked int
	require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog WHERE processed`).Scan(&marked))
	require.Positive(t, marked, "the marker ran inside the delta")
	require.Zero(t, e.markedNotCertified(raw), "the processed flag is set only on rows the saved token certifies")
	mid := got.count()

	w = e.start(cfg)
	got.consume(t, w)
	got.waitCount(t, written, 30*time.Second)
	require.Equal(t, written, got.count(), "every change")
	waitFor(t, func() bool {
		var unmarked int
		require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog WHERE id > $1 AND NOT processed`, before).Scan(&unmarked))
		return unmarked == 0
	}, "every row acknowledged is marked")
	t.Logf("%d changes in one delta, stopped after %d (token %s, %d rows marked), %d out of order", written, mid,
		strings.TrimSpace(raw), marked, got.outOfOrder())
	require.Zero(t, got.outOfOrder(), "changes of one row delivered out of commit order")
}

// markedNotCertified counts the changelog rows marked processed that the saved token raw does
// not certify (the predicate admin.Prune deletes by).
func (e *liveEnv) markedNotCertified(raw string) int {
	e.t.Helper()
	p, err := position.DecodeToken([]byte(raw))
	require.NoError(e.t, err)
	var args []any
	cond := changelog.CertifiedBy(p, func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	})
	var n int
	require.NoError(e.t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog c WHERE processed AND NOT `+cond, args...).Scan(&n))
	return n
}
