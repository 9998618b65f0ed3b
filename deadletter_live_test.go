package pgchangestream

import (
	"context"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/admin"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/deadletter"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// parkedDoc is a delivered document as Process parks it.
func parkedDoc(id int64) Event {
	return Event{"_id": map[string]any{"_data": string(position.FormatToken(id))}, "operationType": "insert",
		"fullDocument": map[string]any{"id": float64(id), "name": "n\u00e9"}, "ns": map[string]any{"coll": liveTable}}
}

func TestLiveParkedStoreKeepsEventsPerClientInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLive(t)
	a := deadletter.New(e.db, DefaultChangelogTable, "a")
	b := deadletter.New(e.db, DefaultChangelogTable, "b")
	park := func(s *deadletter.Store, key string, id int64, blocking bool) int64 {
		t.Helper()
		pid, err := s.Park(ctx, ParkedEvent{Key: key, Table: liveTable, ChangelogID: id, Event: parkedDoc(id),
			Error: "boom", Attempts: 5, Blocking: blocking})
		require.NoError(t, err)
		return pid
	}
	k1 := park(a, "k1", 11, true)
	park(a, "k2", 12, false)
	k1b := park(a, "k1", 13, true)
	park(b, "k1", 14, false)

	evs, err := a.KeyEvents(ctx, "k1")
	require.NoError(t, err)
	require.Len(t, evs, 2)
	require.Equal(t, []int64{k1, k1b}, []int64{evs[0].ID, evs[1].ID}, "a key's events in the order parked")
	got := evs[0]
	require.Equal(t, ParkedEvent{ID: k1, Client: "a", Key: "k1", Table: liveTable, ChangelogID: 11, Event: parkedDoc(11),
		Error: "boom", Attempts: 5, Blocking: true, ParkedAt: got.ParkedAt}, got)
	require.WithinDuration(t, time.Now(), got.ParkedAt, time.Minute)

	keys, err := a.BlockedKeys(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"k1"}, keys, "only blocking events hold a key")
	keys, err = b.BlockedKeys(ctx)
	require.NoError(t, err)
	require.Empty(t, keys, "another client's blocks are its own")

	rel, err := a.Released(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, rel, "nothing is released before an operator asks")
	require.NoError(t, admin.RetryParked(ctx, e.db, "a", k1b, admin.Options{}))
	require.NoError(t, admin.RetryParked(ctx, e.db, "a", k1, admin.Options{}))
	rel, err = a.Released(ctx, 1)
	require.NoError(t, err)
	require.Len(t, rel, 1, "at most limit")
	require.Equal(t, k1, rel[0].ID, "oldest first")
	require.True(t, rel[0].RetryRequested)

	require.NoError(t, a.Repark(ctx, k1, 10, "boom again"))
	evs, err = a.KeyEvents(ctx, "k1")
	require.NoError(t, err)
	require.Equal(t, []any{10, "boom again", false}, []any{evs[0].Attempts, evs[0].Error, evs[0].RetryRequested})

	require.NoError(t, a.Finish(ctx, k1))
	require.NoError(t, admin.DropParked(ctx, e.db, "a", k1b, admin.Options{}))
	keys, err = a.BlockedKeys(ctx)
	require.NoError(t, err)
	require.Empty(t, keys, "a key is free once its blocking events are gone")

	all, err := admin.ListParked(ctx, e.db, "", admin.Options{})
	require.NoError(t, err)
	require.Equal(t, []string{"a/k2", "b/k1"}, []string{all[0].Client + "/" + all[0].Key, all[1].Client + "/" + all[1].Key})
	mine, err := admin.ListParked(ctx, e.db, "b", admin.Options{})
	require.NoError(t, err)
	require.Len(t, mine, 1)
}

func TestLiveParkedAdminRefusesWhatIsNotParked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLive(t)
	pid, err := deadletter.New(e.db, DefaultChangelogTable, "a").Park(ctx,
		ParkedEvent{Key: "k", Table: liveTable, ChangelogID: 1, Event: parkedDoc(1), Error: "x", Attempts: 1})
	require.NoError(t, err)
	require.ErrorIs(t, admin.RetryParked(ctx, e.db, "b", pid, admin.Options{}), ErrNotParked, "another client's event")
	require.ErrorIs(t, admin.DropParked(ctx, e.db, "a", pid+1, admin.Options{}), ErrNotParked)
	require.ErrorIs(t, admin.DropParked(ctx, e.db, "a", pid, admin.Options{ChangelogTable: "bad name"}), ErrInvalidConfig)
	all, err := admin.ListParked(ctx, e.db, "a", admin.Options{})
	require.NoError(t, err)
	require.Len(t, all, 1, "nothing was dropped by the refused calls")

	_, err = e.db.ExecContext(ctx, `DROP TABLE `+changelog.Quote(changelog.ParkedTable(DefaultChangelogTable)))
	require.NoError(t, err)
	_, err = admin.ListParked(ctx, e.db, "a", admin.Options{})
	require.ErrorContains(t, err, "run schema.Install")
}
