package pgchangestream

import (
	"context"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/pending"
)

// benchRow returns changelog row i of a typical captured table: an INSERT with a ~200-byte
// document (the shape the benchmark command writes).
func benchRow(i int64) changelogRow {
	return changelogRow{
		ID:        i,
		RecordID:  "42",
		Operation: "INSERT",
		NewValues: []byte(`{"id": 42, "n": 42, "doc": {"name": "item-42", "tags": ["alpha", "beta", "gamma"], ` +
			`"count": 42, "labels": {"tier": "gold", "zone": "zone-2"}, "status": "active"}}`),
		ChangedAt: t0.Add(time.Duration(i) * time.Microsecond),
	}
}

// benchWatcher returns a watcher that is never started, with batched checkpoints so that
// MarkProcessed does not touch the (absent) database.
func benchWatcher() *Watcher {
	w := newWatcher(Config{ClientName: "bench", TableName: "items", CheckpointInterval: time.Hour}.withDefaults())
	w.loaded = true
	return w
}

// BenchmarkDeliveryPath is the in-memory work per event of a drain, tracked (the watcher's
// deliver and MarkProcessed) and untracked (the same steps without the pending ring): build the
// event, lock and advance the cursor, send on Events, receive, acknowledge. The difference is
// what pending tracking costs per event.
func BenchmarkDeliveryPath(b *testing.B) {
	ctx := context.Background()
	b.Run("tracked", func(b *testing.B) {
		w := benchWatcher()
		b.ReportAllocs()
		for i := range b.N {
			row := benchRow(int64(i + 1))
			if err := w.deliver(ctx, &row, makePosition(row.ChangedAt, row.ID), false); err != nil {
				b.Fatal(err)
			}
			ev := <-w.events
			if err := w.MarkProcessed(ctx, ev.ResumeToken); err != nil {
				b.Fatal(err)
			}
		}
		if st := w.Stats(); st.Pending != 0 || st.Acked != uint64(b.N) {
			b.Fatalf("pending %d, acked %d of %d", st.Pending, st.Acked, b.N)
		}
	})
	b.Run("untracked", func(b *testing.B) {
		w := benchWatcher()
		b.ReportAllocs()
		for i := range b.N {
			row := benchRow(int64(i + 1))
			deliverUntracked(w, &row)
			ev := <-w.events
			if _, _, err := parseToken(ev.ResumeToken); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// deliverUntracked is Watcher.deliver without the pending ring: the baseline of
// BenchmarkDeliveryPath.
func deliverUntracked(w *Watcher, row *changelogRow) {
	ev, raw, _ := w.event(row)
	pos := makePosition(row.ChangedAt, row.ID)
	w.recent.add(row.ID)
	token := formatToken(row.ID)
	w.mu.Lock()
	w.seq++
	w.advanceLocked(pos)
	w.mu.Unlock()
	w.events <- EventWithToken{Event: ev, ResumeToken: token, raw: raw}
	w.delivered.Add(1)
}

// BenchmarkMarkProcessedBatched is one push into the pending ring and one MarkProcessed of it
// with batched checkpoints: the whole per-event cost of tracking and acknowledging, which must
// not allocate.
func BenchmarkMarkProcessedBatched(b *testing.B) {
	ctx := context.Background()
	w := benchWatcher()
	tokens := make([][]byte, DefaultMaxPending)
	for i := range tokens {
		tokens[i] = formatToken(int64(i))
	}
	p := pos(0, 0)
	b.ReportAllocs()
	for i := range b.N {
		id := int64(i % len(tokens))
		w.mu.Lock()
		w.seq++
		w.ring.Push(w.seq, id, Position{ChangedAt: p.ChangedAt, ID: id})
		w.mu.Unlock()
		if err := w.MarkProcessed(ctx, tokens[id]); err != nil {
			b.Fatal(err)
		}
	}
	if n := w.ring.Len(); n != 0 {
		b.Fatalf("%d pending after the loop", n)
	}
}

func BenchmarkPendingPushAck(b *testing.B) {
	r := pending.New(DefaultMaxPending, Position.predecessor)
	p := pos(0, 0)
	b.ReportAllocs()
	for i := range b.N {
		id := int64(i)
		r.Push(uint64(i), id, Position{ChangedAt: p.ChangedAt, ID: id})
		if r.Ack(id) != 1 {
			b.Fatal("ack missed")
		}
	}
}

func BenchmarkCheckpointPosition(b *testing.B) {
	w := newWatcher(Config{ClientName: "bench", TableName: "t"}.withDefaults())
	w.loaded = true
	for i := range DefaultMaxPending / 2 {
		w.ring.Push(uint64(i), int64(i), pos(i, int64(i)))
	}
	w.cursor = pos(DefaultMaxPending, DefaultMaxPending)
	b.ReportAllocs()
	for range b.N {
		w.mu.Lock()
		_, ok := w.checkpointLocked()
		w.mu.Unlock()
		if !ok {
			b.Fatal("no checkpoint")
		}
	}
}
