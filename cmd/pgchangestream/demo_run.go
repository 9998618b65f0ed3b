package main

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// maxDowntime bounds the random pause between a crash and the restart. The writers go on
// committing through it, a backlog for the restarted consumer.
const maxDowntime = 250 * time.Millisecond

// restartTimeout bounds the wait for a restarted consumer's first read.
const restartTimeout = 30 * time.Second

// demoRun is the running demo: writers, consumer and progress report.
type demoRun struct {
	c        *command
	f        demoFlags
	out      *progressLine
	db       *sql.DB
	baseline int64 // the demo's changelog rows come after this id
	consumer *demoConsumer
	writers  *demoWriters
	start    time.Time

	crashed       int
	lastDelivered uint64
	lastReport    time.Time
}

// write runs the writers for the configured duration and crashes the consumer at random
// moments meanwhile, reporting progress. The writers go on past the duration until every crash
// has happened: on a slow machine the restarts can take longer than the duration.
func (r *demoRun) write(ctx context.Context, rng *rand.Rand) error {
	crashAt := make([]time.Duration, r.f.crashes)
	for i := range crashAt {
		crashAt[i] = time.Duration(rng.Int64N(int64(r.f.duration)))
	}
	slices.Sort(crashAt)
	wctx, stopWriters := context.WithCancel(ctx)
	defer stopWriters()
	stop := make(chan struct{})
	stopped := false
	done := make(chan error, 1)
	go func() { done <- r.writers.run(wctx, stop) }()
	progress := time.NewTicker(r.f.progress)
	defer progress.Stop()
	over := time.NewTimer(r.f.duration)
	defer over.Stop()
	durationOver := false
	r.lastReport = r.start
	var crash <-chan time.Time
	next := func() {
		crash = nil
		if r.crashed < len(crashAt) {
			crash = time.After(time.Until(r.start.Add(crashAt[r.crashed])))
		} else if durationOver && !stopped {
			close(stop)
			stopped = true
		}
	}
	next()
	for {
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("write %s: %w", demoTable, err)
			}
			if ctx.Err() != nil {
				return interrupted(ctx)
			}
			return nil
		case <-over.C:
			durationOver = true
			next()
		case <-progress.C:
			r.report()
		case <-crash:
			if err := r.crashAndRestart(ctx, rng); err != nil {
				stopWriters()
				<-done
				return err
			}
			next()
		}
	}
}

// crashAndRestart crashes the consumer while the writers go on committing (deliveries not yet
// acknowledged stay pending), reports the saved position it left, and starts a new one after a
// short random pause, waiting until the new watcher has read the changelog once.
func (r *demoRun) crashAndRestart(ctx context.Context, rng *rand.Rand) error {
	r.crashed++
	crash, err := r.consumer.crash(ctx)
	if err != nil {
		return fmt.Errorf("crash %d: %w", r.crashed, err)
	}
	downtime := time.Duration(rng.Int64N(int64(maxDowntime)))
	r.out.println(fmt.Sprintf("demo: %5.1fs crash %d/%d: %d rows written; consumer killed with %d unacknowledged; "+
		"saved position id=%d; restarting in %v",
		time.Since(r.start).Seconds(), r.crashed, r.f.crashes, r.writers.written(), crash.unacked,
		crash.saved.ID, downtime.Round(time.Millisecond)))
	t := time.NewTimer(downtime)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return interrupted(ctx)
	case <-t.C:
	}
	w, err := r.consumer.start(ctx)
	if err != nil {
		return fmt.Errorf("restart %d: %w", r.crashed, err)
	}
	if err := waitReading(ctx, w, restartTimeout); err != nil {
		return fmt.Errorf("restart %d: %w", r.crashed, err)
	}
	return nil
}

// drainSettle is how long nothing may be delivered, with nothing pending, before the rows still
// missing are given up: longer than a hybrid fallback poll.
const drainSettle = 2 * time.Second

// Outcomes of drain.
const (
	drainedAll   = iota // every written row was delivered
	drainedStuck        // nothing was delivered for drainSettle, some rows are missing
	drainTimeout        // the drain timeout passed
)

// drain waits until every id in ids was delivered. It gives up after the drain timeout, or once
// nothing has been delivered for drainSettle with nothing pending.
func (r *demoRun) drain(ctx context.Context, ids []int64) (int, error) {
	deadline := time.NewTimer(r.f.drainTimeout)
	defer deadline.Stop()
	check := time.NewTicker(20 * time.Millisecond)
	defer check.Stop()
	progress := time.NewTicker(r.f.progress)
	defer progress.Stop()
	var (
		idleSince time.Time // since when nothing was delivered, with nothing pending
		delivered uint64
	)
	for !r.consumer.covers(ids) {
		select {
		case <-ctx.Done():
			return 0, interrupted(ctx)
		case <-deadline.C:
			return drainTimeout, nil
		case <-progress.C:
			r.report()
		case <-check.C:
			n := r.consumer.delivered.Load()
			switch {
			case r.consumer.stats().Pending > 0 || n != delivered:
				idleSince, delivered = time.Time{}, n
			case idleSince.IsZero():
				idleSince = time.Now()
			case time.Since(idleSince) > drainSettle:
				return drainedStuck, nil
			}
		}
	}
	return drainedAll, nil
}

// report shows the progress line.
func (r *demoRun) report() { r.out.update(r.progressText()) }

// progressText is one progress line: rows written, deliveries received and acknowledged, the
// deliveries pending acknowledgement, the saved position and the delivery rate since the last
// line.
func (r *demoRun) progressText() string {
	now := time.Now()
	delivered := r.consumer.delivered.Load()
	rate := 0.0
	if dt := now.Sub(r.lastReport).Seconds(); dt > 0 {
		rate = float64(delivered-r.lastDelivered) / dt
	}
	r.lastDelivered, r.lastReport = delivered, now
	st := r.consumer.stats()
	saved := "-" // a restarted consumer that has not loaded its position yet
	if st.Checkpoint != (pgchangestream.Position{}) {
		saved = strconv.FormatInt(st.Checkpoint.ID, 10)
	}
	return fmt.Sprintf("demo: %5.1fs written=%d delivered=%d acked=%d pending=%d saved=%s events/s=%.0f",
		now.Sub(r.start).Seconds(), r.writers.written(), delivered, r.consumer.acked.Load(),
		st.Pending, saved, rate)
}

// interrupted is the error of a demo stopped by its context (SIGINT or SIGTERM).
func interrupted(ctx context.Context) error {
	return fmt.Errorf("interrupted: %w", context.Cause(ctx))
}
