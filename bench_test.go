package pgchangestream

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/pending"
	"github.com/pgchangestream/pgchangestream/internal/position"
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
	w := newWatcher(Config{ClientName: "bench", TableName: "items", CheckpointInterval: time.Hour}.WithDefaults())
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
			if err := w.deliver(ctx, &row, position.Make(row.ChangedAt, row.ID), false); err != nil {
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
			if _, _, err := position.ParseToken(ev.ResumeToken); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// deliverUntracked is Watcher.deliver without the pending ring: the baseline of
// BenchmarkDeliveryPath.
func deliverUntracked(w *Watcher, row *changelogRow) {
	ev, raw, _ := w.event(row)
	pos := position.Make(row.ChangedAt, row.ID)
	w.recent.Add(row.ID)
	token := position.FormatToken(row.ID)
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
		tokens[i] = position.FormatToken(int64(i))
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
	r := pending.New(DefaultMaxPending, Position.Predecessor)
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
	w := newWatcher(Config{ClientName: "bench", TableName: "t"}.WithDefaults())
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

// BenchmarkProcess drains a backlog of b.N deliveries through Process (the watcher's deliver,
// the engine, the low-water-mark acknowledgement), with batched checkpoints and no token writes,
// so that no save touches the database: (a) a no-op handler, (b) a 2 ms handler over 1,000 keys,
// (c) the same with one hot key holding half of the events, whose deferred events are read
// again from an in-memory changelog (MaxDeferred 64 × MaxInFlight; cold_events/s is the other
// keys' own rate), and (d) (c) without deferral (the default), for comparison.
func BenchmarkProcess(b *testing.B) {
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = strconv.Itoa(i)
	}
	spread := func(ev EventWithToken) string {
		id, _, _ := position.ParseToken(ev.ResumeToken)
		return keys[id%int64(len(keys))]
	}
	hotHalf := func(ev EventWithToken) string {
		if id, _, _ := position.ParseToken(ev.ResumeToken); id%2 == 0 {
			return "hot"
		}
		return spread(ev)
	}
	noop := func(context.Context, EventWithToken) error { return nil }
	sleep2ms := func(context.Context, EventWithToken) error { time.Sleep(2 * time.Millisecond); return nil }
	for _, c := range []struct {
		name        string
		workers     int
		key         func(EventWithToken) string
		handle      Handler
		maxDeferred int
	}{
		{"noop/workers=8", 8, spread, noop, 0},
		{"sleep2ms/keys=1000/workers=8", 8, spread, sleep2ms, 0},
		{"sleep2ms/keys=1000/workers=64", 64, spread, sleep2ms, 0},
		{"sleep2ms/hotkey=half/workers=64", 64, hotHalf, sleep2ms, 64 * DefaultProcessMaxInFlight},
		{"sleep2ms/hotkey=half/workers=64/nodefer", 64, hotHalf, sleep2ms, 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := benchWatcher()
			w.cfg.Ephemeral = true // the final save too leaves the database alone
			f := newFakeDB(w.cfg)  // the changelog deferred events are read again from
			for i := range b.N {
				f.rows = append(f.rows, fakeRow{changelogRow: benchRow(int64(i + 1)), table: w.cfg.TableName, visible: true})
			}
			w.cfg.DB = f.open(b)
			b.ResetTimer()
			var cold, coldDone, done atomic.Int64
			var coldAt atomic.Int64 // nanoseconds from the start to the last cold event's end
			start := time.Now()
			handle := func(ctx context.Context, ev EventWithToken) error {
				err := c.handle(ctx, ev)
				if c.key(ev) != "hot" && coldDone.Add(1) == cold.Load() {
					coldAt.Store(int64(time.Since(start)))
				}
				if done.Add(1) == int64(b.N) {
					cancel() // every event finished; closing Events would stop Process with deferred events left
				}
				return err
			}
			for i := range b.N {
				if c.key(EventWithToken{ResumeToken: position.FormatToken(int64(i + 1))}) != "hot" {
					cold.Add(1)
				}
			}
			go func() {
				for i := range b.N {
					row := benchRow(int64(i + 1))
					if err := w.deliver(ctx, &row, position.Make(row.ChangedAt, row.ID), false); err != nil {
						panic(err)
					}
				}
			}()
			b.ReportAllocs()
			o := ProcessOptions{Workers: c.workers, Key: c.key, MaxDeferred: c.maxDeferred}.withDefaults()
			if err := w.process(ctx, w.events, o, w.handlerStep(handle)); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
			if at := coldAt.Load(); at > 0 {
				b.ReportMetric(float64(cold.Load())/time.Duration(at).Seconds(), "cold_events/s")
			}
			// Deferred events can outgrow MaxPending: the oldest are evicted into the floor, and
			// the in-order acknowledgements of later ones clear it.
			if st := w.Stats(); st.Acked+st.Evicted != uint64(b.N) || st.Pending != 0 || st.FloorActive {
				b.Fatalf("acked %d, evicted %d, pending %d of %d, floor %v", st.Acked, st.Evicted, st.Pending, b.N, st.FloorActive)
			}
		})
	}
}
