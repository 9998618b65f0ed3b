package pgchangestream

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// sharedRangeOf returns the range of changelog row id.
func sharedRangeOf(t *testing.T, e *liveEnv, id int64) int {
	return pgtest.Scalar[int](t, e.db, `SELECT `+changelog.UnitExpression("datastore_changelog")+` / 16 FROM datastore_changelog WHERE id = $1`, id)
}

// sharedStatementsWatcher is a Shared watcher of client "c", not started, as member id; the
// members 7, 8 and 9 hold leases, and every range of the client is owned by 7 except range
// other, owned by 8.
func sharedStatementsWatcher(t *testing.T, e *liveEnv, id int64, other int) *Watcher {
	cfg := e.config(ModePolling)
	cfg.Shared, cfg.LockSessionTimeout = true, MinLockSessionTimeout
	w, err := New(cfg)
	require.NoError(t, err)
	w.sh.id.Store(id)
	pgtest.Exec(t, e.db, `INSERT INTO datastore_changelog_members (client_name, member, name, lease_until, valid_since)
		SELECT 'c', m, 'm' || m, now() + interval '1 hour', now() - interval '1 hour' FROM unnest('{7,8,9}'::bigint[]) AS m
		ON CONFLICT DO NOTHING`) // settled: they may claim the ranges of members whose lease ran out
	pgtest.Exec(t, e.db, `INSERT INTO datastore_changelog_ranges (client_name, range_no, owner, resume_token)
		SELECT 'c', g, CASE WHEN g = $1 THEN 8 ELSE 7 END, '{}' FROM generate_series(0, 63) AS g ON CONFLICT DO NOTHING`, other)
	return w
}

// claimEnded is claimIn, its transaction committed when the claim inserted its row and
// rolled back otherwise.
func claimEnded(t *testing.T, e *liveEnv, w *Watcher, id int64) (bool, error) {
	tx, claimed, err := claimIn(t, e, w, id)
	if claimed {
		require.NoError(t, tx.Commit())
	} else {
		require.NoError(t, tx.Rollback())
	}
	return claimed, err
}

// The statements on the database: a member's transactional claim inserts only in a range it
// owns and holds that range FOR KEY SHARE until its transaction ends; a claim of ranges skips
// the ranges so held (without waiting) and takes them once the transaction ended; after that
// the former owner's claim is fenced off; and the compaction deletes only what the member's
// checkpoint certifies in the ranges it owns without a floor, and the rows of gone changelog
// rows.
func TestLiveSharedTxStatements(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	ids := e.insert(60)
	ranges := map[int64]int{}
	byRange := map[int][]int64{}
	for _, id := range ids {
		r := sharedRangeOf(t, e, id)
		ranges[id] = r
		byRange[r] = append(byRange[r], id)
	}
	// Range other is member 8's; floor is 7's with a floor; held is 7's, whose claim will be in
	// flight when member 9 claims it; free is a range without an owner.
	other, floor, held, heldID := ranges[ids[0]], -1, -1, int64(0)
	for _, id := range ids {
		switch r := ranges[id]; {
		case r == other || r == floor || r == held:
		case floor < 0:
			floor = r
		case held < 0:
			held, heldID = r, id
		}
	}
	require.True(t, held >= 0, "the rows fall in fewer than three ranges")
	free := SharedRanges - 1
	for free == other || free == floor || free == held {
		free--
	}
	w := sharedStatementsWatcher(t, e, 7, other)

	// A claim in the member's range inserts once; a second one finds it done.
	mine := byRange[floor][0]
	claimed, err := claimEnded(t, e, w, mine)
	require.NoError(t, err)
	require.True(t, claimed)
	claimed, err = claimEnded(t, e, w, mine)
	require.NoError(t, err)
	require.False(t, claimed, "a committed claim was claimed again")

	// Compaction, with a checkpoint that certifies the rows up to ids[40], and range floor under
	// a floor (and range other in the view, as a stale one would have it: the owner check
	// excludes it).
	pgtest.Exec(t, e.db, `INSERT INTO datastore_changelog_acks (client_name, changelog_id)
		SELECT 'c', id FROM datastore_changelog UNION ALL SELECT 'c', 1000000 ON CONFLICT DO NOTHING`)
	saved := Position{ID: ids[40]}
	require.NoError(t, e.db.QueryRow(`SELECT changed_at FROM datastore_changelog WHERE id = $1`, ids[40]).Scan(&saved.ChangedAt))
	all := make([]int, SharedRanges)
	for r := range all {
		all[r] = r
	}
	w.sh.view.Store(newSharedView(all, map[int]Position{floor: {ID: 1}}))
	w.mu.Lock()
	w.savedMirror, w.loaded = saved, true
	w.mu.Unlock()
	n, err := w.compactAcks(context.Background())
	require.NoError(t, err)
	var want []int64
	for i, id := range ids {
		if r := ranges[id]; i > 40 || r == other || r == floor {
			want = append(want, id)
		}
	}
	require.Equal(t, want, e.ackRows("c"))
	require.EqualValues(t, len(ids)+1-len(want), n)

	// A claim of member 7 in flight holds its range: member 9's claim of that range and a
	// free one, once 7's lease ran out, takes the free one at once and skips the held one.
	pgtest.Exec(t, e.db, `DELETE FROM datastore_changelog_acks WHERE changelog_id = $1`, heldID)
	pgtest.Exec(t, e.db, `UPDATE datastore_changelog_ranges SET owner = NULL WHERE range_no = $1`, free)
	inFlight, claimed, err := claimIn(t, e, w, heldID)
	require.NoError(t, err)
	require.True(t, claimed)
	pgtest.Exec(t, e.db, `UPDATE datastore_changelog_members SET lease_until = now() - interval '1 second' WHERE member = 7`)
	w9 := sharedStatementsWatcher(t, e, 9, other)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	require.NoError(t, w9.sh.claimRanges(ctx, []int{held, free}), "the claim waited for the claim in flight")
	owner := func(r int) int64 {
		return pgtest.Scalar[int64](t, e.db, `SELECT COALESCE(owner, 0) FROM datastore_changelog_ranges WHERE client_name = 'c' AND range_no = $1`, r)
	}
	require.EqualValues(t, 9, owner(free))
	require.EqualValues(t, 7, owner(held), "a range claimed while a claim of its former owner was in flight")

	// The claim in flight commits; the range is claimed at the next look, and the former
	// owner's claims are fenced off from then on, while the committed one stays done.
	require.NoError(t, inFlight.Commit())
	require.NoError(t, w9.sh.claimRanges(ctx, []int{held, free}))
	require.EqualValues(t, 9, owner(held))
	claimed, err = claimEnded(t, e, w, heldID)
	require.NoError(t, err)
	require.False(t, claimed, "the committed claim is done")
	var fresh int64 // a row of range held without an acknowledgement row
	for i := 0; fresh == 0; i++ {
		require.Less(t, i, 5000, "no row written falls in range %d", held)
		if id := e.insert(1)[0]; sharedRangeOf(t, e, id) == held {
			fresh = id
		}
	}
	_, err = claimEnded(t, e, w, fresh)
	require.ErrorIs(t, err, ErrFenced)
	require.ErrorIs(t, w.excl.lostErr(), ErrFenced, "the fenced-off member goes on")
}

// TestLiveSharedProcessTxMembers runs ProcessTx members of one client in separate processes,
// each handler inserting one effect row per event in its transaction (the effects table has no
// key: a duplicate would show), while writers commit throughout: it scales them 1 → 3 → 2,
// kills one with SIGKILL and pauses one with SIGSTOP for three leases (it must stop, fenced
// off, when it wakes). At the end every committed changelog row has exactly one effect.
func TestLiveSharedProcessTxMembers(t *testing.T) {
	e := newLive(t)
	_, err := e.db.Exec(`CREATE TABLE effects (changelog_id bigint NOT NULL, member text NOT NULL)`)
	require.NoError(t, err)
	writers := e.startWriters(2, 5*time.Millisecond)
	start := func(name string) *sharedMemberProc {
		return startSharedMember(t, e, name, sharedChildMode+"="+sharedModeTx)
	}

	m1 := start("m1")
	waitSharedOwners(t, e, "one member", "m1")
	time.Sleep(time.Second)
	m2, m3 := start("m2"), start("m3")
	waitSharedOwners(t, e, "scaled to 3", "m1", "m2", "m3")
	time.Sleep(time.Second)
	m3.stop(t)
	waitSharedOwners(t, e, "scaled to 2", "m1", "m2")
	time.Sleep(time.Second)

	require.NoError(t, m2.cmd.Process.Kill())
	<-m2.done
	m4 := start("m4")
	waitSharedOwners(t, e, "m2 killed, m4 joined", "m1", "m4")
	time.Sleep(time.Second)

	m1.pausePastItsLease(t, e, "m4")
	m5 := start("m5")
	waitSharedOwners(t, e, "m5 joined", "m4", "m5")
	time.Sleep(time.Second)

	writers.stop()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var missing int
		require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog c WHERE c.table_name = $1
			AND NOT EXISTS (SELECT FROM effects f WHERE f.changelog_id = c.id)`, liveTable).Scan(&missing))
		if missing == 0 {
			break
		}
		require.False(t, time.Now().After(deadline), "%d committed changelog rows have no effect", missing)
		time.Sleep(200 * time.Millisecond)
	}
	m4.stop(t)
	m5.stop(t)

	var total, distinct int
	var twice sql.NullString
	require.NoError(t, e.db.QueryRow(`SELECT count(*), count(DISTINCT changelog_id),
		(SELECT string_agg(changelog_id || ' by ' || members, ', ') FROM (SELECT changelog_id, string_agg(member, '+') AS members
			FROM effects GROUP BY 1 HAVING count(*) > 1 ORDER BY 1 LIMIT 5) d) FROM effects`).Scan(&total, &distinct, &twice))
	rows := e.changelogCount()
	byMember := map[string]int{}
	res, err := e.db.Query(`SELECT member, count(*) FROM effects GROUP BY 1`)
	require.NoError(t, err)
	for res.Next() {
		var m string
		var n int
		require.NoError(t, res.Scan(&m, &n))
		byMember[m] = n
	}
	require.NoError(t, res.Err())
	res.Close()
	t.Logf("%d effects (%d distinct) for %d changelog rows (%d committed by the writers), by member %v",
		total, distinct, rows, writers.committed(), byMember)
	require.Equal(t, distinct, total, "effects written twice, e.g. %s", twice.String)
	require.Equal(t, rows, total, "not one effect per changelog row")
	require.GreaterOrEqual(t, rows, writers.committed(), "every row the writers committed is in the changelog")
	for _, m := range []string{"m1", "m2", "m4", "m5"} {
		require.Positive(t, byMember[m], "member %s committed no effect", m)
	}
}
