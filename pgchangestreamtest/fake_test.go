package pgchangestreamtest

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream"
)

// receive takes n deliveries and returns their tokens.
func receive(t *testing.T, f *FakeWatcher, n int) []string {
	t.Helper()
	var out []string
	for range n {
		ev, ok := <-f.Events()
		require.True(t, ok, "Events closed after %d of %d deliveries", len(out), n)
		out = append(out, string(ev.ResumeToken))
	}
	return out
}

// savedID returns the id of the saved checkpoint.
func savedID(t *testing.T, f *FakeWatcher) int64 {
	t.Helper()
	p, ok := f.Saved()
	require.True(t, ok)
	return p.ID
}

func started(t *testing.T, cfg pgchangestream.Config, changes ...Change) *FakeWatcher {
	t.Helper()
	f := NewFakeWatcher(cfg)
	f.Push(changes...)
	f.Start(t.Context())
	t.Cleanup(func() { require.NoError(t, f.Close(context.Background())) })
	return f
}

func TestFakeAcksAreCumulativeInDeliveryOrder(t *testing.T) {
	ctx := t.Context()
	f := started(t, pgchangestream.Config{}, Insert("a", nil), Insert("b", nil), Insert("c", nil), Insert("d", nil))
	require.Equal(t, []string{"1", "2", "3", "4"}, receive(t, f, 4))
	require.NoError(t, f.MarkProcessed(ctx, []byte("2")))
	require.Equal(t, []string{"1", "2"}, f.Acked(), "acking the second delivery certifies the first")
	require.Equal(t, int64(2), savedID(t, f), "the checkpoint stops before delivery 3")
	require.Equal(t, 2, f.Stats().Pending)
	require.Equal(t, int64(4), f.Stats().Cursor.ID, "acks never move the cursor")

	require.NoError(t, f.MarkProcessed(ctx, []byte("4")))
	require.Equal(t, []string{"1", "2", "3", "4"}, f.Acked())
	require.Equal(t, int64(4), savedID(t, f), "with nothing pending the checkpoint is the cursor")
	require.Equal(t, uint64(2), f.Stats().CheckpointWrites)
}

func TestFakeTokensThatCertifyNothing(t *testing.T) {
	ctx := t.Context()
	f := started(t, pgchangestream.Config{}, Insert("a", nil), Insert("b", nil))
	receive(t, f, 2)
	require.NoError(t, f.MarkProcessed(ctx, nil))
	require.NoError(t, f.MarkProcessed(ctx, []byte("99")))
	require.Empty(t, f.Acked())
	require.Equal(t, int64(0), savedID(t, f), "the checkpoint stays before the first delivery")

	err := f.MarkProcessed(ctx, []byte("not-a-number"))
	require.ErrorIs(t, err, pgchangestream.ErrInvalidToken)
	require.Equal(t, []string{"", "99", "not-a-number"}, f.Marks())
	require.Equal(t, 2, f.Stats().Pending)
}

func TestFakeFailedSavesKeepTheAck(t *testing.T) {
	ctx := t.Context()
	f := started(t, pgchangestream.Config{}, Insert("a", nil), Insert("b", nil))
	receive(t, f, 2)
	down := errors.New("database down")
	f.FailSaves(down)
	require.ErrorIs(t, f.MarkProcessed(ctx, []byte("2")), down)
	require.Equal(t, int64(0), savedID(t, f))
	require.Equal(t, uint64(1), f.Stats().CheckpointErrors)
	f.FailSaves(nil)
	require.NoError(t, f.MarkProcessed(ctx, nil), "an empty token retries the save")
	require.Equal(t, int64(2), savedID(t, f))
}

func TestFakeAbandonedSendStaysPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := NewFakeWatcher(pgchangestream.Config{BufferSize: 1})
		f.Push(Insert("a", nil), Insert("b", nil), Insert("c", nil))
		f.Start(t.Context())
		synctest.Wait() // 1 is buffered, the send of 2 blocks
		require.NoError(t, f.Close(t.Context()))
		require.Equal(t, []string{"1"}, receive(t, f, 1))
		_, open := <-f.Events()
		require.False(t, open)
		require.Equal(t, 2, f.Stats().Pending, "the abandoned send of 2 stays pending")
		require.Equal(t, int64(0), savedID(t, f))

		require.NoError(t, f.MarkProcessed(t.Context(), []byte("1")), "MarkProcessed works after Close")
		require.Equal(t, int64(1), savedID(t, f), "the checkpoint never passes the abandoned delivery")
		require.NoError(t, f.Close(t.Context()), "Close is idempotent")
	})
}

func TestFakeFloorHoldsEvictedDeliveries(t *testing.T) {
	ctx := t.Context()
	f := started(t, pgchangestream.Config{MaxPending: 2}, Insert("a", nil), Insert("b", nil), Insert("c", nil), Insert("d", nil))
	receive(t, f, 4)
	st := f.Stats()
	require.Equal(t, uint64(2), st.Evicted)
	require.True(t, st.FloorActive)
	require.NoError(t, f.MarkProcessed(ctx, []byte("1")), "an evicted delivery cannot be acknowledged")
	require.Equal(t, int64(0), savedID(t, f), "the floor holds the checkpoint before delivery 1")
	require.NoError(t, f.MarkProcessed(ctx, []byte("3")))
	require.Equal(t, []string{"1", "2", "3"}, f.Acked(), "an ack of a tracked delivery covers the evicted ones")
	require.Equal(t, int64(3), savedID(t, f))
}

func TestFakeCloseWhenDelivered(t *testing.T) {
	ctx := t.Context()
	f := NewFakeWatcher(pgchangestream.Config{})
	f.Push(Insert("a", nil), Insert("b", nil))
	f.Start(ctx)
	f.CloseWhenDelivered()
	for ev := range f.Events() {
		require.NoError(t, f.MarkProcessed(ctx, ev.ResumeToken))
	}
	require.Equal(t, []string{"1", "2"}, f.Acked())
	require.Equal(t, int64(2), savedID(t, f))
	require.NoError(t, f.Close(ctx))
	f.Push(Insert("c", nil))
	n, err := f.GetUnprocessedEventCount(ctx, "")
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "a change pushed after Close is in the changelog, never delivered")
}

func TestFakeContextEndStopsWithoutSaving(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := NewFakeWatcher(pgchangestream.Config{})
		ctx, cancel := context.WithCancel(t.Context())
		f.Start(ctx)
		f.Push(Insert("a", nil))
		require.Equal(t, []string{"1"}, receive(t, f, 1))
		cancel()
		_, open := <-f.Events()
		require.False(t, open)
		require.Equal(t, uint64(0), f.Stats().CheckpointWrites)
		require.NoError(t, f.Close(t.Context()))
		require.NoError(t, f.Close(t.Context()))
	})
}

func TestFakeCloseBeforeStart(t *testing.T) {
	f := NewFakeWatcher(pgchangestream.Config{})
	require.NoError(t, f.Close(t.Context()))
	require.NoError(t, f.Close(t.Context()))
	_, open := <-f.Events()
	require.False(t, open)
	f.Start(t.Context())
	_, ok := f.Saved()
	require.False(t, ok, "Start after Close does nothing")
}

func TestFakeFilteredChangesAdvanceTheCheckpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		f := started(t, pgchangestream.Config{Filter: func(ev pgchangestream.Event) bool { return ev["operationType"] != "delete" }},
			Insert("a", nil), Delete("a", nil), Delete("b", nil))
		require.Equal(t, []string{"1"}, receive(t, f, 1))
		synctest.Wait()
		require.Equal(t, uint64(2), f.Stats().Filtered)
		require.NoError(t, f.MarkProcessed(ctx, []byte("1")))
		require.Equal(t, int64(3), savedID(t, f), "the filtered changes are saved past")
	})
}

func TestFakeUnprocessedCount(t *testing.T) {
	ctx := t.Context()
	f := started(t, pgchangestream.Config{ProcessedFlag: true}, Insert("a", nil), Insert("b", nil), Insert("c", nil))
	receive(t, f, 3)
	require.NoError(t, f.MarkProcessed(ctx, []byte("1")))
	n, err := f.GetUnprocessedEventCount(ctx, "0")
	require.NoError(t, err)
	require.Equal(t, int64(2), n, "the processed flag is set on the saved change")
	n, err = f.GetUnprocessedEventCount(ctx, "")
	require.NoError(t, err)
	require.Zero(t, n, "none after the cursor")
	_, err = f.GetUnprocessedEventCount(ctx, "x")
	require.ErrorIs(t, err, pgchangestream.ErrInvalidToken)

	f = started(t, pgchangestream.Config{}, Insert("a", nil), Insert("b", nil), Insert("c", nil))
	receive(t, f, 3)
	require.NoError(t, f.MarkProcessed(ctx, []byte("1")))
	n, err = f.GetUnprocessedEventCount(ctx, "0")
	require.NoError(t, err)
	require.Equal(t, int64(3), n, "without the processed flag every change after the id counts")
}

func TestFakeEventsAreTheWatchersDocuments(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	up := Update("o1", map[string]any{"status": "new", "total": 5}, map[string]any{"status": "paid", "total": 5})
	up.ID, up.ChangedAt = 40, at
	f := started(t, pgchangestream.Config{TableName: "orders"}, up, Delete("o1", map[string]any{"status": "paid"}))
	ev := <-f.Events()
	require.Equal(t, pgchangestream.Event{
		"_id":               map[string]any{"_data": "40"},
		"operationType":     "update",
		"clusterTime":       at,
		"fullDocument":      map[string]any{"status": "paid", "total": float64(5)},
		"updateDescription": map[string]any{"updatedFields": map[string]any{"status": "paid"}},
		"documentKey":       map[string]any{"_id": "o1"},
		"ns":                map[string]any{"coll": "orders"},
	}, ev.Event)
	ev = <-f.Events()
	require.Equal(t, "41", string(ev.ResumeToken), "ids continue after the highest one given")
	require.Equal(t, "delete", ev.Event["operationType"])
	require.Equal(t, map[string]any{"status": "paid"}, ev.Event["fullDocumentBeforeChange"])
	require.Equal(t, DefaultChangedAt, ev.Event["clusterTime"])
}
