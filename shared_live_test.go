package pgchangestream

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/schema"
	"github.com/stretchr/testify/require"
)

// sharedChildDSN and sharedChildName, set in the environment, make TestLiveSharedMembers run
// as one member: a child process that the test starts, stops, kills and pauses. With
// sharedChildMode set to sharedModeTx the member runs ProcessTx, with sharedModeEvents it reads
// Events() (see runSharedChild); sharedChildRead sets its Config.Mode (default hybrid).
const (
	sharedChildDSN   = "PGCHANGESTREAM_SHARED_CHILD_DSN"
	sharedChildName  = "PGCHANGESTREAM_SHARED_CHILD_NAME"
	sharedChildMode  = "PGCHANGESTREAM_SHARED_CHILD_MODE"
	sharedChildRead  = "PGCHANGESTREAM_SHARED_CHILD_READ"
	sharedModeTx     = "tx"
	sharedModeEvents = "events"
	sharedClient     = "shared"
	sharedLease      = 5 * time.Second // well above a loaded machine's scheduling stalls
	sharedKeys       = 200
)

// sharedMemberProc is a member running in a child process.
type sharedMemberProc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.Closer     // closing it stops the member gracefully
	done  chan struct{} // closed when the process ended and its output was read
	// fenced is set when the member reported that it stopped, fenced off.
	fenced atomic.Bool
	// failed holds the changelog ids of the handler attempts that the member reported failed,
	// and unacked whether it reported deliveries not acknowledged when Process returned. The
	// output reader writes them; the test reads them once done is closed.
	failed  map[int64]bool
	unacked bool
}

// pausePastItsLease stops the member's process with SIGSTOP until the others (by name) own
// every range and three leases passed, then wakes it, and requires that it stopped, reporting
// that it was fenced off. It returns when the pause began and ended.
func (m *sharedMemberProc) pausePastItsLease(t *testing.T, e *liveEnv, others ...string) (pausedAt, resumedAt time.Time) {
	t.Helper()
	pausedAt = time.Now()
	require.NoError(t, m.cmd.Process.Signal(syscall.SIGSTOP))
	waitSharedOwners(t, e, m.name+" paused", others...)
	time.Sleep(3 * sharedLease)
	resumedAt = time.Now()
	require.NoError(t, m.cmd.Process.Signal(syscall.SIGCONT))
	select {
	case <-m.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the paused member did not stop after it woke up fenced off")
	}
	require.True(t, m.fenced.Load(), "the paused member did not report that it was fenced off")
	return pausedAt, resumedAt
}

// startSharedMember starts a member process named name, with env added to its environment.
func startSharedMember(t *testing.T, e *liveEnv, name string, env ...string) *sharedMemberProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLiveSharedMembers$")
	cmd.Env = append(append(os.Environ(), sharedChildDSN+"="+e.dsn, sharedChildName+"="+name), env...)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	m := &sharedMemberProc{name: name, cmd: cmd, stdin: stdin, done: make(chan struct{}), failed: map[int64]bool{}}
	go func() {
		defer close(m.done)
		for lines := bufio.NewScanner(out); lines.Scan(); {
			line := lines.Text()
			if strings.HasPrefix(line, "shared-member: fenced") {
				m.fenced.Store(true)
			}
			if id, ok := strings.CutPrefix(line, "shared-member: failed attempt: "); ok {
				n, err := strconv.ParseInt(strings.Fields(id)[0], 10, 64)
				if err == nil {
					m.failed[n] = true
				}
			}
			m.unacked = m.unacked || strings.HasPrefix(line, "shared-member: unacknowledged")
			if strings.HasPrefix(line, "shared-member: ") {
				t.Logf("%s: %s", name, line)
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-m.done
	})
	return m
}

// stop ends the member gracefully (it closes its watcher) and waits for it. A member that
// ended by itself before (fenced off: its lease ran out) fails the test, saying so.
func (m *sharedMemberProc) stop(t *testing.T) {
	t.Helper()
	ended := false
	select {
	case <-m.done:
		ended = true
	default:
		if err := m.stdin.Close(); err != nil { // Wait closed the pipe: the member ended meanwhile
			<-m.done
			ended = true
		}
	}
	if ended {
		t.Fatalf("member %s ended by itself before its stop (fenced off: %v)", m.name, m.fenced.Load())
	}
	select {
	case <-m.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("member %s did not stop within 30s of its stop", m.name)
	}
}

// runSharedChild is the member's side: Process with 8 workers and a 2 ms handler that records,
// per event, the member, the key, the changelog id and when the handler started and ended; or,
// in sharedModeTx, ProcessTx with 8 workers and a handler that inserts the event's effect row
// (its changelog id and the member) in the transaction and keeps it open up to 2 ms more, so
// that kills and pauses land inside transactions; or, in sharedModeEvents, a loop over Events()
// that records each event as Process's handler does, as received (started and finished) right
// after the receive, and acknowledges it, reading on after a failure until Events is closed. It runs until its standard input ends (then closes the
// watcher) or until the watcher stops.
func runSharedChild(t *testing.T, dsn, name string) {
	db, err := sql.Open("pgx", dsn+"&application_name="+name)
	require.NoError(t, err)
	defer db.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	mode := ModeHybrid
	if m := os.Getenv(sharedChildRead); m != "" {
		mode = Mode(m)
	}
	cfg := Config{
		DB: db, ConnString: dsn, ClientName: sharedClient, TableName: liveTable, Mode: mode,
		Shared: true, SharedLease: sharedLease, MemberName: name, StartFromBeginning: true,
		FallbackPollInterval: 200 * time.Millisecond, Logger: quietLogger,
	}
	tx := os.Getenv(sharedChildMode) == sharedModeTx
	if tx { // a paused member's transactions end soon after its lease
		cfg.LockSessionTimeout = MinLockSessionTimeout
	}
	w, err := New(cfg)
	require.NoError(t, err)
	w.Start(ctx)
	record := func(ctx context.Context, ev EventWithToken, start, end time.Time) error {
		id, _, err := position.ParseToken(ev.ResumeToken)
		if err != nil {
			return err
		}
		_, err = db.ExecContext(ctx, `INSERT INTO shared_handled (member, key, changelog_id, started, finished)
			VALUES ($1, $2, $3, $4, $5)`, name, DocumentKey(ev), id, start, end)
		return err
	}
	switch {
	case os.Getenv(sharedChildMode) == sharedModeEvents:
		var errs []error // a refused acknowledgement does not stop the reading: Events says when to
		for ev := range w.Events() {
			received := time.Now()
			errs = append(errs, record(ctx, ev, received, received), w.MarkProcessed(context.Background(), ev.ResumeToken))
		}
		err = errors.Join(errs...)
	case tx:
		err = w.ProcessTx(ctx, ProcessOptions{Workers: 8}, func(ctx context.Context, tx *sql.Tx, ev EventWithToken) error {
			id, _, err := position.ParseToken(ev.ResumeToken)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO effects (changelog_id, member) VALUES ($1, $2)`, id, name); err != nil {
				return err
			}
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
			return nil
		})
	default:
		err = w.Process(ctx, ProcessOptions{Workers: 8}, func(ctx context.Context, ev EventWithToken) error {
			start := time.Now()
			time.Sleep(2 * time.Millisecond)
			err := record(ctx, ev, start, time.Now())
			if err != nil { // its row may be committed all the same: the retry is no replay
				id, _, _ := position.ParseToken(ev.ResumeToken)
				fmt.Println("shared-member: failed attempt:", id, err)
			}
			return err
		})
	}
	if errors.Is(err, ErrFenced) || errors.Is(w.Err(), ErrFenced) {
		fmt.Println("shared-member: fenced:", err, w.Err())
	} else {
		fmt.Println("shared-member: stopped:", err, w.Err())
	}
	if _, _, _, busy := w.checkpoint(); busy { // events left to retry: it keeps its ranges, as if it crashed
		fmt.Println("shared-member: unacknowledged deliveries at the stop")
	}
	closeCtx, stop := context.WithTimeout(context.Background(), 20*time.Second)
	defer stop()
	fmt.Println("shared-member: closed:", w.Close(closeCtx))
	os.Exit(0) // a child: the parent checks what it did
}

// TestLiveSharedMembers runs members of one client in separate processes while writers update
// and insert rows throughout: it scales them 1 → 4 → 2, kills one with SIGKILL, pauses one with
// SIGSTOP for three leases, and ends the server sessions of another. At the end every committed
// changelog row was handled, no key was handled by two members at once, and each key's events
// were handled in order, except where a member that did not hand over (killed, paused, or
// stopped with a failed attempt still to retry) handled some again, or where an attempt whose
// handler failed after its row was committed ran again.
func TestLiveSharedMembers(t *testing.T) {
	if dsn := os.Getenv(sharedChildDSN); dsn != "" {
		runSharedChild(t, dsn, os.Getenv(sharedChildName))
		return
	}
	e := newLive(t)
	stopWriters := startSharedWriters(t, e)
	m1 := startSharedMember(t, e, "m1")
	waitSharedOwners(t, e, "one member", "m1")
	time.Sleep(2 * time.Second)
	m2, m3, m4 := startSharedMember(t, e, "m2"), startSharedMember(t, e, "m3"), startSharedMember(t, e, "m4")
	waitSharedOwners(t, e, "scaled to 4", "m1", "m2", "m3", "m4")
	time.Sleep(2 * time.Second)
	m3.stop(t)
	m4.stop(t)
	waitSharedOwners(t, e, "scaled to 2", "m1", "m2")
	time.Sleep(time.Second)

	require.NoError(t, m2.cmd.Process.Kill())
	<-m2.done
	m5 := startSharedMember(t, e, "m5")
	waitSharedOwners(t, e, "m2 killed, m5 joined", "m1", "m5")
	time.Sleep(time.Second)

	pausedAt, resumedAt := m1.pausePastItsLease(t, e, "m5")
	m6 := startSharedMember(t, e, "m6")
	waitSharedOwners(t, e, "m6 joined", "m5", "m6")

	n, err := e.srv.TerminateBackends(context.Background(), "m5")
	require.NoError(t, err)
	require.Positive(t, n, "no session of m5 to terminate")
	time.Sleep(2 * sharedLease)
	waitSharedOwners(t, e, "m5's sessions terminated", "m5", "m6")

	written := stopWriters()
	require.Positive(t, written)
	deadline := time.Now().Add(60 * time.Second)
	for {
		var missing int
		require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog c WHERE c.table_name = 'items'
			AND NOT EXISTS (SELECT FROM shared_handled h WHERE h.changelog_id = c.id)`).Scan(&missing))
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			var diag string
			require.NoError(t, e.db.QueryRow(`SELECT string_agg(r || ': ' || n || ' rows ' || lo || '..' || hi, ', ') FROM (
				SELECT datastore_changelog_unit(record_id::text) / 16 AS r, count(*) AS n, min(id) AS lo, max(id) AS hi
				FROM datastore_changelog c WHERE c.table_name = 'items'
				AND NOT EXISTS (SELECT FROM shared_handled h WHERE h.changelog_id = c.id) GROUP BY 1 ORDER BY 1) m`).Scan(&diag))
			var ranges string
			require.NoError(t, e.db.QueryRow(`SELECT string_agg(range_no || '=' || COALESCE(owner::text, '-') || ' ' || resume_token::text, E'\n' ORDER BY range_no)
				FROM datastore_changelog_ranges`).Scan(&ranges))
			t.Fatalf("%d committed changelog rows were never handled, by range: %s\nranges:\n%s", missing, diag, ranges)
		}
		time.Sleep(200 * time.Millisecond)
	}
	m5.stop(t)
	m6.stop(t)

	// The paused member started no handler once it woke up: it found its lease gone first.
	var late int
	require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM shared_handled WHERE member = 'm1' AND started > $1`, resumedAt).Scan(&late))
	require.Zero(t, late, "the paused member started handlers after it woke up")

	// No key handled by two members at once: not even by the handlers the paused member had
	// running when it was stopped, whose database calls find their context done when it wakes.
	var overlaps int
	var example sql.NullString
	require.NoError(t, e.db.QueryRow(`SELECT count(*), min(a.key || ': ' || a.member || ' and ' || b.member)
		FROM shared_handled a JOIN shared_handled b ON a.key = b.key AND a.member < b.member
			AND a.started < b.finished AND b.started < a.finished`).Scan(&overlaps, &example))
	require.Zero(t, overlaps, "a key handled by two members at once, e.g. %s", example.String)
	var frozen int
	require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM shared_handled WHERE member = 'm1' AND started < $1 AND finished > $2`,
		pausedAt, resumedAt).Scan(&frozen))
	require.Zero(t, frozen, "a handler frozen by the pause recorded its effect after waking up")

	// Per key, in the order handled: within a member ids only grow; when the key moves to
	// another member, the new member starts at the key's next event, or, after a member that
	// was killed or paused, at an event the old one had already handled.
	rows, err := e.db.Query(`SELECT h.key, h.member, h.changelog_id,
		(SELECT min(c.id) FROM datastore_changelog c WHERE c.table_name = 'items' AND c.id > prev.changelog_id
			AND 'items/' || c.record_id = h.key) AS next_of_prev, prev.member, prev.changelog_id
		FROM (SELECT *, lag(member) OVER w AS pm, lag(changelog_id) OVER w AS pid FROM shared_handled
			WINDOW w AS (PARTITION BY key ORDER BY started)) h
		CROSS JOIN LATERAL (SELECT h.pm AS member, h.pid AS changelog_id) prev
		WHERE prev.member IS NOT NULL ORDER BY h.key, h.started`)
	require.NoError(t, err)
	defer rows.Close()
	// A handler attempt that failed (its context ended as the lease might have run out, or its
	// session was ended) may have committed its row: its retry is no replay. A member that
	// stopped with such an attempt still to retry kept its ranges, as a crashed one does.
	members := map[string]*sharedMemberProc{"m1": m1, "m2": m2, "m3": m3, "m4": m4, "m5": m5, "m6": m6}
	crashed := map[string]bool{"m1": true, "m2": true}
	for name, m := range members {
		if m.unacked {
			t.Logf("%s stopped with deliveries not acknowledged: its ranges were taken over when its lease ran out", name)
			crashed[name] = true
		}
	}
	var moves, replays, retries int
	for rows.Next() {
		var key, member, prevMember string
		var id, prevID int64
		var next sql.NullInt64
		require.NoError(t, rows.Scan(&key, &member, &id, &next, &prevMember, &prevID))
		switch {
		case member == prevMember && id == prevID && members[member].failed[id]:
			retries++
		case member == prevMember:
			require.Greater(t, id, prevID, "key %s: member %s handled %d after %d", key, member, id, prevID)
		case id <= prevID:
			require.True(t, crashed[prevMember], "key %s moved from %s (not crashed) to %s, which handled %d again after %d",
				key, prevMember, member, id, prevID)
			replays++
		default:
			moves++
			require.True(t, next.Valid && id == next.Int64, "key %s: moved from %s at %d to %s, which started at %d, skipping %d",
				key, prevMember, prevID, member, id, next.Int64)
		}
	}
	require.NoError(t, rows.Err())
	t.Logf("%d rows written; %d key moves between members, %d replays after a kill, pause or stop with deliveries not acknowledged, %d retries of an attempt whose row was committed",
		written, moves, replays, retries)
	require.Positive(t, moves, "no key moved between members")
}

// startSharedWriters creates the members' table shared_handled and sharedKeys rows of items,
// then starts writers that update random keys and insert rows, in small transactions, until
// the returned stop (also called at the end of the test), which returns how many writes
// committed.
func startSharedWriters(t *testing.T, e *liveEnv) (stop func() int64) {
	t.Helper()
	_, err := e.db.Exec(`CREATE TABLE shared_handled (
		member text NOT NULL, key text NOT NULL, changelog_id bigint NOT NULL,
		started timestamptz NOT NULL, finished timestamptz NOT NULL)`)
	require.NoError(t, err)
	keys := make([]string, sharedKeys)
	for i := range keys {
		require.NoError(t, e.db.QueryRow(`INSERT INTO items (n) VALUES (0) RETURNING id::text`).Scan(&keys[i]))
	}
	ctx, cancel := context.WithCancel(context.Background())
	var writers sync.WaitGroup
	var written atomic.Int64
	for i := range 3 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 18))
			for ctx.Err() == nil {
				var err error
				if rng.IntN(10) == 0 {
					_, err = e.db.ExecContext(ctx, `INSERT INTO items (n) VALUES (0)`)
				} else {
					_, err = e.db.ExecContext(ctx, `UPDATE items SET n = n + 1 WHERE id = $1`, keys[rng.IntN(len(keys))])
				}
				if err == nil {
					written.Add(1)
				}
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
			}
		}()
	}
	stop = func() int64 {
		cancel()
		writers.Wait()
		return written.Load()
	}
	t.Cleanup(func() { stop() })
	return stop
}

// sharedOwners returns how many ranges of the shared client each member (by name) owns.
func sharedOwners(t *testing.T, e *liveEnv) map[string]int {
	t.Helper()
	rows, err := e.db.Query(`SELECT m.name, count(*) FROM datastore_changelog_ranges r
		JOIN datastore_changelog_members m ON m.client_name = r.client_name AND m.member = r.owner
		WHERE r.client_name = $1 GROUP BY m.name`, sharedClient)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var name string
		var n int
		require.NoError(t, rows.Scan(&name, &n))
		out[name] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// waitSharedOwners waits until the members named want own every range, split fairly between
// them; it fails the test after ten leases.
func waitSharedOwners(t *testing.T, e *liveEnv, what string, want ...string) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(10 * sharedLease)
	for {
		got := sharedOwners(t, e)
		total, fair := 0, len(got) == len(want)
		for _, n := range got {
			total += n
			fair = fair && n >= SharedRanges/len(want)-1 && n <= SharedRanges/len(want)+1
		}
		for _, name := range want {
			_, ok := got[name]
			fair = fair && ok
		}
		if fair && total == SharedRanges {
			t.Logf("%s: ranges %v after %v", what, got, time.Since(start).Round(10*time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: ranges owned %v, want a fair split between %v", what, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A Shared watcher on a changelog without the txid and unit columns stops at once with
// ErrSharedSchema rather than retrying, and says how to upgrade.
func TestLiveSharedRefusesALegacyChangelog(t *testing.T) {
	t.Parallel()
	e := newLegacy(t)
	cfg := e.config(ModePolling)
	cfg.Shared = true
	w, err := New(cfg)
	require.NoError(t, err)
	w.Start(context.Background())
	defer w.Close(context.Background())
	select {
	case _, open := <-w.Events():
		require.False(t, open, "a Shared watcher on a legacy changelog delivered an event")
	case <-time.After(liveWait):
		t.Fatal("a Shared watcher on a legacy changelog did not stop")
	}
	require.ErrorIs(t, w.Err(), ErrSharedSchema)
	require.Contains(t, w.Err().Error(), "schema.Install")
}

// Two members in one process, in each mode, while writers commit out of order (transactions
// held open for random moments): every committed row is delivered once, by the member that owns
// its range, and each member's Stats show its ranges.
func TestLiveSharedMembersDivideRows(t *testing.T) {
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newLive(t)
			cfg := e.config(mode)
			cfg.Shared, cfg.SharedLease, cfg.StartFromBeginning = true, time.Second, true
			a, b := startSplitPair(t, e, cfg, nil)
			got := map[int64]string{}
			var mu sync.Mutex
			receive := func(w *Watcher, name string) {
				for ev := range w.Events() {
					id, _, err := position.ParseToken(ev.ResumeToken)
					require.NoError(t, err)
					mu.Lock()
					prev, twice := got[id]
					got[id] = name
					mu.Unlock()
					require.False(t, twice, "row %d delivered to %s and %s", id, prev, name)
					require.NoError(t, w.MarkProcessed(context.Background(), ev.ResumeToken))
				}
			}
			go receive(a, "a")
			go receive(b, "b")
			errs := make(chan error, 4)
			for i := range 4 {
				go func() {
					rng := rand.New(rand.NewPCG(uint64(i), 17))
					for range 50 {
						tx, err := e.db.Begin()
						if err == nil {
							_, err = tx.Exec(`INSERT INTO items (n) VALUES (1)`)
						}
						if err != nil {
							errs <- err
							return
						}
						time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond) // commits overtake each other
						if err := tx.Commit(); err != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
			}
			for range 4 {
				require.NoError(t, <-errs)
			}
			ids := e.queryIDs(e.db, `SELECT id FROM datastore_changelog WHERE table_name = 'items' ORDER BY id`)
			require.Len(t, ids, 200)
			require.Eventually(t, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(got) == len(ids)
			}, liveWait, 10*time.Millisecond, "not every row was delivered")
			owns := map[string][]int{"a": a.Stats().Shared.Ranges, "b": b.Stats().Shared.Ranges}
			mu.Lock()
			defer mu.Unlock()
			for _, id := range ids {
				var unit int
				require.NoError(t, e.db.QueryRow(`SELECT `+changelog.UnitExpression("datastore_changelog")+` FROM datastore_changelog WHERE id = $1`, id).Scan(&unit))
				require.Contains(t, owns[got[id]], unit/16, "row %d (unit %d) delivered to %s, which does not own its range", id, unit, got[id])
			}
			require.NotEqual(t, a.Stats().Shared.Member, b.Stats().Shared.Member)
		})
	}
}

// A backlog larger than a batch in one transaction (a listed delta) is divided as any other:
// each member gets exactly the rows of its ranges, in id order.
func TestLiveSharedMembersDivideALargeDelta(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	cfg := e.config(ModePolling)
	cfg.Shared, cfg.SharedLease, cfg.BatchSize = true, time.Second, 50
	a, b := startSplitPair(t, e, cfg, nil)
	_, err := e.db.Exec(`INSERT INTO items (n) SELECT g FROM generate_series(1, 2000) g`)
	require.NoError(t, err)
	var want [2][]int64
	rows, err := e.db.Query(`SELECT id, ` + changelog.UnitExpression("datastore_changelog") + ` / 16 FROM datastore_changelog
		WHERE table_name = 'items' ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		var r int
		require.NoError(t, rows.Scan(&id, &r))
		if slices.Contains(a.Stats().Shared.Ranges, r) {
			want[0] = append(want[0], id)
		} else {
			want[1] = append(want[1], id)
		}
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, want[0])
	require.NotEmpty(t, want[1])
	for i, w := range []*Watcher{a, b} {
		got := receiveWithin(t, w, len(want[i]), liveWait)
		require.Equal(t, want[i], got, "member %d", i)
		requireNothingWithin(t, w, 300*time.Millisecond)
	}
}

// A server crash (with the restart and crash recovery it takes, longer than a short lease)
// under two members: neither takes the other's ranges over or removes it, both go back to their
// ranges' saved positions (the server's incarnation changed), and every row committed after
// the crash is delivered to the member that owns its range.
func TestLiveSharedMembersSurviveAServerCrash(t *testing.T) {
	srv := pgtest.NewServer(t, pgtest.Options{})
	e := newLiveOn(t, srv)
	cfg := e.config(ModeHybrid)
	cfg.Shared, cfg.SharedLease = true, time.Second
	a, b := startSplitPair(t, e, cfg, nil)
	before := e.insert(20)
	got := map[int64]int{}
	var mu sync.Mutex
	for _, w := range []*Watcher{a, b} {
		go func() {
			for ev := range w.Events() {
				id, _, err := position.ParseToken(ev.ResumeToken)
				if err == nil {
					mu.Lock()
					got[id]++
					mu.Unlock()
				}
				_ = w.MarkProcessed(context.Background(), ev.ResumeToken) // fails while the server is down
			}
		}()
	}
	delivered := func(ids []int64) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if got[id] == 0 {
				return false
			}
		}
		return true
	}
	require.Eventually(t, func() bool { return delivered(before) }, liveWait, 10*time.Millisecond)
	require.NoError(t, srv.Kill(context.Background()))
	var after []int64
	require.Eventually(t, func() bool {
		var record string
		if err := e.db.QueryRow(`INSERT INTO items (n) VALUES (2) RETURNING id::text`).Scan(&record); err != nil {
			return false // the server is not back yet
		}
		var id int64
		require.NoError(t, e.db.QueryRow(`SELECT id FROM datastore_changelog WHERE record_id::text = $1`, record).Scan(&id))
		after = append(after, id)
		return len(after) == 20
	}, liveWait, 10*time.Millisecond)
	require.Eventually(t, func() bool { return delivered(after) }, liveWait, 20*time.Millisecond,
		"rows committed after the crash: a %+v %v %v, b %+v %v %v", a.Stats().Shared, a.Err(), a.Health(), b.Stats().Shared, b.Err(), b.Health())
	require.NoError(t, a.Err())
	require.NoError(t, b.Err())
	require.Len(t, a.Stats().Shared.Ranges, SharedRanges/2, "a member lost its ranges over the crash")
	require.Len(t, b.Stats().Shared.Ranges, SharedRanges/2, "a member lost its ranges over the crash")
	require.Positive(t, a.Stats().Rewinds+b.Stats().Rewinds, "no member went back to its saved positions")
}

// A server that stops answering for longer than the members' lease (its processes paused): the
// members' deadlines pass and they deliver nothing meanwhile; when it answers again, the first
// member back does not remove the other or take its ranges (it waits a lease first), and both
// go on with their own ranges.
func TestLiveSharedMembersSurviveAServerPause(t *testing.T) {
	srv := pgtest.NewServer(t, pgtest.Options{})
	e := newLiveOn(t, srv)
	cfg := e.config(ModePolling)
	cfg.Shared, cfg.SharedLease = true, time.Second
	a, b := startSplitPair(t, e, cfg, nil)
	time.Sleep(1500 * time.Millisecond) // both settled

	pidFile, err := os.ReadFile(srv.Dir() + "/data/postmaster.pid")
	require.NoError(t, err)
	line, _, _ := strings.Cut(string(pidFile), "\n")
	postmaster, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)
	// The postmaster and its children: each backend leads a process group of its own.
	signalServer := func(sig syscall.Signal) {
		require.NoError(t, syscall.Kill(postmaster, sig))
		procs, err := os.ReadDir("/proc")
		require.NoError(t, err)
		for _, p := range procs {
			stat, err := os.ReadFile("/proc/" + p.Name() + "/stat")
			if err != nil {
				continue
			}
			fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
			if len(fields) > 1 && fields[1] == strconv.Itoa(postmaster) {
				pid, _ := strconv.Atoi(p.Name())
				_ = syscall.Kill(pid, sig)
			}
		}
	}
	signalServer(syscall.SIGSTOP)
	resumed := false
	defer func() {
		if !resumed {
			signalServer(syscall.SIGCONT)
		}
	}()
	time.Sleep(3 * cfg.SharedLease)
	require.False(t, a.Stats().Shared.LeaseValid || b.Stats().Shared.LeaseValid, "a member kept its lease while the server was paused")
	signalServer(syscall.SIGCONT)
	resumed = true
	time.Sleep(3 * cfg.SharedLease)
	require.NoError(t, a.Err())
	require.NoError(t, b.Err())
	require.Len(t, a.Stats().Shared.Ranges, SharedRanges/2)
	require.Len(t, b.Stats().Shared.Ranges, SharedRanges/2)
	var members int
	require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog_members WHERE lease_until > now()`).Scan(&members))
	require.Equal(t, 2, members)
}

// Rows written before the upgrade (no txid, no unit) are divided as the others: two members of
// a new client that starts from the beginning read the switch-over's legacy part and the deltas
// after it, a slow first member handing half of the ranges over to the second as it joins, and
// every row is delivered once, the rows from before the upgrade to both members.
func TestLiveSharedMembersReadRowsFromBeforeTheUpgrade(t *testing.T) {
	t.Parallel()
	e := newLegacy(t)
	old := e.insert(150)
	require.NoError(t, errOf(schema.Install(context.Background(), e.db, schema.Options{})))
	var nulls int
	require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog WHERE unit IS NULL AND txid IS NULL`).Scan(&nulls))
	require.Equal(t, len(old), nulls)
	cfg := e.config(ModePolling)
	cfg.Shared, cfg.SharedLease, cfg.StartFromBeginning, cfg.BatchSize, cfg.BufferSize = true, time.Second, true, 20, 5
	var mu sync.Mutex
	got := map[int64][]string{}
	consume := func(w *Watcher, name string) {
		for ev := range w.Events() {
			id, _, err := position.ParseToken(ev.ResumeToken)
			require.NoError(t, err)
			mu.Lock()
			got[id] = append(got[id], name)
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
			_ = w.MarkProcessed(context.Background(), ev.ResumeToken)
		}
	}
	startSplitPair(t, e, cfg, consume)
	all := append(old, e.insert(50)...)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= len(all)
	}, liveWait, 20*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	oldBy := map[string]int{}
	for _, id := range all {
		require.Len(t, got[id], 1, "row %d delivered %v", id, got[id])
	}
	for _, id := range old {
		oldBy[got[id][0]]++
	}
	require.Len(t, got, len(all))
	require.Positive(t, oldBy["a"], "no row from before the upgrade went to the first member")
	require.Positive(t, oldBy["b"], "no row from before the upgrade went to the second member")
}

// MarkProcessed keeps working after Close (contract rule 13): a member closed with a delivery
// not acknowledged keeps its ranges, saves the acknowledgement that comes after Close, and
// then gives its ranges up.
func TestLiveSharedMarkProcessedAfterClose(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	cfg := e.config(ModePolling)
	cfg.Shared = true
	w := e.start(cfg)
	require.Eventually(t, func() bool { return len(w.Stats().Shared.Ranges) == SharedRanges }, liveWait, 10*time.Millisecond)
	ids := e.insert(1)
	require.Equal(t, ids, receiveWithin(t, w, 1, liveWait))
	require.NoError(t, w.Close(context.Background()))
	owned := func() int {
		return pgtest.Scalar[int](t, e.db, `SELECT count(*) FROM datastore_changelog_ranges WHERE owner IS NOT NULL`)
	}
	require.Equal(t, SharedRanges, owned(), "the ranges were given up with a delivery not acknowledged")
	require.NoError(t, w.MarkProcessed(context.Background(), tok(ids[0])))
	require.Zero(t, owned(), "the acknowledgement after Close did not give the ranges up")
	require.Zero(t, pgtest.Scalar[int](t, e.db, `SELECT count(*) FROM datastore_changelog_members`))

	// The next member resumes after the acknowledged row.
	next := e.start(cfg)
	later := e.insert(1)
	require.Equal(t, later, receiveWithin(t, next, 1, liveWait))
}

// startSplitPair starts two members of cfg's client, the second once the first owns every range,
// and returns them once they split the ranges evenly; consume, if set, is started on each
// member (with "a" or "b") as soon as it starts.
func startSplitPair(t *testing.T, e *liveEnv, cfg Config, consume func(*Watcher, string)) (a, b *Watcher) {
	t.Helper()
	a = e.start(cfg)
	if consume != nil {
		go consume(a, "a")
	}
	require.Eventually(t, func() bool { return len(a.Stats().Shared.Ranges) == SharedRanges }, liveWait, 10*time.Millisecond,
		"the first member did not take every range: %v %v", a.Err(), a.Health())
	b = e.start(cfg)
	if consume != nil {
		go consume(b, "b")
	}
	require.Eventually(t, func() bool {
		return len(a.Stats().Shared.Ranges) == SharedRanges/2 && len(b.Stats().Shared.Ranges) == SharedRanges/2
	}, liveWait, 10*time.Millisecond, "the two members did not split the ranges")
	return a, b
}

// A member stopped by cancelling its context keeps its lease while Process finishes the events
// it took (its grace period) and saves them, however long that takes: a handler still running
// when a lease has passed since the stop finds its context valid, its event is saved, and the
// member that takes the ranges over after Close does not run it again.
func TestLiveSharedProcessKeepsItsLeaseWhileItStops(t *testing.T) {
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newLive(t)
			cfg := e.config(mode)
			cfg.Shared, cfg.SharedLease, cfg.StartFromBeginning = true, time.Second, true
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			a := e.startCtx(ctx, cfg)
			waitFor(t, func() bool { return len(a.Stats().Shared.Ranges) == SharedRanges }, "the member did not take every range")
			first := e.insert(1)[0]
			started, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			processed := make(chan error, 1)
			go func() {
				processed <- a.Process(ctx, ProcessOptions{GracePeriod: time.Minute}, func(hctx context.Context, ev EventWithToken) error {
					once.Do(func() { close(started) })
					<-release
					_, err := e.db.ExecContext(hctx, `SELECT 1`)
					return err
				})
			}()
			select {
			case <-started:
			case <-time.After(liveWait):
				t.Fatalf("the handler did not start: %v", a.Err())
			}
			stop()

			// Wait, on the server's clock, until the lease the member held at the stop ran out
			// twice over: its lease must still hold, renewed.
			member := a.Stats().Shared.Member
			until := pgtest.Scalar[time.Time](t, e.db, `SELECT lease_until FROM datastore_changelog_members WHERE member = $1`, member)
			waitFor(t, func() bool {
				var past bool
				err := e.db.QueryRow(`SELECT now() > $1::timestamptz + $2 * interval '1 millisecond'`, until, cfg.SharedLease.Milliseconds()).Scan(&past)
				return err == nil && past
			}, "the server's clock did not pass the lease")
			require.Equal(t, 1, pgtest.Scalar[int](t, e.db, `SELECT count(*) FROM datastore_changelog_members WHERE member = $1 AND lease_until > now()`, member),
				"the member's lease ran out while Process was finishing its events")
			close(release)
			require.NoError(t, <-processed, "Process did not finish the event it took")
			require.NoError(t, a.Close(context.Background()))

			// The next member starts after the finished event: its first delivery is a later one.
			later := e.insert(1)
			next := e.start(cfg)
			got := receiveWithin(t, next, 1, liveWait)
			require.NotEqual(t, first, got[0], "the event finished before Close was delivered again")
			require.Equal(t, later, got)
		})
	}
}

// A paused member whose consumer reads Events() hands out nothing when it wakes past its lease
// but the one event it was offering when it stopped (its Events channel has no buffer), while
// the other member owns its ranges; then it stops, fenced off.
func TestLiveSharedPausedConsumerGetsNothing(t *testing.T) {
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newLive(t)
			startSharedWriters(t, e)
			env := []string{sharedChildMode + "=" + sharedModeEvents, sharedChildRead + "=" + string(mode)}
			m1 := startSharedMember(t, e, "m1", env...)
			waitSharedOwners(t, e, "one member", "m1")
			startSharedMember(t, e, "m2", env...)
			waitSharedOwners(t, e, "two members", "m1", "m2")
			split := time.Now()
			waitFor(t, func() bool {
				var n int
				err := e.db.QueryRow(`SELECT count(*) FROM shared_handled WHERE member = 'm1' AND started > $1`, split).Scan(&n)
				return err == nil && n > 0
			}, "m1 received nothing after the split")
			_, resumedAt := m1.pausePastItsLease(t, e, "m2")
			var late int
			require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM shared_handled WHERE member = 'm1' AND started > $1`, resumedAt).Scan(&late))
			t.Logf("the paused member's consumer received %d events after it woke up", late)
			require.LessOrEqual(t, late, 1, "the paused member's consumer received events after it woke up")
		})
	}
}
