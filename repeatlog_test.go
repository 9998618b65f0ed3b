package pgchangestream

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// recordHandler keeps the records logged through it.
type recordHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r)
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }

// lines returns each record as its message and attributes, and forgets them.
func (h *recordHandler) lines() []map[string]any {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]any
	for _, r := range h.records {
		m := map[string]any{"msg": r.Message, "level": r.Level}
		r.Attrs(func(a slog.Attr) bool {
			m[a.Key] = a.Value.Any()
			return true
		})
		out = append(out, m)
	}
	h.records = nil
	return out
}

// One failure per 20 ms for 65 s writes the first failure, a summary every 30 s, and a line
// when the operation recovers; a later failure is logged at once again.
func TestRepeatLogSummarisesRepeatedFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &recordHandler{}
		r := newRepeatLog(slog.New(h), slog.LevelError, "background checkpoint save failed")
		errDown := errors.New("connection refused")
		for range 65 * 50 { // 65 s of failures, 50 a second
			r.fail("error", errDown)
			time.Sleep(20 * time.Millisecond)
		}
		r.ok()
		r.ok() // nothing more to say
		lines := h.lines()
		require.Len(t, lines, 4)
		require.Equal(t, map[string]any{"msg": "background checkpoint save failed", "level": slog.LevelError, "error": errDown}, lines[0])
		for _, summary := range lines[1:3] {
			require.Equal(t, "background checkpoint save failed", summary["msg"])
			require.Equal(t, errDown, summary["error"])
			require.Equal(t, int64(30*50), summary["repeated"], "every failure of the 30 s is counted")
			require.Equal(t, 30*time.Second, summary["in_last"])
		}
		require.Equal(t, map[string]any{"msg": "background checkpoint save failed: recovered", "level": slog.LevelInfo,
			"failures": int64(65 * 50), "failing_for": 65 * time.Second}, lines[3])

		r.fail("error", errDown)
		require.Len(t, h.lines(), 1, "a new failure after a recovery is logged at once")
	})
}

// Concurrent failures and successes are safe, and a success with no failure logs nothing.
func TestRepeatLogConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &recordHandler{}
		r := newRepeatLog(slog.New(h), slog.LevelWarn, "dead-letter table call failed")
		r.ok()
		require.Empty(t, h.lines())
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 100 {
					r.fail("error", errors.New("down"))
				}
			})
		}
		wg.Wait()
		require.Len(t, h.lines(), 1, "800 failures within the interval: one line")
	})
}
