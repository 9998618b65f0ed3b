package pgchangestream

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// tryToken returns the client's saved token without failing the test, for conditions that run
// on another goroutine.
func (e *liveEnv) tryToken(client string) (Position, error) {
	var raw string
	if err := e.db.QueryRow(`SELECT resume_token::text FROM resume_tokens WHERE client_name = $1`, client).Scan(&raw); err != nil {
		return Position{}, err
	}
	p, err := position.DecodeToken([]byte(raw))
	return legacyView(p), err
}

// processed returns the legacy processed flag of a changelog row.
func (e *liveEnv) processed(id int64) bool {
	e.t.Helper()
	var p bool
	require.NoError(e.t, e.db.QueryRow(`SELECT processed FROM datastore_changelog WHERE id = $1`, id).Scan(&p))
	return p
}

// waitProcessed waits until the background marker has set the processed flag of row id.
func (e *liveEnv) waitProcessed(id int64) {
	e.t.Helper()
	require.Eventually(e.t, func() bool { return e.processed(id) }, liveWait, 5*time.Millisecond,
		"the processed flag of row %d is never set", id)
}

// writeBulk commits batches transactions of size rows each, one after the other. It does not
// fail the test, so it can run on another goroutine.
func (e *liveEnv) writeBulk(batches, size int) error {
	for range batches {
		if _, err := e.db.Exec(`INSERT INTO items (n) SELECT g FROM generate_series(1, $1::int) g`, size); err != nil {
			return err
		}
	}
	return nil
}

// TestLiveSkippedAcksAreCertifiedByLaterAcks proves rules 3 and 7 over a long run with a writer
// running concurrently: a consumer that never acknowledges about one event in ten (failed work it
// gives up on) and acknowledges the others does not deadlock the watcher and gets every event
// exactly once, in order. The documented outcome of cumulative acknowledgement: each later ack
// certifies the skipped events before it, so the final saved token is the last row's position and
// a restart does not deliver the skipped events again.
func TestLiveSkippedAcksAreCertifiedByLaterAcks(t *testing.T) {
	eachMode(t, func(t *testing.T, e *liveEnv, mode Mode) {
		const batches, size, maxPending = 20, 50, 32
		const n = batches * size
		ctx := context.Background()
		cfg := e.fromBeginning(mode)
		cfg.MaxPending, cfg.BufferSize, cfg.BatchSize = maxPending, 8, 50
		w := e.start(cfg)
		waitStartSaved(t, w)
		written := make(chan error, 1)
		go func() { written <- e.writeBulk(batches, size) }()

		got := make([]int64, 0, n)
		maxSeen := 0
		for i := range n {
			id := receiveWithin(t, w, 1, liveWait)[0]
			got = append(got, id)
			if i%10 == 3 { // failed work: never acknowledged
				continue
			}
			require.NoError(t, w.MarkProcessed(ctx, tok(id)))
			maxSeen = max(maxSeen, w.Stats().Pending)
		}
		require.NoError(t, <-written)
		require.Equal(t, e.idsInOrder(), got, "every event delivered once, in position order")
		st := w.Stats()
		require.LessOrEqual(t, maxSeen, cfg.BufferSize+1,
			"after an ack only the deliveries in the channel and the one being sent are pending")
		require.Zero(t, st.Pending)
		require.Zero(t, st.Evicted, "skipped deliveries never pile up to MaxPending")
		require.False(t, st.FloorActive)
		require.Equal(t, uint64(n), st.Acked, "the skipped events were certified by later acks")
		require.Equal(t, e.position(got[n-1]), e.savedToken("c"), "the final saved token is the last row's position")
		require.NoError(t, w.Close(ctx))

		e.requireRestartDelivers(mode, nil, "a restart replays nothing")
	})
}

// TestLiveCheckpointWriteFailure proves rules 8 and 12: a save the server rejects makes
// MarkProcessed return an error that names the save and wraps the server's error, counts it, and
// leaves the saved token and the processed flags (same statement) unchanged; the acknowledgement
// is kept, so a retry with an empty token saves it once the server accepts it.
func TestLiveCheckpointWriteFailure(t *testing.T) {
	eachMode(t, func(t *testing.T, e *liveEnv, mode Mode) {
		ctx := context.Background()
		ids := e.insert(3)
		cfg := e.fromBeginning(mode)
		cfg.ProcessedFlag = true // the flag follows the saves that succeed
		w := e.start(cfg)
		require.Equal(t, ids, receiveWithin(t, w, 3, liveWait))
		require.NoError(t, w.MarkProcessed(ctx, tok(ids[0])))
		kept := e.position(ids[1]).Predecessor()
		require.Equal(t, kept, e.savedToken("c"))

		// The saved token's eventID is ids[1]-1; the next one, ids[2]-1, is rejected.
		_, err := e.db.Exec(fmt.Sprintf(`ALTER TABLE resume_tokens ADD CONSTRAINT no_more
			CHECK ((resume_token->>'eventID')::bigint < %d)`, ids[1]))
		require.NoError(t, err)
		before := w.Stats()
		err = w.MarkProcessed(ctx, tok(ids[1]))
		require.ErrorContains(t, err, "save checkpoint")
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "23514", pgErr.Code, "check_violation")
		require.Equal(t, "no_more", pgErr.ConstraintName)
		st := w.Stats()
		require.Equal(t, before.CheckpointErrors+1, st.CheckpointErrors)
		require.Equal(t, before.CheckpointWrites, st.CheckpointWrites)
		require.Equal(t, kept, legacyView(st.Checkpoint))
		require.Equal(t, kept, e.savedToken("c"), "the saved token is unchanged")
		require.False(t, e.processed(ids[1]), "the processed update failed with the token upsert")
		require.Equal(t, uint64(2), st.Acked, "the acknowledgement is kept")
		require.Equal(t, 1, st.Pending)

		_, err = e.db.Exec(`ALTER TABLE resume_tokens DROP CONSTRAINT no_more`)
		require.NoError(t, err)
		require.NoError(t, w.MarkProcessed(ctx, nil), "a retry saves the kept acknowledgement")
		require.Equal(t, e.position(ids[2]).Predecessor(), e.savedToken("c"))
		e.waitProcessed(ids[1])
		require.False(t, e.processed(ids[2]))
		writes := w.Stats().CheckpointWrites
		require.NoError(t, w.Flush(ctx))
		require.Equal(t, writes, w.Stats().CheckpointWrites, "an unchanged checkpoint is not written again")
	})
}

// TestLiveConcurrentDeliveryAndWatermarkAcks proves rules 1, 3 and 9 under concurrency, with a
// writer inserting while events are delivered: one dispatcher numbers deliveries in receive
// order, workers finish them out of order and each acks the contiguous watermark. While it runs,
// every saved token covers only finished rows; at the end every row was delivered once and the
// saved token is the last row's position.
func TestLiveConcurrentDeliveryAndWatermarkAcks(t *testing.T) {
	eachMode(t, func(t *testing.T, e *liveEnv, mode Mode) {
		const batches, size, workers = 30, 20, 4
		const n = batches * size
		ctx := context.Background()
		cfg := e.fromBeginning(mode)
		cfg.MaxPending = 256
		w := e.start(cfg)
		waitStartSaved(t, w)
		written := make(chan error, 1)
		go func() { written <- e.writeBulk(batches, size) }()

		c := newWatermarkConsumer()
		wait := c.run(t, ctx, w, workers)
		defer wait()
		defer func() { _ = w.Close(ctx) }()

		// Every row at or before the saved token must be finished: it was marked done before
		// the ack that allowed the save, which was before this read of the token.
		// It returns how many rows the token covers.
		checkSaved := func() (covered int) {
			p, err := e.tryToken("c")
			if err != nil {
				t.Error(err)
				return 0
			}
			rows, err := e.db.Query(`SELECT id FROM datastore_changelog
				WHERE table_name = 'items' AND (changed_at, id) <= ($1, $2)`, p.ChangedAt, p.ID)
			if err != nil {
				t.Error(err)
				return 0
			}
			defer rows.Close()
			for rows.Next() {
				var id int64
				if err := rows.Scan(&id); err != nil || !c.isDone(id) {
					t.Errorf("saved token %v passes row %d, which is not finished (%v)", p, id, err)
				}
				covered++
			}
			return covered
		}
		waitFor(t, func() bool {
			checkSaved()
			return c.finishedAll(n)
		}, "every event is finished")
		require.NoError(t, <-written)
		require.NoError(t, w.MarkProcessed(ctx, nil))
		all := e.idsInOrder()
		c.mu.Lock()
		require.Equal(t, all, c.order, "every row delivered once, in position order")
		c.mu.Unlock()
		require.Equal(t, e.position(all[n-1]), e.savedToken("c"))
		require.Equal(t, n, checkSaved())
	})
}

// parseTokenID parses a delivery's token.
func parseTokenID(token []byte) (int64, error) {
	id, ok, err := position.ParseToken(token)
	if err == nil && !ok {
		err = fmt.Errorf("empty token")
	}
	return id, err
}

// TestLiveFilteredRowsAdvanceTheToken proves rule 10: rows the filter rejects are never delivered
// or pending, and the watcher saves the position past them by itself, without acks, so a restart
// does not replay them.
func TestLiveFilteredRowsAdvanceTheToken(t *testing.T) {
	eachMode(t, func(t *testing.T, e *liveEnv, mode Mode) {
		ctx := context.Background()
		cfg := e.config(mode)
		cfg.Filter = func(Event) bool { return false }
		cfg.IdleCheckpointInterval = 100 * time.Millisecond
		w := e.start(cfg)
		waitStartSaved(t, w)
		ids := e.insert(5)
		last := e.position(ids[4])
		waitFor(t, func() bool { p, err := e.tryToken("c"); return err == nil && p.Compare(last) == 0 },
			"the saved token reaches the last filtered row")
		requireNothingWithin(t, w, liveQuiet)
		st := w.Stats()
		require.Equal(t, uint64(5), st.Filtered)
		require.Zero(t, st.Delivered)
		require.Zero(t, st.Pending)
		require.NoError(t, w.Close(ctx))

		next := e.insert(1)
		e.requireRestartDelivers(mode, next, "the filtered range is not replayed")
	})
}

// TestLiveNewClientStartPosition proves rule 14 on the legacy schema for a client without a saved
// token: it starts
// after the newest row of its table as the database sees it (here the database's clock is an hour
// behind the application's, and another table has a later row), saves that position at once, and
// delivers only rows written after it; with StartFromBeginning it delivers every row.
func TestLiveNewClientStartPosition(t *testing.T) {
	runModes(t, liveModes, newLegacy, func(t *testing.T, e *liveEnv, mode Mode) {
		_, err := e.db.Exec(`ALTER TABLE datastore_changelog ALTER COLUMN changed_at SET DEFAULT now() - interval '1 hour'`)
		require.NoError(t, err)
		_, err = e.db.Exec(`INSERT INTO datastore_changelog (table_name, record_id, operation, new_values, changed_at)
			VALUES ('other', gen_random_uuid(), 'INSERT', '{}', now() + interval '1 hour')`)
		require.NoError(t, err)
		before := e.insert(3)

		w := e.start(e.config(mode))
		waitStartSaved(t, w)
		start := e.savedToken("c")
		require.Equal(t, e.position(before[2]), start, "the start is the newest row of the table")
		require.True(t, start.ChangedAt.Before(time.Now().Add(-30*time.Minute)), "by the database's clock")
		after := e.insert(2)
		require.Equal(t, after, receiveWithin(t, w, 2, liveWait), "rows before the start are not delivered")
		requireNothingWithin(t, w, liveQuiet)

		cfg := e.fromBeginning(mode)
		cfg.ClientName = "fresh"
		w2 := e.start(cfg)
		require.Equal(t, append(before, after...), receiveWithin(t, w2, 5, liveWait))
		requireNothingWithin(t, w2, liveQuiet)
	})
}

// TestLiveExistingTokenFormats proves the saved-token formats of the contract's words (drop-in
// compatibility) and rule 14's "no guessed positions": tokens written by the existing provider,
// {"timestamp", "eventID"} (in UTC or with an offset) and {"eventID"} alone, resume right after
// their row; an id-only token whose row is gone replays the table rather than skipping.
func TestLiveExistingTokenFormats(t *testing.T) {
	eachMode(t, func(t *testing.T, e *liveEnv, mode Mode) {
		ids := e.insert(5)
		p1, p2 := e.position(ids[1]), e.position(ids[2])
		tokens := map[string]string{
			"utc":     fmt.Sprintf(`{"timestamp": %q, "eventID": %d}`, p1.ChangedAt.Format(time.RFC3339Nano), ids[1]),
			"offset":  fmt.Sprintf(`{"timestamp": %q, "eventID": %d}`, p2.ChangedAt.In(time.FixedZone("", 2*3600)).Format(time.RFC3339Nano), ids[2]),
			"id-only": fmt.Sprintf(`{"eventID": %d}`, ids[3]),
			"gone":    `{"eventID": 999999999}`,
		}
		want := map[string][]int64{"utc": ids[2:], "offset": ids[3:], "id-only": ids[4:], "gone": ids}
		for client, token := range tokens {
			_, err := e.db.Exec(`INSERT INTO resume_tokens (client_name, resume_token) VALUES ($1, $2::jsonb)`, client, token)
			require.NoError(t, err)
		}
		for client, ids := range want {
			cfg := e.config(mode)
			cfg.ClientName = client
			w := e.start(cfg)
			require.Equal(t, ids, receiveWithin(t, w, len(ids), liveWait), "client %s", client)
			requireNothingWithin(t, w, liveQuiet)
		}
	})
}

// TestLiveEventDocuments proves the event document (the architecture's event format) built from
// the real trigger's rows (to_jsonb of the row, so fields are the table's columns): insert, update
// with the dot-flattened diff, delete with fullDocumentBeforeChange, nested values as
// map[string]any, and the DocumentField unwrapping.
func TestLiveEventDocuments(t *testing.T) {
	eachMode(t, func(t *testing.T, e *liveEnv, mode Mode) {
		var rec string
		require.NoError(t, e.db.QueryRow(`INSERT INTO items (n, doc) VALUES (7, '{"a":{"b":1,"c":2}}') RETURNING id::text`).Scan(&rec))
		_, err := e.db.Exec(`UPDATE items SET doc = '{"a":{"b":1,"c":3}}' WHERE id = $1::uuid`, rec)
		require.NoError(t, err)
		_, err = e.db.Exec(`DELETE FROM items WHERE id = $1::uuid`, rec)
		require.NoError(t, err)
		ids := e.idsInOrder()
		require.Len(t, ids, 3)

		type obj = map[string]any
		inner := func(c float64) obj { return obj{"a": obj{"b": 1.0, "c": c}} }
		row := func(c float64) obj { return obj{"id": rec, "n": 7.0, "doc": inner(c)} }
		unwrapped := func(c float64) obj { d := inner(c); d["id"] = rec; return d }
		for _, tc := range []struct {
			field                  string
			insert, update, before obj
			updatedFields          obj
		}{
			{"", row(2), row(3), row(3), obj{"doc.a.c": 3.0}},
			{"doc", unwrapped(2), unwrapped(3), unwrapped(3), obj{"a.c": 3.0}},
		} {
			cfg := e.fromBeginning(mode)
			cfg.ClientName, cfg.DocumentField = "field-"+tc.field, tc.field
			w := e.start(cfg)
			evs := make([]Event, 0, 3)
			for i := range 3 {
				select {
				case ev := <-w.Events():
					require.Equal(t, tok(ids[i]), ev.ResumeToken)
					evs = append(evs, ev.Event)
				case <-time.After(liveWait):
					t.Fatalf("no event %d", i)
				}
			}
			for i, ev := range evs {
				ts, ok := ev["clusterTime"].(time.Time)
				require.True(t, ok, "clusterTime is a time.Time")
				require.Equal(t, e.position(ids[i]), position.Make(ts, ids[i]), "clusterTime is changed_at")
			}
			base := func(op string, doc any) Event {
				return Event{"_id": obj{"_data": string(tok(ids[0]))}, "operationType": op, "clusterTime": evs[0]["clusterTime"],
					"fullDocument": doc, "documentKey": obj{"_id": rec}, "ns": obj{"coll": liveTable}}
			}
			require.Equal(t, base("insert", tc.insert), evs[0], "field %q", tc.field)

			want := base("update", tc.update)
			want["_id"], want["clusterTime"] = obj{"_data": string(tok(ids[1]))}, evs[1]["clusterTime"]
			want["updateDescription"] = obj{"updatedFields": tc.updatedFields}
			require.Equal(t, want, evs[1], "field %q", tc.field)

			want = base("delete", nil)
			want["_id"], want["clusterTime"] = obj{"_data": string(tok(ids[2]))}, evs[2]["clusterTime"]
			want["fullDocumentBeforeChange"] = tc.before
			require.Equal(t, want, evs[2], "field %q", tc.field)

			doc := evs[0]["fullDocument"].(map[string]any)
			if tc.field == "" {
				doc = doc["doc"].(map[string]any)
			}
			require.IsType(t, map[string]any{}, doc["a"], "nested values are map[string]any")
		}
	})
}

// TestLiveDropInConstructorSetsTheProcessedFlag proves that the drop-in constructor keeps
// setting the legacy processed flag, which cleanup_changelog(days) reads, while New's defaults
// leave it false.
func TestLiveDropInConstructorSetsTheProcessedFlag(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLive(t)
	old := NewPostgreSQLChangeStreamWatcher(e.db, "old", liveTable, "", ModePolling)
	old.Start(ctx)
	t.Cleanup(func() { _ = old.Close(ctx) })
	cfg := e.config(ModePolling)
	cfg.ClientName = "new"
	w := e.start(cfg)
	waitStartSaved(t, old)
	waitStartSaved(t, w)
	ids := e.insert(3)
	require.Equal(t, ids, receiveWithin(t, w, 3, liveWait))
	require.NoError(t, w.MarkProcessed(ctx, tok(ids[2])))
	require.NoError(t, w.Flush(ctx))
	require.NoError(t, w.markPass(ctx)) // what its marker would run after the save
	for _, id := range ids {
		require.False(t, e.processed(id), "New's defaults never set the flag (row %d)", id)
	}
	require.Equal(t, ids, receiveWithin(t, old, 3, liveWait))
	require.NoError(t, old.MarkProcessed(ctx, tok(ids[1])))
	e.waitProcessed(ids[1])
	require.True(t, e.processed(ids[0]))
	require.False(t, e.processed(ids[2]), "the flag never leads the saved token")
}

// TestLiveUnprocessedEventCount proves rule 12 through GetUnprocessedEventCount: with
// ProcessedFlag, saves set the legacy processed flag up to the saved position; with New's
// defaults, or DisableProcessedFlag, the flag stays false and the count is of every row after
// the id.
func TestLiveUnprocessedEventCount(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		flag, disable bool
	}{{"ProcessedFlag", true, false}, {"defaults", false, false}, {"DisableProcessedFlag", false, true}} {
		disabled := !tc.flag
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newLive(t)
			ids := e.insert(5)
			cfg := e.fromBeginning(ModePolling)
			cfg.ProcessedFlag, cfg.DisableProcessedFlag = tc.flag, tc.disable
			w := e.start(cfg)
			require.Equal(t, ids, receiveWithin(t, w, 5, liveWait))
			count := func(after string) int64 {
				t.Helper()
				n, err := w.GetUnprocessedEventCount(ctx, after)
				require.NoError(t, err)
				return n
			}
			require.Equal(t, int64(5), count("0"))

			require.NoError(t, w.MarkProcessed(ctx, tok(ids[2])))
			require.Equal(t, e.position(ids[3]).Predecessor(), e.savedToken("c"))
			want := []int64{2, 1, 0}
			if disabled {
				want = []int64{5, 1, 0}
			}
			if !disabled {
				e.waitProcessed(ids[2])
			}
			require.Equal(t, want[0], count("0"))
			require.Equal(t, want[1], count(string(tok(ids[3]))))
			require.Equal(t, want[2], count(""), "after the cursor")
			for i, id := range ids {
				require.Equal(t, !disabled && i <= 2, e.processed(id), "row %d", i)
			}

			require.NoError(t, w.MarkProcessed(ctx, tok(ids[4])))
			require.Equal(t, e.position(ids[4]), e.savedToken("c"))
			if disabled {
				require.Equal(t, int64(5), count("0"))
				var n int
				require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog WHERE processed`).Scan(&n))
				require.Zero(t, n, "the processed flag stays false")
			} else {
				e.waitProcessed(ids[4])
				require.Zero(t, count("0"))
			}

			_, err := w.GetUnprocessedEventCount(ctx, "x")
			require.ErrorIs(t, err, ErrInvalidToken)
		})
	}
}
