package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// maxDowntime bounds the random pause between a crash and the restart, during which the
// writers build up a backlog for the restarted consumer.
const maxDowntime = 250 * time.Millisecond

// demoRun is the running demo: writers, consumer and progress report.
type demoRun struct {
	c        *command
	f        demoFlags
	out      *progressLine
	consumer *demoConsumer
	writers  *demoWriters
	start    time.Time

	crashed       int
	crashSaved    []pgchangestream.Position // the saved position left by each crash
	lastDelivered uint64
	lastReport    time.Time
}

// write runs the writers for the configured duration and crashes the consumer at random
// moments meanwhile, reporting progress.
func (r *demoRun) write(ctx context.Context, rng *rand.Rand) error {
	crashAt := make([]time.Duration, r.f.crashes)
	for i := range crashAt {
		crashAt[i] = time.Duration(rng.Int64N(int64(r.f.duration)))
	}
	slices.Sort(crashAt)
	wctx, stopWriters := context.WithCancel(ctx)
	defer stopWriters()
	done := make(chan error, 1)
	go func() { done <- r.writers.run(wctx, r.f.duration) }()
	progress := time.NewTicker(r.f.progress)
	defer progress.Stop()
	r.lastReport = r.start
	var crash <-chan time.Time
	next := func() {
		crash = nil
		if r.crashed < len(crashAt) {
			crash = time.After(time.Until(r.start.Add(crashAt[r.crashed])))
		}
	}
	next()
	for {
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("write orders: %w", err)
			}
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted: %w", context.Cause(ctx))
			}
			return nil
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

// crashAndRestart crashes the consumer, reports the saved position it left, and starts a new
// one after a short random pause.
func (r *demoRun) crashAndRestart(ctx context.Context, rng *rand.Rand) error {
	r.crashed++
	saved, err := r.consumer.crash(ctx)
	if err != nil {
		return fmt.Errorf("crash %d: %w", r.crashed, err)
	}
	r.crashSaved = append(r.crashSaved, saved)
	downtime := time.Duration(rng.Int64N(int64(maxDowntime)))
	r.out.println(fmt.Sprintf("demo: %5.1fs crash %d/%d: consumer killed; saved position id=%d; restarting in %v",
		time.Since(r.start).Seconds(), r.crashed, r.f.crashes, saved.ID, downtime.Round(time.Millisecond)))
	t := time.NewTimer(downtime)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("interrupted: %w", context.Cause(ctx))
	case <-t.C:
	}
	if _, err := r.consumer.start(ctx); err != nil {
		return fmt.Errorf("restart %d: %w", r.crashed, err)
	}
	return nil
}

// drainSettle is how long the consumer must stay at the newest row, with nothing pending,
// before the rows still missing are given up: longer than a hybrid fallback poll.
const drainSettle = 2 * time.Second

// Outcomes of drain.
const (
	drainedAll   = iota // every written row was delivered
	drainedStuck        // the consumer reached the newest row, some rows behind it are missing
	drainTimeout        // the drain timeout passed
)

// drain waits until every id in ids was delivered. It gives up after the drain timeout, or
// once the consumer has stayed at newest (the newest written position) for drainSettle with
// nothing pending: a row missing then lies behind its position and will not be read.
func (r *demoRun) drain(ctx context.Context, ids []int64, newest pgchangestream.Position) (int, error) {
	deadline := time.NewTimer(r.f.drainTimeout)
	defer deadline.Stop()
	check := time.NewTicker(20 * time.Millisecond)
	defer check.Stop()
	progress := time.NewTicker(r.f.progress)
	defer progress.Stop()
	var atEnd time.Time // since when the consumer is at the newest row
	for !r.consumer.covers(ids) {
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("interrupted: %w", context.Cause(ctx))
		case <-deadline.C:
			return drainTimeout, nil
		case <-progress.C:
			r.report()
		case <-check.C:
			st := r.consumer.stats()
			switch {
			case st.Pending > 0 || st.Cursor.Before(newest):
				atEnd = time.Time{}
			case atEnd.IsZero():
				atEnd = time.Now()
			case time.Since(atEnd) > drainSettle:
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
