package main

import (
	"fmt"
	"strings"

	"github.com/pgchangestream/pgchangestream"
)

// sharedMeasured reports whether the run measured the shared figures.
func (r *results) sharedMeasured() bool {
	_, ok := r.Stats[sharedKey(1, "eps")]
	return ok
}

// sharedMembersLabel names a member count of the shared figures.
func sharedMembersLabel(n int) string {
	switch n {
	case 0:
		return "unshared watcher"
	case 1:
		return "1 member"
	}
	return itoa(n) + " members"
}

// sharedFigures are the shared figures of the table of figures.
func (r *results) sharedFigures() []figure {
	if !r.sharedMeasured() {
		return nil
	}
	var fs []figure
	for _, n := range sharedReadMembers {
		fs = append(fs, figure{sharedKey(n, "eps"), formatStat(r.Stats[sharedKey(n, "eps")]) + " /s",
			fmt.Sprintf("%s drain %s events (%d updates of %s rows), Process Workers %d each, handler sleeps 2 ms",
				sharedMembersLabel(n), countLabel(sharedRows), sharedUpdates, countLabel(sharedKeys), sharedWorkers)})
	}
	return append(fs,
		figure{"shared_join_s", formatStat(r.Stats["shared_join_s"]) + " s",
			fmt.Sprintf("a 4th member's Start → every member owns its share (16 ranges), 1,000 events/s written; SharedLease %v",
				pgchangestream.DefaultSharedLease)},
		figure{"shared_kill_s", formatStat(r.Stats["shared_kill_s"]) + " s",
			fmt.Sprintf("one of 4 members crashes (context cancelled, pool closed, no Close) → the 3 others own every range; SharedLease %v",
				sharedKillLease)})
}

// sharedTargets are the goals of the shared figures.
func (r *results) sharedTargets() []target {
	if !r.sharedMeasured() {
		return nil
	}
	return []target{ratioTarget("Shared, 4 members / 1 member (Process Workers 8 each, 2 ms handler)",
		r.Stats[sharedKey(4, "eps")].Median, r.Stats[sharedKey(1, "eps")].Median,
		sharedKey(4, "eps"), sharedKey(1, "eps"), sharedScaleGoal)}
}

// sharedMarkdown is the report's section on shared consumers; empty when not measured.
func (r *results) sharedMarkdown() string {
	if !r.sharedMeasured() {
		return ""
	}
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("## Shared consumers")
	p("")
	p("Members of one client (`Config.Shared`, same `ClientName`) run as goroutines of the benchmark,")
	p("each a watcher of its own with a pool of %d connections, in polling mode (PollInterval %v),", sharedPoolSize, sharedPollInterval)
	p("running `Process` with Workers %d and a handler that sleeps 2 ms. The captured table holds %s", sharedWorkers, countLabel(sharedKeys))
	p("rows, so events spread over %s record ids (keys and units). The 1-member drain is Shared as", countLabel(sharedKeys))
	p("well, so the ratio isolates scaling.")
	p("")
	p("- **Drains.** A new client's members start and wait until they divide the %d ranges fairly;", pgchangestream.SharedRanges)
	p("  then one transaction updates every row %d times (%s changelog rows) and is prepared", sharedUpdates, countLabel(sharedRows))
	p("  (`PREPARE TRANSACTION`; the table is captured `WithoutNotify`), and `COMMIT PREPARED` makes")
	p("  the backlog visible at once. A drain is timed from `COMMIT PREPARED` until every event was")
	p("  handled (each counted once by changelog id).")
	p("- **Rebalance.** A writer updates %d rows every %v (1,000 events/s) throughout. Join: three", sharedWriteRows, sharedWriteEvery)
	p("  members (default SharedLease, %v) share the ranges; a fourth is started, timed until each of", pgchangestream.DefaultSharedLease)
	p("  the four owns 16 ranges (`Stats().Shared.Ranges`, every range once). Kill: four members with")
	p("  SharedLease %v; one's context is cancelled and its pool closed without `Close`, so it", sharedKillLease)
	p("  neither leaves nor renews its lease; timed until the three others own every range.")
	p("- **Reads.** The changelog's counters in `pg_stat_user_indexes` (`idx_tup_read`: index entries")
	p("  read), `pg_statio_user_indexes` (index buffer accesses, hit or read) and `pg_statio_user_tables`")
	p("  (heap buffer accesses) are read after the backlog's writer session ended (a session's counts")
	p("  reach the views at the latest when it ends) and again after the members closed and their")
	p("  sessions ended: the growth is what the members' reads of the drain cost, their polls of the")
	p("  drain's time included. The views count per table, not per session, so a member's cost is the")
	p("  total divided by the members (the shares are even, see the last column); per 1,000 rows")
	p("  delivered it is the total divided by the %s rows.", countLabel(sharedRows))
	p("")
	p("| reader | drain | index entries / 1,000 rows | index blocks / 1,000 rows | heap blocks / 1,000 rows | index + heap blocks per member | rows per member (min–max) |")
	p("| --- | --- | --- | --- | --- | --- | --- |")
	for _, n := range sharedReadMembers {
		f := func(what string) float64 { return r.Stats[sharedKey(n, what)].Median }
		members := float64(max(n, 1))
		perMember := (f("index_blocks_per_1k") + f("heap_blocks_per_1k")) * float64(sharedRows) / 1000 / members
		p("| %s | %s /s | %.0f | %.0f | %.0f | %.0f | %.0f–%.0f |", sharedMembersLabel(n), formatStat(r.Stats[sharedKey(n, "eps")]),
			f("index_entries_per_1k"), f("index_blocks_per_1k"), f("heap_blocks_per_1k"), perMember,
			f("share_min"), f("share_max"))
	}
	p("")
	p("What bounds the reads: a member visits the index entries of the whole delta (the unit is")
	p("checked on each entry, so other members' rows are neither fetched nor decoded), and its rows")
	p("are every few ids, on the same heap pages as the other members' rows: a large delta's listed")
	p("ids are read one key range of the member's units per page (rows of other units in the range")
	p("are filtered out on the heap tuple, not returned), so each heap page it visits")
	p("holds few of its rows. Heap and index blocks per member therefore fall more slowly than its")
	p("share of the rows; decoding and handling are its share.")
	p("")
	p("Rebalance: a member joining has its share after %s s (median [min–max], SharedLease %v); after", formatStat(r.Stats["shared_join_s"]),
		pgchangestream.DefaultSharedLease)
	p("a member's crash the others own every range after %s s (SharedLease %v).", formatStat(r.Stats["shared_kill_s"]), sharedKillLease)
	p("")
	return b.String()
}
