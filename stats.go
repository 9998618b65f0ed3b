package pgchangestream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/internal/procface"
)

// Stats are counters of a [Watcher], for metrics and tests.
type Stats struct {
	Delivered, Filtered, Acked, Evicted uint64
	// Pending is the number of deliveries tracked until acknowledged.
	Pending int
	// FloorActive is true while evicted deliveries hold the checkpoint back.
	FloorActive                        bool
	CheckpointWrites, CheckpointErrors uint64
	// Checkpoint is the position last saved (or loaded).
	Checkpoint Position
	// Cursor is the newest position read.
	Cursor Position
	// LoadErrors and ReadErrors count failed loads of the start position and failed changelog
	// reads; LastError is the last failure of any operation, at LastErrorAt.
	LoadErrors, ReadErrors uint64
	LastError              error
	LastErrorAt            time.Time
	// ListenUp is true while the LISTEN connection is connected.
	ListenUp bool
	// Lag is the age of the oldest row not yet acknowledged or not yet read, from its
	// changed_at; 0 when caught up (see [Watcher.LagState]).
	Lag time.Duration
	// Active is false while an exclusive watcher waits as a standby (see [Config.Exclusive]).
	Active bool
	// Rewinds counts the times the watcher went back to its saved token because the server
	// recovered from a crash, failed over or was restored (see [ErrServerRecovered]).
	Rewinds uint64
	// Process are the counters of [Watcher.Process] on this watcher.
	Process ProcessStats
	// Shared describes the membership of a [Config.Shared] watcher; zero otherwise.
	Shared SharedStats
}

// SharedStats describe a [Config.Shared] member.
type SharedStats struct {
	Member int64  // the member's id (from the _member_seq sequence), 0 before it joined
	Name   string // Config.MemberName, or host:pid
	// Ranges are the ranges (0 to SharedRanges-1) the member owns and reads, ascending.
	Ranges []int
	// Floors counts the owned ranges saved ahead of the member's reads (taken over from
	// another member): their rows up to their own position are skipped, and their saved
	// position stays until the member's checkpoint passes it.
	Floors int
	// LeaseValid is false while the member may not deliver: its lease was not renewed in time.
	LeaseValid bool
	// HandOvers counts the hand-overs the member made (ranges released or claimed).
	HandOvers uint64
}

// ProcessStats are the counters of [Watcher.Process]: gauges of the run in progress (0 when
// none runs) and totals over every run of the watcher.
type ProcessStats struct {
	InFlight    int    // events taken from Events and not finished
	Deferred    int    // of InFlight, those kept as a token only (see ProcessOptions.MaxKeyQueue)
	BusyWorkers int    // handlers (or dead-letter calls) running
	Handled     uint64 // handler runs that succeeded, reruns of parked events included
	// AlreadyDone counts the events [Watcher.ProcessTx] finished without calling the handler:
	// their claim found them committed before (or the parked event to rerun was dropped).
	AlreadyDone uint64
	Retries     uint64        // failed attempts that were retried
	Parked      uint64        // events this watcher parked in the dead-letter table
	HandlerTime time.Duration // the sum of the handlers' durations
	// LongestKeyQueue is the longest queue of events of one key seen, and LongestKey its key:
	// a hot key holding up its events shows here.
	LongestKeyQueue int
	LongestKey      string
}

// Stats returns the watcher's counters.
func (w *Watcher) Stats() Stats {
	caughtUp := w.health.isCaughtUp()
	proc := w.processStats()
	w.mu.Lock()
	defer w.mu.Unlock()
	s := Stats{
		Delivered:        w.delivered.Load(),
		Filtered:         w.filtered,
		Acked:            w.acked,
		Evicted:          w.evicted,
		Pending:          w.ring.Len(),
		FloorActive:      w.ring.HasFloor(),
		CheckpointWrites: w.ckWrites.Load(),
		CheckpointErrors: w.ckErrors.Load(),
		Checkpoint:       w.savedMirror,
		Cursor:           w.cursor,
		Lag:              w.lagLocked(time.Now(), caughtUp),
		Active:           w.excl.isActive(),
		Rewinds:          w.rewinds.Load(),
		Process:          proc,
	}
	w.health.fill(&s)
	if w.sh != nil {
		v := w.sh.view.Load()
		s.Shared = SharedStats{Member: w.sh.id.Load(), Name: w.sh.name, Ranges: slices.Clone(v.owned), Floors: len(v.floors),
			LeaseValid: w.sh.leaseValid(), HandOvers: w.sh.handOvers.Load()}
	}
	return s
}

func (w *Watcher) processStats() ProcessStats { return ProcessStats(procface.StatsOf(&w.procStats)) }

// LagState returns when a read last found nothing new, and the changed_at of the newest row
// read. Zero times mean "not yet". A read that found nothing of a part of the stream that ends at
// a snapshot taken earlier (the legacy part of a switch-over, a delta loaded with the token),
// after which the next delta is read at once, does not count. [Stats].Lag is the lag itself: the age of the oldest row not
// yet acknowledged or read, measured from its changed_at (the start of the transaction that
// wrote it), 0 when caught up.
func (w *Watcher) LagState() (lastEmptyBatch, lastEventRead time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastEmptyBatch, w.lastEventRead
}

// GetUnprocessedEventCount counts the changelog rows of the watched table after lastProcessedID
// (the cursor's id when empty) that are not marked processed, as the watcher it replaces did.
// Without [Config.ProcessedFlag] it counts every row after that id. The processed flag is shared by
// every client of the table and set in the background, so the count is approximate: for this
// client's exact backlog use [Watcher.Backlog].
func (w *Watcher) GetUnprocessedEventCount(ctx context.Context, lastProcessedID string) (int64, error) {
	if w.cfgErr != nil {
		return 0, w.cfgErr
	}
	var after int64
	if lastProcessedID == "" {
		w.mu.Lock()
		after = w.cursor.ID
		w.mu.Unlock()
	} else {
		id, ok, err := position.ParseToken([]byte(lastProcessedID))
		if err != nil || !ok {
			return 0, fmt.Errorf("pgchangestream: lastProcessedID: %w", err)
		}
		after = id
	}
	var n int64
	if err := w.cfg.DB.QueryRowContext(ctx, w.q.Unprocessed, w.cfg.TableName, after).Scan(&n); err != nil {
		return 0, fmt.Errorf("pgchangestream: count unprocessed events: %w", err)
	}
	return n, nil
}

// Backlog counts the rows of the watched table, visible now, that this client's saved token
// does not certify: what a restart would deliver. Unlike GetUnprocessedEventCount it does not
// read the shared processed flag, so it is exact for this client. It counts rows still in the
// Events channel or not acknowledged, and is 0 only when everything was acknowledged and saved.
func (w *Watcher) Backlog(ctx context.Context) (int64, error) {
	if w.cfgErr != nil {
		return 0, w.cfgErr
	}
	w.mu.Lock()
	saved, loaded := w.savedMirror, w.loaded
	w.mu.Unlock()
	if !loaded {
		return 0, errors.New("pgchangestream: backlog: the saved token is not loaded yet")
	}
	var args changelog.Params
	conds := []string{"c.table_name = " + args.Add(w.cfg.TableName)}
	n, _, _, err := changelog.CountNotCertified(ctx, w.cfg.DB, changelog.Quote(w.cfg.ChangelogTable), saved, conds, args)
	if err != nil {
		return 0, fmt.Errorf("pgchangestream: count backlog in changelog %s: %w", w.cfg.ChangelogTable, err)
	}
	return n, nil
}
