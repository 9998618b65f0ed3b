package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// readLimitClient is the client name of watcherRead.
const readLimitClient = "read-limit"

// watcherRead reads the n changelog rows of the items table, written after the start position
// watcherReadFresh saved, with a watcher whose Filter drops every event: the watcher's own
// batched read query (BatchSize rows after the cursor, the next read started while the current
// batch is decoded) and its own event building, with nothing delivered or acknowledged and no
// processed flag set; the filtered progress is saved at most once per batched checkpoint
// interval, one token upsert. It returns the time from Start until the filter saw the n-th
// event: the ceiling of the read side of a drain, measured with the library's own reads rather
// than a query of its own. The saved token is checked for the form of the schema's reads.
func watcherRead(ctx context.Context, d *database, n int, shape backlogShape) (time.Duration, error) {
	var seen atomic.Int64
	done := make(chan struct{})
	cfg := d.drainConfig(readLimitClient, drainSpec{checkpointInterval: batchedInterval, disableProcessedFlag: true, shape: shape})
	cfg.Filter = func(pgchangestream.Event) bool {
		if seen.Add(1) == int64(n) {
			close(done)
		}
		return false
	}
	w, err := pgchangestream.New(cfg)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	defer func() { _ = w.Close(context.WithoutCancel(ctx)) }()
	start := time.Now()
	w.Start(ctx)
	select {
	case <-done:
	case <-ctx.Done():
		return 0, fmt.Errorf("watcher read %d of %d rows: %w (%v)", seen.Load(), n, ctx.Err(), w.Err())
	}
	elapsed := time.Since(start)
	if err := w.Close(ctx); err != nil { // saves the filtered progress
		return 0, err
	}
	return elapsed, d.checkTokenForm(ctx, cfg.ClientName)
}

// watcherReadFresh saves the start position of watcherRead's client on a fresh database of the
// variant, fills it with n rows of the shape and reads them with watcherRead.
func watcherReadFresh(ctx context.Context, e *env, v variant, n int, shape backlogShape) (time.Duration, error) {
	d, err := e.newDatabase(ctx, v)
	if err != nil {
		return 0, err
	}
	defer d.drop(ctx)
	spec := drainSpec{shape: shape}
	if err := d.saveStart(ctx, d.drainConfig(readLimitClient, spec)); err != nil {
		return 0, err
	}
	if err := d.fill(ctx, n, spec); err != nil {
		return 0, err
	}
	return watcherRead(ctx, d, n, shape)
}

// selectDecode reads the n changelog rows of the items table with one query and decodes each
// into an event document the way the watcher does (JSON unmarshal of new_values into a map,
// the event's own maps around it). It returns the elapsed time. No watcher, no
// acknowledgement: the read side's ceiling.
func selectDecode(ctx context.Context, d *database, n int) (time.Duration, error) {
	start := time.Now()
	rows, err := d.QueryContext(ctx, `SELECT id, record_id::text, operation, old_values::text,
		new_values::text, changed_at FROM `+changelogTable+`
		WHERE table_name = $1 ORDER BY changed_at, id`, itemsTable)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var got int
	for rows.Next() {
		var (
			id               int64
			recordID, op     string
			oldVals, newVals sql.RawBytes
			changedAt        time.Time
			doc              map[string]any
		)
		if err := rows.Scan(&id, &recordID, &op, &oldVals, &newVals, &changedAt); err != nil {
			return 0, err
		}
		if err := json.Unmarshal(newVals, &doc); err != nil {
			return 0, fmt.Errorf("row %d: %w", id, err)
		}
		ev := map[string]any{
			"_id":           map[string]any{"_data": strconv.FormatInt(id, 10)},
			"operationType": "insert",
			"clusterTime":   changedAt,
			"fullDocument":  doc,
			"documentKey":   map[string]any{"_id": recordID},
			"ns":            map[string]any{"coll": itemsTable},
		}
		sink = ev
		got++
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	elapsed := time.Since(start)
	if got != n {
		return 0, fmt.Errorf("select read %d rows, want %d", got, n)
	}
	return elapsed, nil
}

// sink keeps decoded documents reachable, so the decoding cannot be optimized away. It is
// written by one goroutine at a time.
var sink map[string]any

// selectDecodeFresh fills a fresh database with n rows and reads them back.
func selectDecodeFresh(ctx context.Context, e *env, n int) (time.Duration, error) {
	d, err := e.newDatabase(ctx, upgraded)
	if err != nil {
		return 0, err
	}
	defer d.drop(ctx)
	if err := d.fillItems(ctx, n); err != nil {
		return 0, err
	}
	return selectDecode(ctx, d, n)
}

// upserts runs n token upserts of one client, each its own transaction (autocommit), and
// returns the elapsed time: the ceiling of a consumer that persists every acknowledgement.
func upserts(ctx context.Context, e *env, n int) (time.Duration, error) {
	d, err := e.newDatabase(ctx, upgraded)
	if err != nil {
		return 0, err
	}
	defer d.drop(ctx)
	base := time.Now().UTC()
	token := func(i int) string {
		ts := base.Add(time.Duration(i) * time.Microsecond).Format(time.RFC3339Nano)
		return `{"timestamp":"` + ts + `","eventID":` + strconv.Itoa(i) + `}`
	}
	// The first upsert inserts; the timed ones update, as every save after a client's first.
	if _, err := d.ExecContext(ctx, upsertSQL, "bench", token(0)); err != nil {
		return 0, err
	}
	start := time.Now()
	for i := 1; i <= n; i++ {
		if _, err := d.ExecContext(ctx, upsertSQL, "bench", token(i)); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}
