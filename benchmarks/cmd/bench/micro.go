package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// libraryModule is the module whose micro-benchmarks are run.
const libraryModule = "github.com/pgchangestream/pgchangestream"

// microBenchmarks selects the library's micro-benchmarks the report uses.
const microBenchmarks = `^(BenchmarkPendingPushAck|BenchmarkDeliveryPath|BenchmarkMarkProcessedBatched|BenchmarkCheckpointPosition|BenchmarkBuildEvent|BenchmarkUnmarshalDocument)$`

// microResults are the library's in-memory costs per event, from go test -bench (median of
// the counts).
type microResults struct {
	// PushAckNs and PushAckAllocs: one push and one ack of the pending ring.
	PushAckNs     float64 `json:"pending_push_ack_ns"`
	PushAckAllocs float64 `json:"pending_push_ack_allocs"`
	// Tracked and untracked delivery path: event build, delivery lock, channel send and
	// receive, acknowledgement, with and without the ring.
	DeliveryTrackedNs   float64 `json:"delivery_tracked_ns"`
	DeliveryUntrackedNs float64 `json:"delivery_untracked_ns"`
	// MarkProcessedBatchedNs and Allocs: one MarkProcessed with batched checkpoints.
	MarkProcessedBatchedNs     float64 `json:"mark_processed_batched_ns"`
	MarkProcessedBatchedAllocs float64 `json:"mark_processed_batched_allocs"`
	// CheckpointNs: computing the checkpoint with half of MaxPending deliveries pending.
	CheckpointNs     float64 `json:"checkpoint_position_ns"`
	CheckpointAllocs float64 `json:"checkpoint_position_allocs"`
	// BuildInsertNs and BuildUpdateNs: one event document from a changelog row of about 1 KB.
	BuildInsertNs float64 `json:"build_event_insert_ns"`
	BuildUpdateNs float64 `json:"build_event_update_ns"`
	// UnmarshalDocumentMapNs and UnmarshalDocumentNs: a ~1 KB health document read into a
	// struct through the JSON round trip of its map (the old implementation) and by
	// UnmarshalDocument; UnmarshalDocumentAllocs is the latter's allocations.
	UnmarshalDocumentMapNs  float64 `json:"unmarshal_document_map_ns"`
	UnmarshalDocumentNs     float64 `json:"unmarshal_document_ns"`
	UnmarshalDocumentAllocs float64 `json:"unmarshal_document_allocs"`
}

// benchLine matches a go test -bench result line with -benchmem.
var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op(?:\s+[\d.]+ MB/s)?\s+\d+ B/op\s+(\d+) allocs/op`)

// runMicro runs the library's micro-benchmarks count times each with go test in the library's
// directory (the replace target of this module).
func runMicro(ctx context.Context, count int) (*microResults, error) {
	dir, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", libraryModule).Output()
	if err != nil {
		return nil, fmt.Errorf("locate %s: %w", libraryModule, err)
	}
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", microBenchmarks,
		"-benchmem", "-benchtime", "300ms", "-count", strconv.Itoa(count), ".")
	cmd.Dir = strings.TrimSpace(string(dir))
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go test -bench: %w\n%s", err, out.String())
	}
	ns := map[string][]float64{}
	allocs := map[string][]float64{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, _ := strconv.ParseFloat(m[2], 64)
		a, _ := strconv.ParseFloat(m[3], 64)
		ns[m[1]] = append(ns[m[1]], v)
		allocs[m[1]] = append(allocs[m[1]], a)
	}
	need := []string{"BenchmarkPendingPushAck", "BenchmarkDeliveryPath/tracked",
		"BenchmarkDeliveryPath/untracked", "BenchmarkMarkProcessedBatched", "BenchmarkCheckpointPosition",
		"BenchmarkBuildEvent/insert", "BenchmarkBuildEvent/update",
		"BenchmarkUnmarshalDocument/map-round-trip", "BenchmarkUnmarshalDocument/bytes"}
	for _, name := range need {
		if len(ns[name]) == 0 {
			return nil, fmt.Errorf("no result for %s in:\n%s", name, out.String())
		}
	}
	return &microResults{
		PushAckNs:                  median(ns[need[0]]),
		PushAckAllocs:              median(allocs[need[0]]),
		DeliveryTrackedNs:          median(ns[need[1]]),
		DeliveryUntrackedNs:        median(ns[need[2]]),
		MarkProcessedBatchedNs:     median(ns[need[3]]),
		MarkProcessedBatchedAllocs: median(allocs[need[3]]),
		CheckpointNs:               median(ns[need[4]]),
		CheckpointAllocs:           median(allocs[need[4]]),
		BuildInsertNs:              median(ns[need[5]]),
		BuildUpdateNs:              median(ns[need[6]]),
		UnmarshalDocumentMapNs:     median(ns[need[7]]),
		UnmarshalDocumentNs:        median(ns[need[8]]),
		UnmarshalDocumentAllocs:    median(allocs[need[8]]),
	}, nil
}
