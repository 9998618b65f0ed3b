package pgchangestream

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/admin"
	"github.com/pgchangestream/pgchangestream/schema"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Contract rule 21: every start path that reads existing history delivers one row's changes in
// commit order. changed_at is the writing transaction's start, so a transaction that began
// first and committed its change of a row last puts that change first in (changed_at, id)
// order; the changelog id still follows commit order for one row.

// raceRow writes rounds of the start-order race on items row r, setting n from next on: tx A
// begins, tx B begins later, B sets n and commits, then A sets n+1 and commits. A's changelog
// row has the earlier changed_at and the higher id. It checks that the race happened, and
// returns the next n.
func (e *liveEnv) raceRow(r string, next, rounds int) int {
	e.t.Helper()
	for range rounds {
		a := e.openTx()
		var began time.Time
		require.NoError(e.t, a.QueryRow(`SELECT now()`).Scan(&began)) // A's changed_at
		b := e.openTx()
		_, err := b.Exec(`UPDATE items SET n = $2 WHERE id = $1`, r, next)
		require.NoError(e.t, err)
		require.NoError(e.t, b.Commit())
		_, err = a.Exec(`UPDATE items SET n = $2 WHERE id = $1`, r, next+1)
		require.NoError(e.t, err)
		require.NoError(e.t, a.Commit())
		var aFirst bool
		require.NoError(e.t, e.db.QueryRow(`SELECT (SELECT changed_at FROM datastore_changelog WHERE record_id::text = $1
			ORDER BY id DESC LIMIT 1) < (SELECT changed_at FROM datastore_changelog WHERE record_id::text = $1
			ORDER BY id DESC OFFSET 1 LIMIT 1)`, r).Scan(&aFirst))
		require.True(e.t, aFirst, "the change that committed last has the earlier changed_at")
		next += 2
	}
	return next
}

// rowChanges takes n deliveries of w, acknowledging each, and returns the n each set.
func rowChanges(t *testing.T, w *Watcher, n int) []int {
	t.Helper()
	var got []int
	timeout := time.After(liveWait)
	for len(got) < n {
		select {
		case ev, ok := <-w.Events():
			require.True(t, ok, "Events closed after %v (Err: %v)", got, w.Err())
			got = append(got, changeOf(t, ev.Event).n)
			require.NoError(t, w.MarkProcessed(context.Background(), ev.ResumeToken))
		case <-timeout:
			t.Fatalf("received %v of %d changes in %v", got, n, liveWait)
		}
	}
	return got
}

// resetAfterClose resets client's token to target once the client's lock, which a closed
// watcher's LISTEN session held, is released (the server ends the session after the close).
func (e *liveEnv) resetAfterClose(client string, target admin.ResetTarget) {
	e.t.Helper()
	ctx := context.Background()
	target.DryRun = true
	pos, err := admin.ResetToken(ctx, e.db, client, target, admin.Options{})
	require.NoError(e.t, err)
	waitFor(e.t, func() bool {
		_, err = admin.ResetToken(ctx, e.db, client, admin.ResetTarget{Position: &pos}, admin.Options{})
		return !errors.Is(err, ErrClientActive)
	}, "the closed watcher's lock is released")
	require.NoError(e.t, err)
}

// upTo returns the integers from lo to hi, both included.
func upTo(lo, hi int) []int {
	var out []int
	for n := lo; n <= hi; n++ {
		out = append(out, n)
	}
	return out
}

// TestLiveStartPathsDeliverInCommitOrder proves rule 21 in every mode: one row's history holds
// three rounds of the start-order race, and each start path that reads it delivers the row's
// changes in commit order: a new client starting from the beginning, a client reset to the
// beginning, to a row's id and to a time, a new Shared member's first claim, and a Shared client
// whose ranges were reset after a row. On the "switched" changelog the row's first changes were
// written before the upgrade (no txid): they come first, in legacy order, and the race after the
// upgrade follows. Each path is checked on its own (assert), so that every one out of order is
// reported.
func TestLiveStartPathsDeliverInCommitOrder(t *testing.T) {
	t.Parallel()
	for _, history := range []struct {
		name   string
		newEnv func(*testing.T) *liveEnv
	}{{"upgraded", newLive}, {"switched", newLegacy}} {
		t.Run(history.name, func(t *testing.T) {
			runModes(t, allModes, history.newEnv, func(t *testing.T, e *liveEnv, mode Mode) {
				ctx := context.Background()
				r := e.newItem() // n = 0
				next := 1
				if history.name == "switched" {
					for ; next <= 2; next++ {
						_, err := e.db.Exec(`UPDATE items SET n = $2 WHERE id = $1`, r, next)
						require.NoError(t, err)
					}
					require.NoError(t, errOf(schema.Install(ctx, e.db, schema.Options{})))
				}
				var before int64 // the last changelog row before the race
				require.NoError(t, e.db.QueryRow(`SELECT max(id) FROM datastore_changelog`).Scan(&before))
				first := next
				last := e.raceRow(r, next, 3) - 1
				var raceBegan time.Time
				require.NoError(t, e.db.QueryRow(`SELECT min(changed_at) FROM datastore_changelog WHERE id > $1`, before).Scan(&raceBegan))
				all, race := upTo(0, last), upTo(first, last)

				client := func(name string) Config {
					cfg := e.config(mode)
					cfg.ClientName = name
					return cfg
				}
				cfg := client("new")
				cfg.StartFromBeginning = true
				assert.Equal(t, all, rowChanges(t, e.start(cfg), len(all)), "a new client starting from the beginning")

				cfg = client("shared")
				cfg.StartFromBeginning, cfg.Shared = true, true
				w := e.start(cfg)
				assert.Equal(t, all, rowChanges(t, w, len(all)), "a new Shared member's first claim")
				require.NoError(t, w.Close(ctx))
				e.resetAfterClose(cfg.ClientName, admin.ResetTarget{AfterID: before})
				assert.Equal(t, race, rowChanges(t, e.start(cfg), len(race)), "a Shared client's ranges reset after a row")

				for _, reset := range []struct {
					name   string
					target admin.ResetTarget
					want   []int
				}{
					{"reset to the beginning", admin.ResetTarget{Beginning: true}, all},
					{"reset after a row", admin.ResetTarget{AfterID: before}, race},
					{"reset to a time", admin.ResetTarget{Time: raceBegan}, race},
				} {
					cfg := client(reset.name)
					w := e.start(cfg)
					waitStartSaved(t, w)
					require.NoError(t, w.Close(ctx))
					e.resetAfterClose(cfg.ClientName, reset.target)
					assert.Equal(t, reset.want, rowChanges(t, e.start(cfg), len(reset.want)), reset.name)
				}
			})
		})
	}
}

// holdEmptyRead is an Observer that, once armed, holds the reader in its next legacy read that
// found nothing: it sends the read's start on held, then waits for release (or the end of the
// watcher's context).
type holdEmptyRead struct {
	armed   atomic.Bool    // set by the test, cleared by the reader's read it holds
	held    chan time.Time // buffered (1): sent on by the reader, received by the test
	release chan struct{}  // closed by the test
}

func (h *holdEmptyRead) ObserveRead(ctx context.Context, r ReadObservation) {
	if r.Rows == 0 && r.Err == nil && r.From.Span == nil && h.armed.CompareAndSwap(true, false) {
		h.held <- r.Start
		select {
		case <-h.release:
		case <-ctx.Done():
		}
	}
}

func (h *holdEmptyRead) ObserveSave(context.Context, SaveObservation) {}

// TestLiveInPlaceSwitchOverDeliversInCommitOrder proves rule 21, in every mode, for a watcher
// that switches over in place: it reads a legacy changelog, which is upgraded while its reader is
// held after its first read, which found nothing; a row's insert and three rounds of the
// start-order race then commit, so that the switch-over, the first thing the reader does once
// released, finds them after its cursor. They are delivered in commit order.
func TestLiveInPlaceSwitchOverDeliversInCommitOrder(t *testing.T) {
	runModes(t, allModes, newLegacy, func(t *testing.T, e *liveEnv, mode Mode) {
		hold := &holdEmptyRead{held: make(chan time.Time, 1), release: make(chan struct{})}
		hold.armed.Store(true)
		cfg := e.config(mode)
		cfg.Observer = hold
		w := e.start(cfg)
		var heldAt time.Time
		select {
		case heldAt = <-hold.held:
		case <-time.After(liveWait):
			t.Fatal("the reader did not read")
		}
		require.NoError(t, errOf(schema.Install(context.Background(), e.db, schema.Options{})))
		last := e.raceRow(e.newItem(), 1, 3) - 1
		// The watcher looks for the txid column after a read that caught up, once
		// upgradeCheckInterval has passed since it last looked, which it did before the held
		// read began: released then, it switches over at once.
		time.Sleep(time.Until(heldAt.Add(upgradeCheckInterval)))
		close(hold.release)
		assert.Equal(t, upTo(0, last), rowChanges(t, w, last+1))
		waitFor(t, func() bool { return strings.Contains(e.rawToken(cfg.ClientName), `"snapshot"`) }, "the watcher switched over")
	})
}

// lagAtFirstDelta is an Observer that sends on at, once, the watcher's last empty read
// ([Watcher.LagState]) as its first delta read ends.
type lagAtFirstDelta struct {
	w    atomic.Pointer[Watcher] // set by the test before Start
	once atomic.Bool             // set by the reader at its first delta read
	at   chan time.Time          // buffered (1): sent on by the reader, received by the test
}

func (o *lagAtFirstDelta) ObserveRead(_ context.Context, r ReadObservation) {
	if r.From.InDelta() && o.once.CompareAndSwap(false, true) {
		lastEmpty, _ := o.w.Load().LagState()
		o.at <- lastEmpty
	}
}

func (o *lagAtFirstDelta) ObserveSave(context.Context, SaveObservation) {}

// TestLiveStartFromBeginningCatchesUpAfterTheHistory proves, in every mode, that a client
// starting from the beginning of an upgraded changelog, whose history is read in deltas after an
// empty legacy part, does not report an empty read (caught up, as tail --exit-at-end takes it)
// before it has read the history.
func TestLiveStartFromBeginningCatchesUpAfterTheHistory(t *testing.T) {
	runModes(t, allModes, newLive, func(t *testing.T, e *liveEnv, mode Mode) {
		ids := e.insert(3)
		o := &lagAtFirstDelta{at: make(chan time.Time, 1)}
		cfg := e.fromBeginning(mode)
		cfg.Observer = o
		w, err := New(cfg)
		require.NoError(t, err)
		o.w.Store(w)
		w.Start(context.Background())
		t.Cleanup(func() { _ = w.Close(context.Background()) })
		select {
		case lastEmpty := <-o.at:
			require.True(t, lastEmpty.IsZero(), "an empty read was reported at %v, before the history was read", lastEmpty)
		case <-time.After(liveWait):
			t.Fatal("no delta was read")
		}
		require.Equal(t, ids, receiveWithin(t, w, len(ids), liveWait))
	})
}
