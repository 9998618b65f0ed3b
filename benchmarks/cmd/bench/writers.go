package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// hybridWriters is the number of writers of the hybrid latency runs compared across schema
// variants, and of the insert-throughput figure.
const hybridWriters = 4

// latencySpec is one latency run.
type latencySpec struct {
	key     string // key in latency_ms
	mode    pgchangestream.Mode
	writers int
	variant variant
	// longTx keeps a transaction with a transaction id open in another database of the
	// cluster for the whole run.
	longTx bool
}

// latencySpecs lists the latency runs, in order: hybrid and polling with latencyWriters
// writers, then, on each of the variants, hybrid with hybridWriters writers without and with
// a long transaction open elsewhere.
func latencySpecs(vs []variant) []latencySpec {
	specs := []latencySpec{
		{key: "hybrid", mode: pgchangestream.ModeHybrid, writers: latencyWriters, variant: upgraded},
		{key: "polling", mode: pgchangestream.ModePolling, writers: latencyWriters, variant: upgraded},
	}
	for _, v := range vs {
		specs = append(specs,
			latencySpec{key: v.key("hybrid_4w"), mode: pgchangestream.ModeHybrid, writers: hybridWriters, variant: v},
			latencySpec{key: v.key("hybrid_4w_longtx"), mode: pgchangestream.ModeHybrid, writers: hybridWriters,
				variant: v, longTx: true})
	}
	return specs
}

// openLongTx opens a transaction in a fresh database of the cluster and gives it a
// transaction id, so that it stays in every snapshot taken until end is called: what a
// forgotten session of another application does to the cluster.
func openLongTx(ctx context.Context, e *env) (end func(), err error) {
	other, err := e.newDatabase(ctx, upgraded)
	if err != nil {
		return nil, err
	}
	tx, err := other.BeginTx(ctx, nil)
	if err == nil {
		_, err = tx.ExecContext(ctx, `SELECT pg_current_xact_id()`)
		if err != nil {
			_ = tx.Rollback()
		}
	}
	if err != nil {
		other.drop(ctx)
		return nil, fmt.Errorf("open a long transaction: %w", err)
	}
	return func() {
		_ = tx.Rollback()
		other.drop(context.WithoutCancel(ctx))
	}, nil
}

// insertThroughput inserts n rows into the captured table of a fresh database of the variant
// with hybridWriters connections as fast as they go, one autocommit INSERT through the
// trigger each, and returns the elapsed time: the writers' cost of the changelog schema.
func insertThroughput(ctx context.Context, e *env, v variant, n int) (time.Duration, error) {
	d, err := e.newDatabase(ctx, v)
	if err != nil {
		return 0, err
	}
	defer d.drop(ctx)
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		ferr    error
	)
	start := time.Now()
	for range hybridWriters {
		wg.Go(func() {
			for k := next.Add(1); k <= int64(n); k = next.Add(1) {
				if _, err := d.ExecContext(ctx, `INSERT INTO `+itemsTable+` (n, doc)
					SELECT g, `+docSQL+` FROM (SELECT $1::bigint AS g) s`, k); err != nil {
					errOnce.Do(func() { ferr = fmt.Errorf("insert: %w", err) })
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), ferr
}
