package pgchangestream

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/admin"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/stretchr/testify/require"
)

// TestLiveParkIsFencedForAFormerOwner: a watcher whose handler fails for good after a later
// owner took its event over parks nothing: Process stops with ErrFenced and the dead-letter
// table stays empty, so no stale row is left for an operator to run again. The takeover happens
// while the handler runs, as for a process paused past its lock or lease: an exclusive client's
// owner epoch moves on; a Shared member's range is given to another member.
func TestLiveParkIsFencedForAFormerOwner(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		config   func(*Config)
		takeOver string
	}{
		{"exclusive", func(c *Config) { c.Exclusive = true },
			`UPDATE resume_tokens SET owner_epoch = owner_epoch + 1 WHERE client_name = 'c'`},
		// A lease long enough that the member looks at the ranges again only after the test.
		{"shared", func(c *Config) { c.Shared, c.SharedLease = true, MaxSharedLease },
			`UPDATE datastore_changelog_ranges SET owner = NULL WHERE client_name = 'c'`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newLive(t)
			cfg := procConfig(e)
			tc.config(&cfg)
			w := e.start(cfg)
			if cfg.Shared {
				require.Eventually(t, func() bool { return len(w.Stats().Shared.Ranges) == SharedRanges }, liveWait, 10*time.Millisecond)
			}
			entered, gate := make(chan struct{}), make(chan struct{})
			handle := func(ctx context.Context, ev EventWithToken) error {
				close(entered)
				<-gate
				return errors.New("poison")
			}
			opts := ProcessOptions{OnFailure: ParkOnFailure, MaxAttempts: 1}
			errc, cancel := startProcess(t, w, opts, handle)
			defer cancel()
			e.insert(1)
			select {
			case <-entered:
			case <-time.After(liveWait):
				t.Fatal("the handler did not run")
			}
			_, err := e.db.Exec(tc.takeOver)
			require.NoError(t, err)
			close(gate)
			select {
			case err := <-errc:
				require.ErrorIs(t, err, ErrFenced)
			case <-time.After(liveWait):
				t.Fatal("Process did not stop")
			}
			require.Empty(t, e.listParked(), "the former owner parked the event")
		})
	}
}

// TestLiveSharedRerunsOnlyOnTheRangeOwner: two Shared members run Process over one client; an
// event parked after failing is run again, once RetryParked asks for it, by the member that owns
// its range only, and once: the other member, which polls the same dead-letter table, leaves it.
func TestLiveSharedRerunsOnlyOnTheRangeOwner(t *testing.T) {
	t.Parallel()
	r := runSharedPoison(t, false)
	require.Equal(t, []string{r.owner}, r.reran, "the parked event reran on %v; its range (%d) is %s's (a %v, b %v)",
		r.reran, r.rangeNo, r.owner, r.ranges["a"], r.ranges["b"])
}

// TestLiveSharedRerunsAnEventWhoseRowIsGone: a released parked event whose changelog row was
// deleted (pruned) has no range to own; it still runs again and leaves the dead-letter table.
func TestLiveSharedRerunsAnEventWhoseRowIsGone(t *testing.T) {
	t.Parallel()
	r := runSharedPoison(t, true)
	require.NotEmpty(t, r.reran, "the released event of a deleted changelog row never ran again")
}

// sharedPoison is what runSharedPoison saw: the members that ran the poison again after its
// release, the member owning its range (when its row was kept) and the members' ranges.
type sharedPoison struct {
	reran   []string
	owner   string
	rangeNo int
	ranges  map[string][]int
}

// runSharedPoison runs Process on two Shared members of one client over 20 new rows, the tenth
// of which fails until it is parked; with gone, its changelog row is then deleted. The poison is
// released with RetryParked and the members run until its parked row is gone and both polled
// again after that.
func runSharedPoison(t *testing.T, gone bool) sharedPoison {
	e := newLive(t)
	cfg := e.config(ModePolling)
	// A lease long enough that no member's lapses under a loaded machine (a hand-over would move
	// the poison's range), short enough that the two split the ranges within liveWait.
	cfg.Shared, cfg.SharedLease, cfg.StartFromBeginning = true, 3*time.Second, true
	var (
		mu     sync.Mutex
		cured  bool
		poison int64
		ran    = map[int64][]string{} // successful runs of each event, by member
	)
	handler := func(name string) Handler {
		return func(_ context.Context, ev EventWithToken) error {
			id := tokenID(t, ev)
			mu.Lock()
			defer mu.Unlock()
			if id == poison && !cured {
				return errors.New("poison")
			}
			ran[id] = append(ran[id], name)
			return nil
		}
	}
	opts := ProcessOptions{Workers: 2, OnFailure: ParkOnFailure, MaxAttempts: 1, ParkedPollInterval: 20 * time.Millisecond}
	stops := map[string]func(){}
	a, b := startSplitPair(t, e, cfg, nil)
	for name, w := range map[string]*Watcher{"a": a, "b": b} {
		errc, cancel := startProcess(t, w, opts, handler(name))
		stops[name] = func() {
			cancel()
			require.NoError(t, <-errc)
		}
	}
	var last int64
	require.NoError(t, e.db.QueryRow(`SELECT coalesce(max(id), 0) FROM datastore_changelog`).Scan(&last))
	mu.Lock()
	poison = last + 10 // the tenth row to come, set before it is written
	mu.Unlock()
	ids := e.insert(20)
	require.Contains(t, ids, poison)
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) == len(ids)-1
	}, "every other event runs")
	var parked []ParkedEvent
	waitFor(t, func() bool { parked = e.listParked(); return len(parked) == 1 }, "the poison is parked")
	require.Equal(t, poison, parked[0].ChangelogID)
	r := sharedPoison{owner: "a", rangeNo: -1}
	if gone {
		_, err := e.db.Exec(`DELETE FROM datastore_changelog WHERE id = $1`, poison)
		require.NoError(t, err)
	} else {
		var unit int
		require.NoError(t, e.db.QueryRow(`SELECT `+changelog.UnitExpression("datastore_changelog")+` FROM datastore_changelog WHERE id = $1`, poison).Scan(&unit))
		r.rangeNo = unit / unitsPerRange
		if slices.Contains(b.Stats().Shared.Ranges, r.rangeNo) {
			r.owner = "b"
		}
	}
	mu.Lock()
	cured = true
	mu.Unlock()
	require.NoError(t, admin.RetryParked(context.Background(), e.db, "c", parked[0].ID, admin.Options{}))
	waitFor(t, func() bool { return len(e.listParked()) == 0 }, "the rerun removes the parked row")
	time.Sleep(10 * opts.ParkedPollInterval) // polls of both members after it
	r.ranges = map[string][]int{"a": a.Stats().Shared.Ranges, "b": b.Stats().Shared.Ranges}
	for _, stop := range stops {
		stop()
	}
	mu.Lock()
	defer mu.Unlock()
	r.reran = ran[poison]
	return r
}
