package pgchangestream

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// A range's floor certifies what its saved position certifies: the rows its base sees, and
// in its delta the rows up to its id.
func TestRowCertified(t *testing.T) {
	base, end := mustSnapshot(t, "100:110:100,104"), mustSnapshot(t, "104:120:104")
	inDelta := Position{ID: 50, Span: &position.Span{Seq: 1, Base: base, End: end, HasEnd: true}, InRows: true}
	atStart := Position{ID: 50, Span: &position.Span{Seq: 1, Base: base}}
	row := func(id int64) Position { return Position{ID: id, Span: &position.Span{Seq: 3}, InRows: true} }
	for _, c := range []struct {
		p    Position
		id   int64
		xid  uint64
		want bool
	}{
		{inDelta, 10, 101, true},  // its base sees 101
		{inDelta, 60, 101, true},  // whatever the id
		{inDelta, 40, 100, true},  // finished in the delta, id up to 50
		{inDelta, 50, 100, true},  // finished in the delta, its id
		{inDelta, 60, 100, false}, // finished in the delta, id after 50
		{inDelta, 40, 104, false}, // still running at the delta's end
		{inDelta, 40, 115, true},  // below the end's xmax and finished
		{inDelta, 40, 120, false}, // after the delta
		{atStart, 40, 100, false}, // at the start: only the base
		{atStart, 40, 109, true},
	} {
		require.Equal(t, c.want, rowCertified(c.p, row(c.id), c.xid), "%v: row %d of %d", c.p, c.id, c.xid)
	}
	// The legacy part of a switch-over: every delta position passed it; a switch-over position
	// passed its rows up to it.
	legacy := Position{ID: 7, Span: &position.Span{Base: base}}
	require.True(t, rowCertified(inDelta, Position{ID: 9, Span: legacy.Span}, 0))
	require.True(t, rowCertified(legacy, Position{ID: 7, Span: legacy.Span}, 0))
	require.False(t, rowCertified(legacy, Position{ID: 8, Span: legacy.Span}, 0))
	require.False(t, rowCertified(legacy, row(1), 101))
}

// Ranges saved at different positions start at the intersection of their bases, each ahead
// of it with a floor; equal ones start there with none.
func TestSharedStart(t *testing.T) {
	now := mustSnapshot(t, "200:200:")
	p1 := Position{ID: 5, Span: &position.Span{Seq: 1, Base: mustSnapshot(t, "100:110:100,104")}}
	p2 := Position{ID: 9, Span: &position.Span{Seq: 1, Base: mustSnapshot(t, "98:108:98,105"), End: mustSnapshot(t, "120:130:"), HasEnd: true}, InRows: true}
	x, floors := sharedStart([]int{3, 4}, []Position{p1, p1}, now)
	require.True(t, samePosition(x, p1))
	require.Nil(t, floors)

	x, floors = sharedStart([]int{3, 4, 7}, []Position{p1, p2, p1}, now)
	require.Equal(t, "98:108:98,100,104,105", x.Span.Base.String())
	require.False(t, x.InRows)
	require.Len(t, floors, 3)
	for r, f := range floors {
		require.True(t, x.Span.Base.Within(f.Span.Base), "range %d: the start sees more than its floor", r)
	}

	x, floors = sharedStart(nil, nil, now)
	require.Equal(t, now.String(), x.Span.Base.String())
	require.Nil(t, floors)
}

func TestCovers(t *testing.T) {
	p := Position{ID: 9, Span: &position.Span{Seq: 1, Base: mustSnapshot(t, "98:108:98,105"), End: mustSnapshot(t, "120:130:"), HasEnd: true}, InRows: true}
	require.True(t, covers(p, p))
	require.False(t, covers(Position{ID: 10, Span: &position.Span{Seq: 2, Base: mustSnapshot(t, "110:125:")}}, p)) // not past the delta's end
	require.True(t, covers(Position{ID: 10, Span: &position.Span{Seq: 2, Base: mustSnapshot(t, "130:131:130")}}, p))
	legacy := Position{ID: 7, Span: &position.Span{Base: mustSnapshot(t, "98:108:98")}}
	require.True(t, covers(p, legacy))
	require.False(t, covers(legacy, p))
}

func TestRangesToReleaseAndClaim(t *testing.T) {
	owners := []int64{1, 1, 2, 0, 3}
	live := []int64{1, 2}
	require.False(t, mustRelease(1, []int{0, 1}, owners))
	require.True(t, mustRelease(1, []int{0}, owners)) // range 1 is no longer its
	require.Empty(t, claimableRanges(1, []int{0, 1}, owners, live, true))
	require.Equal(t, []int{3}, claimableRanges(1, []int{0, 1, 3}, owners, live, true)) // 3 is free
	require.Empty(t, claimableRanges(1, []int{0, 1, 2}, owners, live, true))           // 2's owner is live: it hands over
	require.Equal(t, []int{4}, claimableRanges(1, []int{1, 2, 4}, owners, live, true)) // 4's owner is gone
	require.Empty(t, claimableRanges(1, []int{1, 2, 4}, owners, live, false))          // not before it settled
	require.Equal(t, []int{3}, claimableRanges(1, []int{3, 4}, owners, live, false))   // free ones at once
}

func TestParseIntArray(t *testing.T) {
	got, err := parseIntArray("{3,1,20}")
	require.NoError(t, err)
	require.Equal(t, []int64{3, 1, 20}, got)
	got, err = parseIntArray("{}")
	require.NoError(t, err)
	require.Empty(t, got)
	_, err = parseIntArray("{1,x}")
	require.Error(t, err)
}

// A member's save writes its checkpoint to the ranges it owns whose floor the checkpoint
// covers, drops those floors, and stops the watcher, fenced off, when a range is no longer its.
func TestSharedSaveSkipsFloorsAndIsFenced(t *testing.T) {
	w, mock := newMockWatcher(t, Config{Shared: true})
	w.sh.id.Store(7)
	ahead := Position{ID: 9, Span: &position.Span{Seq: 1, Base: mustSnapshot(t, "98:108:98,105"), End: mustSnapshot(t, "120:130:"), HasEnd: true}, InRows: true}
	w.sh.view.Store(newSharedView([]int{2, 3, 4}, map[int]Position{3: ahead}))
	p := Position{ID: 10, Span: &position.Span{Seq: 2, Base: mustSnapshot(t, "110:125:")}}
	mock.ExpectExec(w.sh.q.save).WithArgs("c", int64(7), "tok", "{2,4}").WillReturnResult(sqlmock.NewResult(0, 2))
	require.NoError(t, w.writeShared(context.Background(), p, "tok", ""))
	require.Len(t, w.sh.view.Load().floors, 1, "a floor dropped before the checkpoint covered it")

	passed := Position{ID: 11, Span: &position.Span{Seq: 3, Base: mustSnapshot(t, "130:131:130")}}
	mock.ExpectExec(w.sh.q.save).WithArgs("c", int64(7), "tok2", "{2,3,4}").WillReturnResult(sqlmock.NewResult(0, 3))
	require.NoError(t, w.writeShared(context.Background(), passed, "tok2", ""))
	require.Empty(t, w.sh.view.Load().floors)

	mock.ExpectExec(w.sh.q.save).WithArgs("c", int64(7), "tok3", "{2,3,4}").WillReturnResult(sqlmock.NewResult(0, 2))
	err := w.writeShared(context.Background(), passed, "tok3", "")
	require.True(t, errors.Is(err, ErrFenced), "got %v", err)
	require.ErrorIs(t, w.excl.lostErr(), ErrFenced)
	require.NoError(t, mock.ExpectationsWereMet())
}

func TestSharedConfigIsChecked(t *testing.T) {
	for _, cfg := range []Config{
		{Shared: true, Exclusive: true},
		{Shared: true, Ephemeral: true},
		{Shared: true, ProcessedFlag: true},
		{Shared: true, SharedLease: 10},
		{Shared: true, MemberName: "a\x00b"},
	} {
		db, _ := mockDB(t)
		cfg.DB = db
		_, err := New(testConfig(cfg))
		require.ErrorIs(t, err, ErrInvalidConfig, "%+v", cfg)
	}
}

// A Shared member reads a sparse page of listed ids as one range of its units when they are
// dense enough, and keeps only the ids of the page.
func TestSharedRowsByIDQuery(t *testing.T) {
	w, _ := newMockWatcher(t, Config{Shared: true})
	w.rq = sharedReadQueries(w.cfg, []int{0, 1})
	q, args := w.rowsByIDQuery([]int64{5, 6, 7})
	require.Equal(t, w.rq.DeltaKeyRange, q)
	require.Equal(t, []any{int64(5), int64(7)}, args)
	q, args = w.rowsByIDQuery([]int64{5, 40, 90})
	require.Equal(t, w.rq.DeltaSpan, q)
	require.Equal(t, []any{int64(5), int64(90)}, args)
	require.Contains(t, q, "BETWEEN 0 AND 31")
	q, _ = w.rowsByIDQuery([]int64{5, 4000})
	require.Equal(t, w.rq.DeltaRows, q)

	rows := []changelogRow{{ID: 5}, {ID: 6}, {ID: 40}, {ID: 41}, {ID: 90}}
	kept := keepIDs(rows, []int64{5, 40, 90})
	require.Equal(t, []int64{5, 40, 90}, []int64{kept[0].ID, kept[1].ID, kept[2].ID})
	require.Len(t, kept, 3)

	unshared, _ := newMockWatcher(t, Config{})
	q, _ = unshared.rowsByIDQuery([]int64{5, 40, 90})
	require.Equal(t, unshared.rq.DeltaRows, q)
}

// A handler's context is done as soon as it is asked after the lease may have run out, without
// any goroutine cancelling it; it also ends with its parent and when the member stops owning.
func TestLeaseContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSharedMember(testConfig(Config{Shared: true, SharedLease: time.Second}).WithDefaults())
		s.renewed(time.Now())
		c, release := s.handlerContext(context.Background())
		defer release()
		require.NoError(t, c.Err())
		time.Sleep(700 * time.Millisecond)
		require.NoError(t, c.Err(), "done before four fifths of the lease")
		time.Sleep(200 * time.Millisecond)
		select {
		case <-c.Done():
		default:
			t.Fatal("not done after four fifths of the lease")
		}
		require.ErrorIs(t, c.Err(), context.DeadlineExceeded)

		s.renewed(time.Now())
		parent, cancel := context.WithCancel(context.Background())
		c2, release2 := s.handlerContext(parent)
		defer release2()
		cancel()
		synctest.Wait()
		require.ErrorIs(t, c2.Err(), context.Canceled)

		c3, release3 := s.handlerContext(context.Background())
		defer release3()
		s.markLost()
		synctest.Wait()
		require.ErrorIs(t, c3.Err(), context.DeadlineExceeded)
	})
}

// A member that joins reads the ranges it claimed against a snapshot taken after the claim:
// another member may have saved them at a snapshot newer than the one its load began with,
// which is no sign of a restored database.
func TestSharedLoadChecksClaimedRangesAgainstASnapshotAfterTheClaim(t *testing.T) {
	w, mock := newMockWatcher(t, Config{Shared: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		w.wg.Wait() // the coordinator the join started
	}()
	mock.ExpectQuery(w.sh.q.detect).WillReturnRows(sqlmock.NewRows([]string{"ok"}).AddRow(true))
	mock.ExpectQuery(w.sh.q.join).WillReturnRows(sqlmock.NewRows([]string{"member"}).AddRow(int64(3)))
	mock.ExpectQuery(w.q.LoadToken).WillReturnRows(sqlmock.NewRows([]string{"resume_token"}))
	mock.ExpectQuery(w.q.Newest).WillReturnRows(sqlmock.NewRows([]string{"changed_at", "id"}))
	mock.ExpectExec(w.sh.q.initRanges).WillReturnResult(sqlmock.NewResult(0, 0))
	mock.ExpectExec(w.sh.q.renew).WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectExec(w.sh.q.expire).WillReturnResult(sqlmock.NewResult(0, 0))
	owners := "{" + strings.Repeat("0,", SharedRanges-1) + "0}"
	mock.ExpectQuery(w.sh.q.state).WillReturnRows(sqlmock.NewRows([]string{"m", "o", "s"}).AddRow("{3}", owners, false))
	mock.ExpectQuery(w.sh.q.claim).WillReturnRows(sqlmock.NewRows([]string{"range_no"}).AddRow(0))
	mock.ExpectQuery(w.q.Snapshot).WillReturnRows(sqlmock.NewRows([]string{"s"}).AddRow("200:200:"))
	saved := string(position.EncodeToken(Position{ID: 9, Span: &position.Span{Seq: 1, Base: mustSnapshot(t, "150:150:")}}, "t"))
	mock.ExpectQuery(w.sh.q.load).WillReturnRows(sqlmock.NewRows([]string{"range_no", "resume_token"}).AddRow(0, saved))
	w.ckMu.Lock()
	x, err := w.loadShared(ctx, false, true, mustSnapshot(t, "100:100:"), "")
	w.ckMu.Unlock()
	require.NoError(t, err)
	require.Equal(t, "150:150:", x.Span.Base.String())
	require.NoError(t, mock.ExpectationsWereMet())
}
