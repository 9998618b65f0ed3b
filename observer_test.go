package pgchangestream_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/pgchangestreamtest"
)

// recordingObserver records what a watcher observes. On each successful save it also calls the
// watcher's Stats and Flush, which take the delivery and checkpoint locks: a save observed with
// one of them held would block there.
type recordingObserver struct {
	w *pgchangestream.Watcher

	mu      sync.Mutex
	reads   []pgchangestream.ReadObservation
	saves   []pgchangestream.SaveObservation
	blocked bool
}

func (o *recordingObserver) ObserveRead(_ context.Context, r pgchangestream.ReadObservation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.reads = append(o.reads, r)
}

func (o *recordingObserver) ObserveSave(ctx context.Context, s pgchangestream.SaveObservation) {
	if s.Err == nil {
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = o.w.Stats()
			_ = o.w.Flush(ctx) // nothing new to save: no write, no observation
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			o.mu.Lock()
			o.blocked = true
			o.mu.Unlock()
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.saves = append(o.saves, s)
}

func (o *recordingObserver) observed() ([]pgchangestream.ReadObservation, []pgchangestream.SaveObservation, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]pgchangestream.ReadObservation(nil), o.reads...),
		append([]pgchangestream.SaveObservation(nil), o.saves...), o.blocked
}

func TestObserverSeesReadsAndSavesWithoutLocksHeld(t *testing.T) {
	ctx := context.Background()
	obs := &recordingObserver{}
	m := pgchangestreamtest.NewMock(t, pgchangestream.Config{ClientName: "billing", TableName: "orders",
		Mode: pgchangestream.ModePolling, PollInterval: time.Hour, Observer: obs})
	m.ExpectStart(pgchangestreamtest.Start{Newest: pgchangestream.Position{ID: 41}})
	m.ExpectRead(pgchangestreamtest.Insert("o1", map[string]any{"n": 1}), pgchangestreamtest.Insert("o2", map[string]any{"n": 2}))
	m.ExpectSave(42)
	errDown := errors.New("connection reset")
	m.ExpectSaveFailure(43, errDown)
	w, err := pgchangestream.New(m.Config())
	require.NoError(t, err)
	obs.w = w
	before := time.Now()
	m.StartWatcher(ctx, w)

	first, second := <-w.Events(), <-w.Events()
	require.NoError(t, w.MarkProcessed(ctx, first.ResumeToken))
	require.ErrorIs(t, w.MarkProcessed(ctx, second.ResumeToken), errDown)
	require.NoError(t, m.ExpectationsWereMet())

	reads, saves, blocked := obs.observed()
	require.False(t, blocked, "a save was observed with a lock of the watcher held")
	require.NotEmpty(t, reads)
	require.Equal(t, int64(41), reads[0].From.ID)
	require.Equal(t, 2, reads[0].Rows)
	require.NoError(t, reads[0].Err)
	require.False(t, reads[0].Start.Before(before))
	require.Len(t, saves, 2, "one observation per write, none for the Flush that had nothing to write")
	require.Equal(t, int64(42), saves[0].Checkpoint.ID)
	require.NoError(t, saves[0].Err)
	require.Equal(t, int64(43), saves[1].Checkpoint.ID)
	require.ErrorIs(t, saves[1].Err, errDown)
	require.False(t, saves[1].Start.Before(saves[0].Start.Add(saves[0].Duration)))
}
