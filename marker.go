package pgchangestream

import (
	"context"
	"log/slog"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/marker"
)

// The legacy processed flag (rule 12) is set by a marker (internal/marker), not by the saves. A
// save writes the token alone and wakes the marker, which sets the flag of the rows certified
// since the rows it last marked, in one pass however many saves came in between, never past the
// saved token; after each load (and rewind) its first pass catches up on the rows the loaded
// token certifies. The watcher holds the marker (nil unless it sets the flag) and hands it the
// saved position, its health and its logs.

// newMarker returns the processed-flag marker of w.
func (w *Watcher) newMarker() *marker.Marker {
	failed := newRepeatLog(w.log, slog.LevelWarn, "cannot set the processed flag; retrying")
	return marker.New(marker.Config{
		DB:             w.cfg.DB,
		ChangelogTable: w.cfg.ChangelogTable,
		TableName:      w.cfg.TableName,
		Logger:         w.log,
		Saved:          w.markTarget,
		Report: marker.Report{
			Passed: func() { w.health.ok(opMark) },
			Panicked: func(r any) error {
				err := w.panicError("processed-flag marker", r)
				w.health.fail(opMark, err)
				return err
			},
			Retrying: func(err error, wait time.Duration) { failed.fail("error", err, "retry_in", wait) },
			Resumed:  failed.ok,
		},
	})
}

// markTarget is what the marker marks up to: the saved position, with the in-place
// switch-over's span, read under mu.
func (w *Watcher) markTarget() marker.Saved {
	w.mu.Lock()
	defer w.mu.Unlock()
	return marker.Saved{Position: w.savedMirror, Loaded: w.loaded, Switched: w.switched}
}

// afterSave has the rows certified by a save marked (see marker.Marker.AfterSave).
func (w *Watcher) afterSave(ctx context.Context) {
	if w.mark != nil {
		w.mark.AfterSave(ctx)
	}
}

// markPass runs a marking pass now, if the watcher sets the processed flag.
func (w *Watcher) markPass(ctx context.Context) error {
	if w.mark == nil {
		return nil
	}
	return w.mark.Pass(ctx)
}

// setMarked records p, the loaded token, as where marking goes on from (see
// marker.Marker.SetMarked). mu must not be held.
func (w *Watcher) setMarked(p Position) {
	if w.mark != nil {
		w.mark.SetMarked(p)
	}
}
