package pgchangestream

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The live suite: the rules of the delivery and checkpoint contract proved against a real
// PostgreSQL (see live_test.go for the harness). Each test's doc comment names the rules it
// proves. A "restart" is a new watcher with the same ClientName, which loads the saved token.

const (
	liveWait  = 10 * time.Second       // bound on anything expected to happen
	liveQuiet = 100 * time.Millisecond // how long "nothing more is delivered" is watched
)

// liveModes are the reading modes every scenario runs in.
var liveModes = []Mode{ModePolling, ModeHybrid}

// allModes are every reading mode: the scenarios about skip-free reads run in each.
var allModes = []Mode{ModePolling, ModeNotify, ModeHybrid}

// eachMode runs f in parallel subtests named after the modes, each with a database of its own.
func eachMode(t *testing.T, f func(t *testing.T, e *liveEnv, mode Mode)) {
	t.Helper()
	runModes(t, liveModes, newLive, f)
}

// runModes runs f in parallel subtests named after modes, each with a database of its own made
// by newEnv (newLive or newLegacy).
func runModes(t *testing.T, modes []Mode, newEnv func(*testing.T) *liveEnv, f func(t *testing.T, e *liveEnv, mode Mode)) {
	t.Helper()
	t.Parallel()
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			f(t, newEnv(t), mode)
		})
	}
}

// fromBeginning is the mode's config for client "c" starting at the oldest row.
func (e *liveEnv) fromBeginning(mode Mode) Config {
	cfg := e.config(mode)
	cfg.StartFromBeginning = true
	return cfg
}

// startCtx starts a watcher with ctx as Start's context; it is closed at the end of the test.
func (e *liveEnv) startCtx(ctx context.Context, cfg Config) *Watcher {
	e.t.Helper()
	w, err := New(cfg)
	require.NoError(e.t, err)
	w.Start(ctx)
	e.t.Cleanup(func() { _ = w.Close(context.Background()) })
	return w
}

// waitFor waits for cond, which must not call t.FailNow (it runs on another goroutine).
func waitFor(t *testing.T, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	require.Eventually(t, cond, liveWait, 5*time.Millisecond, msgAndArgs...)
}

// waitStartSaved waits until a client without a saved token has saved its start position.
func waitStartSaved(t *testing.T, w *Watcher) {
	t.Helper()
	waitFor(t, func() bool { return w.Stats().CheckpointWrites > 0 }, "the start position is saved")
}

// requireClosed fails unless Events is closed, with nothing left in it, within liveWait.
func requireClosed(t *testing.T, w *Watcher) {
	t.Helper()
	select {
	case ev, open := <-w.Events():
		require.False(t, open, "unexpected delivery %s", ev.ResumeToken)
	case <-time.After(liveWait):
		t.Fatal("Events was not closed")
	}
}

// insertBulk inserts n rows in one statement (so their changelog rows share changed_at) and
// returns their changelog ids in order.
func (e *liveEnv) insertBulk(n int) []int64 {
	e.t.Helper()
	tx, err := e.db.Begin()
	require.NoError(e.t, err)
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.Query(`INSERT INTO items (n) SELECT g FROM generate_series(1, $1::int) g RETURNING id::text`, n)
	require.NoError(e.t, err)
	var records []string
	for rows.Next() {
		var r string
		require.NoError(e.t, rows.Scan(&r))
		records = append(records, r)
	}
	require.NoError(e.t, rows.Err())
	ids := e.queryIDs(tx, `SELECT id FROM datastore_changelog WHERE record_id = ANY($1) ORDER BY id`, records)
	require.NoError(e.t, tx.Commit())
	require.Len(e.t, ids, n)
	return ids
}

// listenConns counts the server sessions of this database opened by a watcher's listener (it
// sets application_name). It does not fail the test, so that it can be polled.
func (e *liveEnv) listenConns() int {
	n := -1
	_ = e.db.QueryRow(`SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1`, defaultAppName).Scan(&n)
	return n
}

// idsInOrder returns the ids of every changelog row of the items table in position order.
func (e *liveEnv) idsInOrder() []int64 {
	e.t.Helper()
	return e.queryIDs(e.db, `SELECT id FROM datastore_changelog WHERE table_name = 'items' ORDER BY changed_at, id`)
}

// queryIDs runs a query of one bigint column on the database or a transaction.
func (e *liveEnv) queryIDs(q interface {
	Query(string, ...any) (*sql.Rows, error)
}, query string, args ...any) []int64 {
	e.t.Helper()
	rows, err := q.Query(query, args...)
	require.NoError(e.t, err)
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		require.NoError(e.t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(e.t, rows.Err())
	return ids
}

// TestLiveBufferedDeliveriesReplayAfterRestart proves rules 1, 2 and 6: deliveries waiting in the
// Events buffer are pending, so the saved token (also the one Close saves) stops before the first
// of them that is not acknowledged, and a restart delivers them again, in order.
func TestLiveBufferedDeliveriesReplayAfterRestart(t *testing.T) {
	eachMode(t, func(t *testing.T, e *liveEnv, mode Mode) {
		ctx := context.Background()
		ids := e.insert(5)
		w := e.start(e.fromBeginning(mode))
		require.Equal(t, ids[:1], receiveWithin(t, w, 1, liveWait))
		waitFor(t, func() bool { return w.Stats().Delivered == 5 }, "2..5 are buffered in the channel")
		require.Equal(t, 5, w.Stats().Pending)

		require.NoError(t, w.MarkProcessed(ctx, tok(ids[0])))
		require.Equal(t, e.position(ids[1]).Predecessor(), e.savedToken("c"), "the token stops before the first unacknowledged delivery")
		require.NoError(t, w.Close(ctx))
		require.Equal(t, e.position(ids[1]).Predecessor(), e.savedToken("c"), "Close does not pass the buffered deliveries")

		e.requireRestartDelivers(mode, ids[1:], "a restart replays the buffered deliveries")
	})
}

// TestLiveAckIsCumulative proves rules 3 and 5: acknowledging the third delivery acknowledges the
// two before it; the saved token moves to the first delivery still pending and the cursor stays.
func TestLiveAckIsCumulative(t *testing.T) {
	eachMode(t, func(t *testing.T, e *liveEnv, mode Mode) {
		ctx := context.Background()
		ids := e.insert(5)
		w := e.start(e.fromBeginning(mode))
		require.Equal(t, ids, receiveWithin(t, w, 5, liveWait))

		require.NoError(t, w.MarkProcessed(ctx, tok(ids[2])))
		st := w.Stats()
		require.Equal(t, uint64(3), st.Acked, "the ack certifies the two deliveries before it")
		require.Equal(t, 2, st.Pending)
		require.Equal(t, e.position(ids[4]), legacyView(st.Cursor), "acks never move the read cursor")
		require.Equal(t, e.position(ids[3]).Predecessor(), e.savedToken("c"))
		require.Equal(t, e.savedToken("c"), legacyView(st.Checkpoint))

		require.NoError(t, w.MarkProcessed(ctx, tok(ids[4])))
		st = w.Stats()
		require.Equal(t, uint64(5), st.Acked)
		require.Zero(t, st.Pending)
		require.Equal(t, e.position(ids[4]), e.savedToken("c"), "with nothing pending the token is the cursor")
	})
}

// TestLiveTokensThatCertifyNothing proves rule 4: empty, unknown and duplicate tokens acknowledge
// nothing and leave the cursor alone (the first call still saves the changed checkpoint), and a
// token that is not a decimal int64 is rejected with ErrInvalidToken.
func TestLiveTokensThatCertifyNothing(t *testing.T) {
	eachMode(t, func(t *testing.T, e *liveEnv, mode Mode) {
		ctx := context.Background()
		ids := e.insert(3)
		w := e.start(e.fromBeginning(mode))
		require.Equal(t, ids, receiveWithin(t, w, 3, liveWait))
		writes := w.Stats().CheckpointWrites
		first := e.position(ids[0]).Predecessor()

		for _, token := range [][]byte{nil, {}, tok(ids[2] + 1000), tok(0), tok(-1)} {
			require.NoError(t, w.MarkProcessed(ctx, token), "token %q", token)
		}
		st := w.Stats()
		require.Zero(t, st.Acked, "nothing was acknowledged")
		require.Equal(t, 3, st.Pending)
		require.Equal(t, e.position(ids[2]), legacyView(st.Cursor), "the cursor did not move")
		require.Equal(t, first, e.savedToken("c"), "the changed checkpoint was saved, before the first delivery")
		require.Equal(t, writes+1, st.CheckpointWrites, "only the first call had a changed checkpoint to save")

		for _, bad := range []string{"not-a-number", "12abc", " 1", "1.5", "0x10", "9223372036854775808"} {
			err := w.MarkProcessed(ctx, []byte(bad))
			require.ErrorIs(t, err, ErrInvalidToken, "token %q", bad)
			require.ErrorContains(t, err, `"`+bad+`"`)
		}
		st = w.Stats()
		require.Zero(t, st.Acked)
		require.Equal(t, 3, st.Pending)
		require.Equal(t, e.position(ids[2]), legacyView(st.Cursor))
		require.Equal(t, first, e.savedToken("c"))

		require.NoError(t, w.MarkProcessed(ctx, tok(ids[0])))
		require.NoError(t, w.MarkProcessed(ctx, tok(ids[0])), "a duplicate ack")
		st = w.Stats()
		require.Equal(t, uint64(1), st.Acked, "the duplicate certified nothing more")
		require.Equal(t, 2, st.Pending)
		require.Equal(t, e.position(ids[1]).Predecessor(), e.savedToken("c"))
	})
}

// TestLiveLateRowRecoveredInHybridMode proves rule 11 on the legacy schema, with rules 1 and 3:
// transaction A inserts first and commits after B, so A's row (the earlier changed_at: the transaction start) commits
// below the cursor. Its NOTIFY names it, it is fetched by id and delivered; the cursor stays at
// B, the saved token holds behind A until A is acknowledged, and a restart before that replays A.
func TestLiveLateRowRecoveredInHybridMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLegacy(t)
	w := e.start(e.fromBeginning(ModeHybrid))
	waitStartSaved(t, w)

	txA := e.openTx()
	late := insertItem(t, txA)
	b := e.insert(1)[0]
	require.Equal(t, []int64{b}, receiveWithin(t, w, 1, liveWait))
	require.NoError(t, txA.Commit())
	require.True(t, e.position(late).Before(e.position(b)), "A's row has the earlier position")

	require.Equal(t, []int64{late}, receiveWithin(t, w, 1, liveWait), "the late row is delivered")
	require.Equal(t, e.position(b), w.Stats().Cursor, "the cursor does not move back")
	require.NoError(t, w.MarkProcessed(ctx, tok(b)))
	require.Equal(t, 1, w.Stats().Pending)
	require.Equal(t, e.position(late).Predecessor(), e.savedToken("c"), "the token holds behind the late row until it is acked")
	require.NoError(t, w.Close(ctx))
	require.Equal(t, e.position(late).Predecessor(), e.savedToken("c"))

	w2 := e.start(e.config(ModeHybrid))
	require.Equal(t, []int64{late, b}, receiveWithin(t, w2, 2, liveWait), "a restart before the ack replays it")
	require.NoError(t, w2.MarkProcessed(ctx, tok(b)))
	require.Equal(t, e.position(b), e.savedToken("c"))
	requireNothingWithin(t, w2, liveQuiet)
}

// TestLiveLateTransactionRowsRecoveredInOrder proves rule 11 on the legacy schema, with rules 1
// and 3, for a late transaction with two rows, one inserted before and one after the row of B that the watcher
// delivered first: both are recovered, in order; acknowledging B holds the token behind the first
// late row, acknowledging that one holds it behind the second, and a restart then replays the
// second late row and B (everything after the saved position).
func TestLiveLateTransactionRowsRecoveredInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLegacy(t)
	w := e.start(e.fromBeginning(ModeHybrid))
	waitStartSaved(t, w)

	txA := e.openTx()
	a1 := insertItem(t, txA)
	b := e.insert(1)[0]
	a2 := insertItem(t, txA)
	require.Equal(t, []int64{b}, receiveWithin(t, w, 1, liveWait))
	require.NoError(t, txA.Commit())
	require.Equal(t, []int64{a1, a2}, receiveWithin(t, w, 2, liveWait), "both late rows, in order")

	require.NoError(t, w.MarkProcessed(ctx, tok(b)))
	require.Equal(t, e.position(a1).Predecessor(), e.savedToken("c"))
	require.NoError(t, w.MarkProcessed(ctx, tok(a1)))
	require.Equal(t, e.position(a2).Predecessor(), e.savedToken("c"))
	require.NoError(t, w.Close(ctx))

	w2 := e.start(e.config(ModeHybrid))
	require.Equal(t, []int64{a2, b}, receiveWithin(t, w2, 2, liveWait))
	require.NoError(t, w2.MarkProcessed(ctx, tok(b)))
	require.Equal(t, e.position(b), e.savedToken("c"))
	requireNothingWithin(t, w2, liveQuiet)
}

// TestLiveLowerIDWithLaterChangedAt proves that on the legacy schema positions, not ids, order
// delivery and tokens (the position definition, rules 1 and 3): B starts its transaction after A but inserts and
// commits first, so B has the lower id and the later changed_at. A is delivered first, and an ack
// of A saves B's predecessor, from which a restart reads B alone.
func TestLiveLowerIDWithLaterChangedAt(t *testing.T) {
	runModes(t, liveModes, newLegacy, func(t *testing.T, e *liveEnv, mode Mode) {
		ctx := context.Background()
		txA := e.openTx()
		var startA time.Time
		require.NoError(t, txA.QueryRow(`SELECT now()`).Scan(&startA))
		time.Sleep(10 * time.Millisecond) // only to make B's transaction start later than A's
		b := e.insert(1)[0]
		a := insertItem(t, txA)
		require.NoError(t, txA.Commit())
		pa, pb := e.position(a), e.position(b)
		require.Greater(t, a, b, "A's row has the higher id")
		require.True(t, pa.ChangedAt.Before(pb.ChangedAt), "and the earlier changed_at")

		w := e.start(e.fromBeginning(mode))
		require.Equal(t, []int64{a, b}, receiveWithin(t, w, 2, liveWait), "delivered in position order")
		require.NoError(t, w.MarkProcessed(ctx, tok(a)))
		require.Equal(t, pb.Predecessor(), e.savedToken("c"))
		require.NoError(t, w.Close(ctx))

		e.requireRestartDelivers(mode, []int64{b})
	})
}

// TestLiveAbandonedSendStaysPending proves rules 6 and 13: with BufferSize 1, one delivery waits
// in the channel and the send of the next is blocked when the watcher stops (Close, or the end of
// Start's context). The LISTEN connection is closed, the buffered delivery can still be read,
// Events closes, the blocked row stays pending so a final watermark flush after the stop cannot
// pass it, and a restart replays it.
func TestLiveAbandonedSendStaysPending(t *testing.T) {
	t.Parallel()
	for _, mode := range liveModes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			for _, stop := range []string{"close", "cancel"} {
				t.Run(stop, func(t *testing.T) {
					t.Parallel()
					testAbandonedSend(t, newLive(t), mode, stop == "cancel")
				})
			}
		})
	}
}

func testAbandonedSend(t *testing.T, e *liveEnv, mode Mode, cancelStart bool) {
	bg := context.Background()
	ids := e.insert(3)
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	cfg := e.fromBeginning(mode)
	cfg.BufferSize = 1
	w := e.startCtx(ctx, cfg)
	waitFor(t, func() bool { st := w.Stats(); return st.Delivered == 1 && st.Pending == 2 },
		"the first row waits in the channel and the send of the second is blocked")

	if mode != ModePolling {
		require.Equal(t, 1, e.listenConns(), "the LISTEN connection is open")
	}
	if cancelStart {
		cancel()
	} else {
		require.NoError(t, w.Close(bg))
	}
	if mode != ModePolling {
		waitFor(t, func() bool { return e.listenConns() == 0 }, "the LISTEN connection is closed")
	}
	require.Equal(t, ids[:1], receiveWithin(t, w, 1, liveWait), "what was buffered can still be read")
	requireClosed(t, w)
	if cancelStart {
		require.ErrorIs(t, w.Err(), context.Canceled)
	} else {
		require.NoError(t, w.Err())
	}
	st := w.Stats()
	require.Equal(t, uint64(1), st.Delivered)
	require.Equal(t, 2, st.Pending, "the abandoned send stays pending")

	require.NoError(t, w.MarkProcessed(bg, tok(ids[0])), "the final watermark, after the stop")
	require.NoError(t, w.Flush(bg))
	require.Equal(t, e.position(ids[1]).Predecessor(), e.savedToken("c"), "the abandoned row is never passed")
	require.NoError(t, w.Close(bg), "Close after the stop (or a second Close) is fine")
	require.Equal(t, e.position(ids[1]).Predecessor(), e.savedToken("c"))

	e.requireRestartDelivers(mode, ids[1:], "a restart replays the abandoned rows")
}

// TestLiveFinalWatermarkAfterClose proves rules 6 and 13 for the shutdown flush: the consumer read
// two events; a third waits in the channel and the send of a fourth is blocked at Close. Acking
// the last token received after Close, and then Flush, saves the position before the third. A
// consumer that drains the channel after Close and acks the third still cannot pass the fourth,
// which was never handed out.
func TestLiveFinalWatermarkAfterClose(t *testing.T) {
	eachMode(t, func(t *testing.T, e *liveEnv, mode Mode) {
		ctx := context.Background()
		ids := e.insert(5)
		cfg := e.fromBeginning(mode)
		cfg.BufferSize = 1
		w := e.start(cfg)
		require.Equal(t, ids[:2], receiveWithin(t, w, 2, liveWait))
		waitFor(t, func() bool { st := w.Stats(); return st.Delivered == 3 && st.Pending == 4 },
			"the third row waits in the channel and the send of the fourth is blocked")
		require.NoError(t, w.Close(ctx))

		require.NoError(t, w.MarkProcessed(ctx, tok(ids[1])), "the last token received")
		require.NoError(t, w.Flush(ctx))
		require.Equal(t, e.position(ids[2]).Predecessor(), e.savedToken("c"), "the row left in the channel is not passed")

		require.Equal(t, ids[2:3], receiveWithin(t, w, 1, liveWait), "draining after Close")
		requireClosed(t, w)
		require.NoError(t, w.MarkProcessed(ctx, tok(ids[2])))
		require.NoError(t, w.Flush(ctx))
		st := w.Stats()
		require.Equal(t, uint64(3), st.Acked)
		require.Equal(t, 1, st.Pending)
		require.Equal(t, e.position(ids[3]).Predecessor(), e.savedToken("c"), "the row never handed out is not passed")

		e.requireRestartDelivers(mode, ids[3:])
	})
}

// TestLiveSaturationFloor proves rule 7: with MaxPending 16 and no acks, delivery continues past
// the cap; tracking stays bounded, the evicted deliveries hold the saved token through the floor
// at the first unacknowledged row, an ack of an evicted delivery changes nothing, a restart
// replays from the first unacknowledged row, and an ack of a tracked delivery clears the floor.
func TestLiveSaturationFloor(t *testing.T) {
	eachMode(t, func(t *testing.T, e *liveEnv, mode Mode) {
		const n, maxPending = 40, 16
		ctx := context.Background()
		ids := e.insertBulk(n)
		cfg := e.fromBeginning(mode)
		cfg.MaxPending, cfg.BufferSize = maxPending, 4
		w := e.start(cfg)
		require.Equal(t, ids, receiveWithin(t, w, n, liveWait), "delivery never blocks on tracking")
		st := w.Stats()
		require.Equal(t, maxPending, st.Pending, "tracking is bounded")
		require.Equal(t, uint64(n-maxPending), st.Evicted)
		require.True(t, st.FloorActive)
		require.NoError(t, w.Flush(ctx))
		require.Equal(t, e.position(ids[0]).Predecessor(), e.savedToken("c"), "the floor holds the first unacknowledged row")

		require.NoError(t, w.MarkProcessed(ctx, tok(ids[2])), "an evicted delivery")
		st = w.Stats()
		require.True(t, st.FloorActive, "an ack of an evicted delivery certifies nothing")
		require.Zero(t, st.Acked)
		require.Equal(t, e.position(ids[0]).Predecessor(), e.savedToken("c"))
		require.NoError(t, w.Close(ctx))

		cfg.StartFromBeginning = false
		w2 := e.start(cfg)
		require.Equal(t, ids, receiveWithin(t, w2, n, liveWait), "a restart replays from the first unacknowledged row")
		require.True(t, w2.Stats().FloorActive)
		require.NoError(t, w2.MarkProcessed(ctx, tok(ids[30])), "a tracked delivery")
		st = w2.Stats()
		require.False(t, st.FloorActive, "an ack of a tracked delivery clears the floor")
		require.Equal(t, n-31, st.Pending)
		require.Equal(t, e.position(ids[31]).Predecessor(), e.savedToken("c"))
	})
}
