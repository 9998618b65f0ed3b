package pgchangestreamtest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/internal/procface"
)

// parkedTable is the fake's dead-letter table, in memory, with the semantics of the watcher's
// "<changelog>_parked" rows of one client.
type parkedTable struct {
	mu     sync.Mutex // guards rows and lastID; nothing slow happens while it is held
	rows   []pgchangestream.ParkedEvent
	lastID int64
}

var _ procface.ParkedStore = (*parkedTable)(nil)

func (t *parkedTable) Park(_ context.Context, p pgchangestream.ParkedEvent) (int64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lastID++
	p.ID, p.ParkedAt = t.lastID, time.Now()
	t.rows = append(t.rows, p)
	return p.ID, nil
}

func (t *parkedTable) BlockedKeys(context.Context) ([]string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var keys []string
	for _, p := range t.rows {
		if p.Blocking && !slices.Contains(keys, p.Key) {
			keys = append(keys, p.Key)
		}
	}
	slices.Sort(keys)
	return keys, nil
}

func (t *parkedTable) Released(_ context.Context, limit int) ([]pgchangestream.ParkedEvent, error) {
	return t.where(func(p pgchangestream.ParkedEvent) bool { return p.RetryRequested }, limit), nil
}

func (t *parkedTable) KeyEvents(_ context.Context, key string) ([]pgchangestream.ParkedEvent, error) {
	return t.where(func(p pgchangestream.ParkedEvent) bool { return p.Key == key }, -1), nil
}

func (t *parkedTable) Repark(_ context.Context, id int64, attempts int, errText string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i := t.indexLocked(id); i >= 0 {
		p := &t.rows[i]
		p.Attempts, p.Error, p.RetryRequested, p.ParkedAt = attempts, errText, false, time.Now()
	}
	return nil
}

func (t *parkedTable) Finish(_ context.Context, id int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i := t.indexLocked(id); i >= 0 {
		t.rows = slices.Delete(t.rows, i, i+1)
	}
	return nil
}

// where returns the rows keep selects, oldest first, at most limit (all when limit < 0).
func (t *parkedTable) where(keep func(pgchangestream.ParkedEvent) bool, limit int) []pgchangestream.ParkedEvent {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []pgchangestream.ParkedEvent
	for _, p := range t.rows {
		if limit >= 0 && len(out) == limit {
			break
		}
		if keep(p) {
			out = append(out, p)
		}
	}
	return out
}

// indexLocked returns the index of row id, or -1. mu must be held.
func (t *parkedTable) indexLocked(id int64) int {
	return slices.IndexFunc(t.rows, func(p pgchangestream.ParkedEvent) bool { return p.ID == id })
}

// Parked returns the events [FakeWatcher.Process] parked and has not removed, oldest first, as
// admin.ListParked returns the client's rows of the dead-letter table.
func (f *FakeWatcher) Parked() []pgchangestream.ParkedEvent {
	return f.parked.where(func(pgchangestream.ParkedEvent) bool { return true }, -1)
}

// RetryParked asks the running Process to run parked event id again at its next look
// (ParkedPollInterval), as admin.RetryParked does: on success it leaves Parked, on
// failure it is parked again with its new error; for an event parked under BlockOnFailure it
// releases the key, whose parked events then run in the order they were parked. It returns an
// error wrapping [pgchangestream.ErrNotParked] for an id not parked.
func (f *FakeWatcher) RetryParked(id int64) error {
	return f.parked.operate(id, func(t *parkedTable, i int) { t.rows[i].RetryRequested = true })
}

// DropParked deletes parked event id without running it, as admin.DropParked does:
// a key held under BlockOnFailure stays held while it has other parked events. It returns an
// error wrapping [pgchangestream.ErrNotParked] for an id not parked.
func (f *FakeWatcher) DropParked(id int64) error {
	return f.parked.operate(id, func(t *parkedTable, i int) { t.rows = slices.Delete(t.rows, i, i+1) })
}

// operate applies change to row id under the lock, or says that id is not parked.
func (t *parkedTable) operate(id int64, change func(t *parkedTable, i int)) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := t.indexLocked(id)
	if i < 0 {
		return fmt.Errorf("%w: the fake has no parked event %d", pgchangestream.ErrNotParked, id)
	}
	change(t, i)
	return nil
}
