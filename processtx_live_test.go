package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/admin"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/schema"
	"github.com/stretchr/testify/require"
)

// txRecorder is a TxHandler that writes one effect per event in the handler's transaction and
// records the events it was called for.
type txRecorder struct {
	t    *testing.T
	mu   sync.Mutex
	ids  []int64
	fail func(id int64) error // if set, the handler's error for id (after writing the effect)
}

func (r *txRecorder) handle(_ context.Context, tx *sql.Tx, ev EventWithToken) error {
	id := tokenID(r.t, ev)
	if err := insertEffect(r.t, tx, ev); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids = append(r.ids, id)
	if r.fail != nil {
		return r.fail(id)
	}
	return nil
}

func (r *txRecorder) called() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ids)
}

// effectIDs returns the changelog ids of the effects table, in order.
func (e *liveEnv) effectIDs() []int64 {
	e.t.Helper()
	return e.queryIDs(e.db, `SELECT changelog_id FROM effects ORDER BY 1`)
}

func (e *liveEnv) createEffects() {
	e.t.Helper()
	_, err := e.db.Exec(`CREATE TABLE effects (changelog_id bigint NOT NULL, idempotency_key text NOT NULL)`)
	require.NoError(e.t, err)
}

// runProcessTx runs w.ProcessTx in the background; the returned function stops it and returns
// its error.
func runProcessTx(w *Watcher, opts ProcessOptions, h TxHandler) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- w.ProcessTx(ctx, opts, h) }()
	return func() error {
		cancel()
		return <-errc
	}
}

// An event whose claim finds it committed before is finished without calling the handler; the
// others commit their effect and claim, and once the token certifies them their rows are
// deleted, also the rows a previous run left, at the start of the next run. On the upgraded
// changelog: a legacy one refuses (TestLiveProcessTxRefusesALegacyChangelog).
func TestLiveProcessTxSkipsCommittedAndCompacts(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	e.createEffects()
	ids := e.insert(4)
	_, err := e.db.Exec(`INSERT INTO datastore_changelog_acks (client_name, changelog_id) VALUES ('c', $1)`, ids[1])
	require.NoError(t, err) // a transaction of an earlier run committed ids[1]
	cfg := e.config(ModePolling)
	cfg.StartFromBeginning = true
	w := e.start(cfg)
	rec := &txRecorder{t: t}
	stop := runProcessTx(w, ProcessOptions{Workers: 4}, rec.handle)
	waitFor(t, func() bool { return w.Stats().Checkpoint.ID == ids[3] }, "the token certifies every event")
	waitFor(t, func() bool { return len(e.ackRows("c")) == 0 }, "the certified rows are deleted")
	require.NoError(t, stop())
	got := rec.called()
	slices.Sort(got)
	require.Equal(t, []int64{ids[0], ids[2], ids[3]}, got, "the committed event's handler is not called")
	require.Equal(t, []int64{ids[0], ids[2], ids[3]}, e.effectIDs())
	st := w.Stats().Process
	require.Equal(t, uint64(1), st.AlreadyDone)
	require.Equal(t, uint64(3), st.Handled)

	// A row left behind (a claim committed after the last save of a run, say) is deleted
	// when the next run starts.
	_, err = e.db.Exec(`INSERT INTO datastore_changelog_acks (client_name, changelog_id) VALUES ('c', $1)`, ids[2])
	require.NoError(t, err)
	stop = runProcessTx(w, ProcessOptions{}, rec.handle)
	waitFor(t, func() bool { return len(e.ackRows("c")) == 0 }, "the next run deletes the certified row")
	require.NoError(t, stop())
}

// On a legacy changelog ProcessTx and MarkProcessedTx refuse with ErrLegacyChangelog, whose text
// says how to upgrade: exactly-once cannot hold there, since a row that commits behind the saved
// token moves it back past acknowledgements already settled. Nothing is claimed, handled or
// written, and nothing is lost: once the changelog is upgraded, the restarted watcher's ProcessTx
// handles every event once.
func TestLiveProcessTxRefusesALegacyChangelog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLiveWithoutTxid(t) // with the acknowledgement table, where claims would go
	e.createEffects()
	ids := e.insert(3)
	cfg := e.config(ModePolling)
	cfg.StartFromBeginning = true
	w := e.start(cfg)
	waitStartSaved(t, w)
	rec := &txRecorder{t: t}
	runCtx, cancel := context.WithTimeout(ctx, liveWait) // ends a run that does not refuse
	defer cancel()
	err := w.ProcessTx(runCtx, ProcessOptions{Workers: 2}, rec.handle)
	require.ErrorIs(t, err, ErrLegacyChangelog)
	require.ErrorContains(t, err, "schema.Install", "the error says how to upgrade")

	var ev EventWithToken
	select {
	case ev = <-w.Events():
	case <-time.After(liveWait):
		t.Fatalf("no delivery: %v", w.Err())
	}
	tx := e.openTx()
	require.NoError(t, insertEffect(t, tx, ev))
	err = w.MarkProcessedTx(ctx, tx, ev.ResumeToken)
	require.ErrorIs(t, err, ErrLegacyChangelog)
	require.NoError(t, tx.Rollback()) // as the caller must after an error
	require.NoError(t, w.Close(ctx))
	require.True(t, e.savedToken("c").Before(e.position(ids[0])), "the token certifies no event: %s", e.rawToken("c"))
	require.NotContains(t, e.rawToken("c"), `"ack"`, "no acknowledgement was written in a transaction")
	require.Empty(t, rec.called(), "no handler ran")
	require.Empty(t, e.ackRows("c"), "nothing is claimed")
	require.Empty(t, e.effectIDs())

	require.NoError(t, errOf(schema.Install(ctx, e.db, schema.Options{})))
	w = e.start(cfg)
	stop := runProcessTx(w, ProcessOptions{Workers: 2}, rec.handle)
	waitFor(t, func() bool { return w.Stats().Checkpoint.ID == ids[2] }, "the token certifies every event")
	require.NoError(t, stop())
	got := rec.called()
	slices.Sort(got)
	require.Equal(t, ids, got, "every event handled once after the upgrade")
	require.Equal(t, ids, e.effectIDs())
}

// With CheckpointInterval 0, ProcessTx saves its low-water mark while events keep finishing,
// but saves are at least txSaveGap apart (an event's claim row, committed with its effect, is
// what makes it done), and it saves once more when it stops: the token then certifies every
// event, each handled once.
func TestLiveProcessTxPacesItsSaves(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	e.createEffects()
	var ids []int64
	e.inTx(func(tx *sql.Tx) int64 {
		for range 400 {
			ids = append(ids, insertItem(t, tx))
		}
		return 0
	})
	cfg := e.config(ModePolling)
	cfg.StartFromBeginning = true
	w := e.start(cfg)
	rec := &txRecorder{t: t}
	slow := func(ctx context.Context, tx *sql.Tx, ev EventWithToken) error {
		time.Sleep(time.Millisecond) // the run lasts several gaps
		return rec.handle(ctx, tx, ev)
	}
	before, start := w.Stats().CheckpointWrites, time.Now()
	stop := runProcessTx(w, ProcessOptions{Workers: 2}, slow)
	waitFor(t, func() bool { return len(rec.called()) == len(ids) }, "every event is handled")
	saves := w.Stats().CheckpointWrites - before
	elapsed := time.Since(start)
	require.NoError(t, stop())
	require.GreaterOrEqual(t, saves, uint64(1), "the mark is saved while events finish")
	// One save at most per gap, and one more (the idle save of a moved checkpoint, which can
	// fall between two).
	require.LessOrEqual(t, saves, uint64(elapsed/txSaveGap)+2, "%d saves in %v for %d events", saves, elapsed, len(ids))
	require.Equal(t, ids[len(ids)-1], w.Stats().Checkpoint.ID, "the final save certifies every event")
	require.Equal(t, ids[len(ids)-1], e.savedToken("c").ID)
	require.Equal(t, ids, e.effectIDs())
	t.Logf("%d saves in %v for %d events", saves, elapsed, len(ids))
}

// A failing handler's effect and claim roll back: no acknowledgement row, the token and the
// watcher's acknowledgement counters as they were; the events after it are not certified.
func TestLiveProcessTxHandlerErrorRollsBack(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	e.createEffects()
	ids := e.insert(1)
	cfg := e.config(ModePolling)
	cfg.StartFromBeginning = true
	w := e.start(cfg)
	waitFor(t, func() bool { st := w.Stats(); return st.CheckpointWrites > 0 && st.Pending == 1 }, "the start is saved, the event delivered")
	require.NoError(t, w.Flush(context.Background()))
	raw, before := e.rawToken("c"), w.Stats()
	boom := errors.New("boom")
	rec := &txRecorder{t: t, fail: func(int64) error { return boom }}
	err := w.ProcessTx(context.Background(), ProcessOptions{MaxAttempts: 3, RetryMinBackoff: time.Millisecond}, rec.handle)
	require.ErrorIs(t, err, boom)
	require.Equal(t, []int64{ids[0], ids[0], ids[0]}, rec.called())
	require.Empty(t, e.effectIDs(), "the effects rolled back")
	require.Empty(t, e.ackRows("c"), "no acknowledgement row")
	require.Equal(t, raw, e.rawToken("c"), "the token is unchanged")
	after := w.Stats()
	require.Equal(t, before.Acked, after.Acked)
	require.Equal(t, before.Checkpoint, after.Checkpoint)
	require.Equal(t, before.CheckpointWrites, after.CheckpointWrites)
	require.Zero(t, after.Process.Handled)
	require.Zero(t, after.Process.AlreadyDone)
	require.Equal(t, uint64(2), after.Process.Retries)
}

// A panic rolls back as an error does, and the retry commits once.
func TestLiveProcessTxPanicRetried(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	e.createEffects()
	cfg := e.config(ModePolling)
	cfg.StartFromBeginning = true
	w := e.start(cfg)
	ids := e.insert(1)
	rec := &txRecorder{t: t}
	rec.fail = func(int64) error {
		if len(rec.ids) == 1 { // under rec.mu
			panic("handler bug")
		}
		return nil
	}
	stop := runProcessTx(w, ProcessOptions{RetryMinBackoff: time.Millisecond}, rec.handle)
	waitFor(t, func() bool { return w.Stats().Checkpoint.ID == ids[0] }, "the retry commits")
	require.NoError(t, stop())
	require.Equal(t, ids, e.effectIDs(), "one effect: the panicking attempt's rolled back")
	require.Equal(t, uint64(1), w.Stats().Process.Retries)
}

// The rerun of a parked event removes its dead-letter row in its own transaction: inside it the
// row is gone, outside it is still there until the commit.
func TestLiveProcessTxParkedRerunRemovesItsRowInTheTransaction(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	e.createEffects()
	cfg := e.config(ModePolling)
	cfg.StartFromBeginning = true
	w := e.start(cfg)
	ids := e.insert(2)
	var seen []string
	rec := &txRecorder{t: t}
	handle := func(ctx context.Context, tx *sql.Tx, ev EventWithToken) error {
		if tokenID(t, ev) == ids[0] && len(rec.called()) > 0 { // the rerun
			var inside, outside int
			require.NoError(t, tx.QueryRow(`SELECT count(*) FROM datastore_changelog_parked`).Scan(&inside))
			require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog_parked`).Scan(&outside))
			rec.mu.Lock()
			seen = append(seen, "inside", string(rune('0'+inside)), "outside", string(rune('0'+outside)))
			rec.mu.Unlock()
		}
		return rec.handle(ctx, tx, ev)
	}
	rec.fail = func(id int64) error {
		if id == ids[0] && len(rec.ids) == 1 { // under rec.mu: the first attempt fails
			return errors.New("first attempt fails")
		}
		return nil
	}
	opts := ProcessOptions{MaxAttempts: 1, OnFailure: ParkOnFailure, ParkedPollInterval: 50 * time.Millisecond}
	stop := runProcessTx(w, opts, handle)
	waitFor(t, func() bool { return w.Stats().Checkpoint.ID == ids[1] }, "the parked event counts as finished")
	require.Equal(t, []int64{ids[1]}, e.effectIDs())
	parked, err := admin.ListParked(context.Background(), e.db, "c", admin.Options{})
	require.NoError(t, err)
	require.Len(t, parked, 1)
	require.NoError(t, admin.RetryParked(context.Background(), e.db, "c", parked[0].ID, admin.Options{}))
	waitFor(t, func() bool { return len(e.effectIDs()) == 2 }, "the rerun commits")
	require.NoError(t, stop())
	rec.mu.Lock()
	require.Equal(t, []string{"inside", "0", "outside", "1"}, seen)
	rec.mu.Unlock()
	parked, err = admin.ListParked(context.Background(), e.db, "c", admin.Options{})
	require.NoError(t, err)
	require.Empty(t, parked)
}

func TestLiveProcessTxRefusesAnEphemeralWatcher(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	cfg := e.config(ModePolling)
	cfg.Ephemeral = true
	w := e.start(cfg)
	err := w.ProcessTx(context.Background(), ProcessOptions{}, func(context.Context, *sql.Tx, EventWithToken) error { return nil })
	require.ErrorContains(t, err, "ephemeral")
	require.ErrorContains(t, w.ProcessTx(context.Background(), ProcessOptions{}, nil), "handler is nil")
}

// gatedKey is a ProcessOptions.Key that holds back the dispatch of event id (and of every event
// after it) until gate is closed: the owner is paused before it claims id.
func gatedKey(t *testing.T, id int64, gate <-chan struct{}) func(EventWithToken) string {
	return func(ev EventWithToken) string {
		if tokenID(t, ev) == id {
			<-gate
		}
		return DocumentKey(ev)
	}
}

// An exclusive owner whose client a later owner claimed (here the epoch bump of a token reset,
// which the owner has not noticed) commits nothing more: its next claim fails with ErrFenced
// and ProcessTx stops with it at once, the event neither retried nor parked nor handled.
func TestLiveProcessTxFencedOwnerStops(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	e.createEffects()
	cfg := e.config(ModePolling)
	cfg.Exclusive, cfg.StartFromBeginning = true, true
	w := e.start(cfg)
	waitFor(t, func() bool { return w.Stats().Active }, "the owner takes the lock")
	ids := e.insert(3)
	gate := make(chan struct{})
	rec := &txRecorder{t: t}
	opts := ProcessOptions{Workers: 4, Key: gatedKey(t, ids[2], gate), OnFailure: ParkOnFailure, MaxAttempts: 1}
	errc := make(chan error, 1)
	go func() { errc <- w.ProcessTx(context.Background(), opts, rec.handle) }()
	waitFor(t, func() bool { return len(e.effectIDs()) == 2 }, "the owner commits the first two events")
	_, err := e.db.Exec(w.q.BumpEpoch, "c")
	require.NoError(t, err)
	close(gate)
	select {
	case err = <-errc:
	case <-time.After(liveWait):
		t.Fatal("ProcessTx goes on after its claim was fenced")
	}
	require.ErrorIs(t, err, ErrFenced)
	require.Equal(t, ids[:2], e.effectIDs(), "no effect after the later owner's claim")
	require.NotContains(t, rec.called(), ids[2], "the fenced event's handler is not called")
	require.Equal(t, ids[:2], e.ackRows("c"))
	parked, err := admin.ListParked(context.Background(), e.db, "c", admin.Options{})
	require.NoError(t, err)
	require.Empty(t, parked, "a fenced event is not parked")
	require.Zero(t, w.Stats().Process.Retries, "nor retried")
}

// A takeover while the owner's handlers run: the owner's lock session is terminated while one
// of its transactions (claimed, effect written) is open and its dispatch is paused before a
// later event. The successor's epoch claim waits for the open transaction, which commits; once
// the successor owns the client, the former owner's next claim is refused and it stops, having
// committed nothing after the successor's claim; the successor does not redo what it committed.
func TestLiveProcessTxTakeoverFencesTheFormerOwner(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	e.createEffects()
	cfg := e.config(ModePolling)
	cfg.Exclusive, cfg.StartFromBeginning = true, true
	a := e.start(cfg)
	waitFor(t, func() bool { return a.Stats().Active }, "A takes the lock")
	b := e.start(cfg)
	ids := e.insert(4)

	inTx, release, keyGate := make(chan struct{}), make(chan struct{}), make(chan struct{})
	recA := &txRecorder{t: t}
	handleA := func(ctx context.Context, tx *sql.Tx, ev EventWithToken) error {
		err := recA.handle(ctx, tx, ev)
		if tokenID(t, ev) == ids[1] {
			close(inTx)
			<-release // the transaction stays open, its claim and effect written
		}
		return err
	}
	errA := make(chan error, 1)
	go func() {
		errA <- a.ProcessTx(context.Background(), ProcessOptions{Workers: 4, Key: gatedKey(t, ids[2], keyGate)}, handleA)
	}()
	<-inTx
	waitFor(t, func() bool { return slices.Contains(e.effectIDs(), ids[0]) }, "A commits the first event")
	epochA := e.ownerEpoch()
	e.terminate(e.lockHolder())
	waitFor(t, func() bool {
		var n int
		require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%owner_epoch%'`).Scan(&n))
		return n > 0
	}, "B's epoch claim waits for A's open transaction")
	require.Equal(t, epochA, e.ownerEpoch(), "B has not claimed the client yet")
	close(release) // A's transaction commits: it claimed before B
	waitFor(t, func() bool { return e.ownerEpoch() > epochA }, "B claims the client")
	close(keyGate) // A dispatches the next event: its claim comes after B's
	select {
	case err := <-errA:
		t.Logf("A stopped: %v", err)
		require.True(t, errors.Is(err, ErrFenced) || errors.Is(err, ErrExclusiveLost), "A stops refused: %v", err)
	case <-time.After(liveWait):
		t.Fatal("A's ProcessTx goes on after the takeover")
	}
	calledA := recA.called()
	slices.Sort(calledA)
	require.Equal(t, ids[:2], calledA, "A handles nothing after B's claim")

	recB := &txRecorder{t: t}
	stopB := runProcessTx(b, ProcessOptions{Workers: 4}, recB.handle)
	waitFor(t, func() bool { return len(e.effectIDs()) == len(ids) }, "B handles the rest")
	require.NoError(t, stopB())
	require.Equal(t, ids, e.effectIDs(), "every effect once")
	require.NotContains(t, recB.called(), ids[0])
	require.NotContains(t, recB.called(), ids[1], "B does not redo what A committed")
}

// ownerEpoch returns client "c"'s owner epoch.
func (e *liveEnv) ownerEpoch() int64 {
	e.t.Helper()
	var epoch int64
	require.NoError(e.t, e.db.QueryRow(`SELECT `+changelog.EpochColumn+` FROM resume_tokens WHERE client_name = 'c'`).Scan(&epoch))
	return epoch
}

// A transaction left idle longer than Config.LockSessionTimeout (the handler waits outside the
// database) is ended by the server: that attempt fails and the next commits once.
func TestLiveProcessTxIdleTransactionEnded(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	e.createEffects()
	cfg := e.config(ModePolling)
	cfg.StartFromBeginning, cfg.LockSessionTimeout = true, MinLockSessionTimeout
	w := e.start(cfg)
	ids := e.insert(1)
	var attempts atomic.Int32
	handle := func(_ context.Context, tx *sql.Tx, ev EventWithToken) error {
		if err := insertEffect(t, tx, ev); err != nil {
			return err
		}
		if attempts.Add(1) == 1 {
			time.Sleep(cfg.LockSessionTimeout + time.Second)
		}
		return nil
	}
	stop := runProcessTx(w, ProcessOptions{RetryMinBackoff: time.Millisecond}, handle)
	waitFor(t, func() bool { return w.Stats().Checkpoint.ID == ids[0] }, "the second attempt commits")
	require.NoError(t, stop())
	require.Equal(t, int32(2), attempts.Load())
	require.Equal(t, ids, e.effectIDs())
	require.Equal(t, uint64(1), w.Stats().Process.Retries, "the ended transaction's commit failed")
}

// A parked event's acknowledgement row outlives the token's certifying it: the row is the only
// record that the event's effects committed (an attempt whose commit reported an error but
// took effect, then parked), so a rerun must find it and not apply the effects again.
func TestLiveProcessTxCompactionKeepsParkedEventsRows(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	ids := e.insert(2)
	cfg := e.config(ModePolling)
	cfg.StartFromBeginning = true
	w := e.start(cfg)
	require.Equal(t, ids, receiveWithin(t, w, 2, liveWait))
	for _, id := range ids {
		_, err := e.db.Exec(`INSERT INTO datastore_changelog_acks (client_name, changelog_id) VALUES ('c', $1)`, id)
		require.NoError(t, err)
	}
	_, err := e.db.Exec(`INSERT INTO datastore_changelog_parked (client_name, event_key, table_name, changelog_id, event, error, attempts, blocking)
		VALUES ('c', 'k', 'items', $1, '{}', 'commit failed', 5, false)`, ids[0])
	require.NoError(t, err)
	require.NoError(t, w.MarkProcessed(context.Background(), tok(ids[1])))
	n, err := w.compactAcks(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Equal(t, ids[:1], e.ackRows("c"), "the parked event keeps its row")
}
