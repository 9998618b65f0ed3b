package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// sharedScaleGoal is the lowest ratio of the drain of 4 members to that of 1 member.
const sharedScaleGoal = 3

// sharedReadMembers are the member counts whose reads are counted; 0 is the unshared watcher.
var sharedReadMembers = []int{0, 1, 4, 16}

// sharedKey names a figure of members members (0: the unshared watcher).
func sharedKey(members int, what string) string {
	if members == 0 {
		return "shared_unshared_" + what
	}
	return "shared_m" + itoa(members) + "_" + what
}

// sharedDrainResult is one drain of a backlog by members.
type sharedDrainResult struct {
	elapsed time.Duration
	reads   changelogReads // the counters' growth from before COMMIT PREPARED until the members' sessions ended
	shares  []int64        // events each member handled
}

// drainShared drains a backlog of sharedRows events with members members of a new client (0:
// one unshared watcher), each running Process (Workers 8, the 2 ms handler). The members join
// and divide the ranges first; then the backlog is written by a prepared transaction and its
// sessions end, the counters are read, and COMMIT PREPARED makes it visible. The drain is
// timed from COMMIT PREPARED until every event was handled; the counters are read again once
// the members closed and their sessions ended.
func drainShared(ctx context.Context, e *env, members int) (sharedDrainResult, error) {
	var res sharedDrainResult
	d, err := e.newSharedDatabase(ctx)
	if err != nil {
		return res, err
	}
	defer d.drop(ctx)
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	after, err := d.newestID(ctx)
	if err != nil {
		return res, err
	}
	seen := make([]atomic.Bool, sharedRows)
	var distinct, unexpected atomic.Int64
	finished := make(chan struct{})
	var end atomic.Int64 // nanoseconds since the Unix epoch of the last new event's end
	onEvent := func(id int64) {
		i := id - after - 1
		if i < 0 || i >= sharedRows {
			unexpected.Add(1)
			return
		}
		if !seen[i].Swap(true) && distinct.Add(1) == sharedRows {
			end.Store(time.Now().UnixNano())
			close(finished)
		}
	}
	client := "shared-" + itoa(members)
	var ms []*sharedMember
	defer func() { _ = stopAll(context.WithoutCancel(ctx), ms) }()
	for i := range max(members, 1) {
		name := fmt.Sprintf("member-%d", i)
		m, err := d.startMember(ctx, sharedConfig(d.DB, client, name, members > 0, 0), "bench-"+name, onEvent)
		if err != nil {
			return res, err
		}
		ms = append(ms, m)
	}
	for _, m := range ms {
		select {
		case <-m.w.Ready():
		case <-ctx.Done():
			return res, fmt.Errorf("members not ready: %w", ctx.Err())
		}
	}
	if members > 0 {
		if err := waitFor(ctx, ms, "the members divide the ranges", func() bool { return fairSplit(ms) }); err != nil {
			return res, err
		}
	}
	if err := d.writeSharedBacklog(ctx); err != nil {
		return res, err
	}
	before, err := d.readCounters(ctx)
	if err != nil {
		return res, err
	}
	if _, err := d.ExecContext(ctx, `COMMIT PREPARED '`+backlogGID+`'`); err != nil {
		return res, err
	}
	start := time.Now()
	if newest, err := d.newestID(ctx); err != nil || newest != after+sharedRows {
		return res, fmt.Errorf("backlog ids %d..%d, want %d consecutive ones (%v)", after+1, newest, sharedRows, err)
	}
	select {
	case <-finished:
	case <-ctx.Done():
		return res, fmt.Errorf("%d of %d events handled: %w", distinct.Load(), sharedRows, ctx.Err())
	}
	res.elapsed = time.Unix(0, end.Load()).Sub(start)
	for _, m := range ms {
		res.shares = append(res.shares, m.handled.Load())
	}
	stopped := ms
	ms = nil
	if err := stopAll(ctx, stopped); err != nil {
		return res, err
	}
	if err := d.waitSessionsGone(ctx, "bench-member"); err != nil {
		return res, err
	}
	after2, err := d.readCounters(ctx)
	if err != nil {
		return res, err
	}
	res.reads = changelogReads{
		indexEntries: after2.indexEntries - before.indexEntries,
		indexBlocks:  after2.indexBlocks - before.indexBlocks,
		heapBlocks:   after2.heapBlocks - before.heapBlocks,
	}
	if n := unexpected.Load(); n > 0 {
		return res, fmt.Errorf("%d events outside the backlog were handled", n)
	}
	return res, nil
}

// rebalanceShared measures, on one database with steady writes, the time from a fourth
// member's Start until the four divide the ranges fairly (default SharedLease), and the time
// from a member's crash until the three left own every range (SharedLease sharedKillLease).
func rebalanceShared(ctx context.Context, e *env) (join, kill time.Duration, err error) {
	d, err := e.newSharedDatabase(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer d.drop(ctx)
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	writer, err := d.openPool("bench-writer", 1)
	if err != nil {
		return 0, 0, err
	}
	defer writer.Close()
	wctx, stopWrites := context.WithCancel(ctx)
	writeErr := make(chan error, 1)
	go func() { writeErr <- steadyWrites(wctx, writer) }()
	defer func() {
		stopWrites()
		if werr := <-writeErr; err == nil {
			err = werr
		}
	}()

	start := func(client string, lease time.Duration, i int) (*sharedMember, error) {
		name := fmt.Sprintf("%s-%d", client, i)
		return d.startMember(ctx, sharedConfig(d.DB, client, name, true, lease), "bench-"+name, func(int64) {})
	}
	members := func(client string, lease time.Duration, n int) ([]*sharedMember, error) {
		var ms []*sharedMember
		for i := range n {
			m, err := start(client, lease, i)
			if err != nil {
				return ms, err
			}
			ms = append(ms, m)
		}
		return ms, waitFor(ctx, ms, "the members divide the ranges", func() bool { return fairSplit(ms) })
	}

	ms, err := members("join", 0, 3)
	defer func() { _ = stopAll(context.WithoutCancel(ctx), ms) }()
	if err != nil {
		return 0, 0, err
	}
	began := time.Now()
	m, err := start("join", 0, 3)
	if err != nil {
		return 0, 0, err
	}
	ms = append(ms, m)
	if err := waitFor(ctx, ms, "the joined member has its share", func() bool { return fairSplit(ms) }); err != nil {
		return 0, 0, err
	}
	join = time.Since(began)

	ks, err := members("kill", sharedKillLease, 4)
	defer func() { _ = stopAll(context.WithoutCancel(ctx), ks) }()
	if err != nil {
		return 0, 0, err
	}
	began = time.Now()
	ks[1].kill()
	survivors := slices.Delete(slices.Clone(ks), 1, 2)
	if err := waitFor(ctx, survivors, "the survivors own every range", func() bool { return fairSplit(survivors) }); err != nil {
		return 0, 0, err
	}
	return join, time.Since(began), nil
}

// steadyWrites updates sharedWriteRows rows of sharedTable every sharedWriteEvery, in turn,
// until ctx ends.
func steadyWrites(ctx context.Context, db *sql.DB) error {
	tick := time.NewTicker(sharedWriteEvery)
	defer tick.Stop()
	for from := 1; ; from = (from-1+sharedWriteRows)%sharedKeys + 1 {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if _, err := db.ExecContext(ctx, `UPDATE `+sharedTable+` SET n = n + 1 WHERE id BETWEEN $1 AND $2`,
			from, from+sharedWriteRows-1); err != nil && ctx.Err() == nil {
			return fmt.Errorf("steady writes: %w", err)
		}
	}
}

// measureShared runs the shared figures o.reps times: the drains of 1 and 4 members next to
// each other, those of 16 members and of an unshared watcher (their reads counted), and the
// rebalance times.
func measureShared(ctx context.Context, e *env, o options, res *results, logf func(string, ...any)) error {
	order := []int{1, 4, 16, 0}
	for rep := 1; rep <= o.reps; rep++ {
		for _, n := range order {
			r, err := drainShared(ctx, e, n)
			if err != nil {
				return fmt.Errorf("shared drain, %d members: %w", n, err)
			}
			rate := float64(sharedRows) / r.elapsed.Seconds()
			res.Samples[sharedKey(n, "eps")] = append(res.Samples[sharedKey(n, "eps")], rate)
			per := func(v int64) float64 { return 1000 * float64(v) / float64(sharedRows) }
			res.Samples[sharedKey(n, "index_entries_per_1k")] = append(res.Samples[sharedKey(n, "index_entries_per_1k")], per(r.reads.indexEntries))
			res.Samples[sharedKey(n, "index_blocks_per_1k")] = append(res.Samples[sharedKey(n, "index_blocks_per_1k")], per(r.reads.indexBlocks))
			res.Samples[sharedKey(n, "heap_blocks_per_1k")] = append(res.Samples[sharedKey(n, "heap_blocks_per_1k")], per(r.reads.heapBlocks))
			res.Samples[sharedKey(n, "share_min")] = append(res.Samples[sharedKey(n, "share_min")], float64(slices.Min(r.shares)))
			res.Samples[sharedKey(n, "share_max")] = append(res.Samples[sharedKey(n, "share_max")], float64(slices.Max(r.shares)))
			logf("rep %d/%d shared, %2d members: %6.0f /s; per 1,000 rows: %.0f index entries, %.0f index blocks, %.0f heap blocks; shares %d–%d",
				rep, o.reps, n, rate, per(r.reads.indexEntries), per(r.reads.indexBlocks), per(r.reads.heapBlocks),
				slices.Min(r.shares), slices.Max(r.shares))
		}
		join, kill, err := rebalanceShared(ctx, e)
		if err != nil {
			return fmt.Errorf("shared rebalance: %w", err)
		}
		res.Samples["shared_join_s"] = append(res.Samples["shared_join_s"], join.Seconds())
		res.Samples["shared_kill_s"] = append(res.Samples["shared_kill_s"], kill.Seconds())
		logf("rep %d/%d shared rebalance: join %.2f s, kill %.2f s (lease %v)", rep, o.reps, join.Seconds(), kill.Seconds(), sharedKillLease)
	}
	return nil
}
