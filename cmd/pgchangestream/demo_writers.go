package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// demoTable is the table the demo writes and watches, named so that it cannot be a table of the
// database's own.
const demoTable = "pgchangestream_demo_orders"

// demoTableSQL creates the demo table. Its uuid ids become the changelog's record_id.
const demoTableSQL = `CREATE TABLE IF NOT EXISTS ` + demoTable + ` (
	id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
	customer   text NOT NULL,
	item       text NOT NULL,
	quantity   int NOT NULL,
	status     text NOT NULL DEFAULT 'new',
	created_at timestamptz NOT NULL DEFAULT now()
)`

var (
	demoCustomers = []string{"ada", "brian", "chen", "dana", "emeka", "fatima", "gosia", "hiro"}
	demoItems     = []string{"keyboard", "monitor", "cable", "dock", "headset", "webcam", "lamp", "chair"}
	demoStatuses  = []string{"paid", "packed", "shipped", "delivered"}
)

// demoWriters runs concurrent writers on the demo table. Every statement changes one row, so
// every successful statement is one changelog row. Each statement is its own transaction.
type demoWriters struct {
	db       *sql.DB
	n        int
	interval time.Duration // between two statements of one writer
	seed     uint64

	inserts, updates, deletes atomic.Uint64
}

// newDemoWriters spreads rate (statements per second, all writers together) over n writers.
func newDemoWriters(db *sql.DB, n int, rate float64, seed uint64) *demoWriters {
	return &demoWriters{db: db, n: n, seed: seed,
		interval: time.Duration(float64(n) / rate * float64(time.Second))}
}

// written returns the number of successful statements so far.
func (d *demoWriters) written() uint64 {
	return d.inserts.Load() + d.updates.Load() + d.deletes.Load()
}

// run writes until stop is closed, then returns after every writer's last statement finished.
// It stops early, without an error, when ctx ends.
func (d *demoWriters) run(ctx context.Context, stop <-chan struct{}) error {
	errs := make(chan error, d.n)
	var wg sync.WaitGroup
	for i := range d.n {
		wg.Go(func() {
			if err := d.write(ctx, stop, &writer{rng: rand.New(rand.NewPCG(d.seed, uint64(i)+1))}); err != nil {
				errs <- fmt.Errorf("writer %d: %w", i+1, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when no writer failed
}

// write is one writer: at every interval it inserts an order, or updates or deletes one of its
// own (see statement).
func (d *demoWriters) write(ctx context.Context, stop <-chan struct{}, w *writer) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	next := time.Now() // when the next statement is due; a writer that falls behind catches up
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-stop:
			return nil
		case <-timer.C:
		}
		next = next.Add(d.interval)
		if behind := time.Since(next); behind > time.Second {
			next = time.Now() // do not burst after a long stall
		}
		timer.Reset(time.Until(next))
		if err := d.statement(ctx, w); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// writer is the state of one writer.
type writer struct {
	rng  *rand.Rand
	live []string // ids of the writer's orders that still exist
}

// statement inserts an order, or updates or deletes one of w's own, as one transaction.
func (d *demoWriters) statement(ctx context.Context, w *writer) error {
	rng := w.rng
	var err error
	switch r := rng.Float64(); {
	case len(w.live) > 0 && r < 0.2:
		_, err = d.db.ExecContext(ctx, `UPDATE `+demoTable+` SET status = $2, quantity = quantity + 1 WHERE id = $1`,
			w.live[rng.IntN(len(w.live))], demoStatuses[rng.IntN(len(demoStatuses))])
		if err == nil {
			d.updates.Add(1)
		}
	case len(w.live) > 0 && r < 0.3:
		i := rng.IntN(len(w.live))
		_, err = d.db.ExecContext(ctx, `DELETE FROM `+demoTable+` WHERE id = $1`, w.live[i])
		if err == nil {
			w.live[i] = w.live[len(w.live)-1]
			w.live = w.live[:len(w.live)-1]
			d.deletes.Add(1)
		}
	default:
		var id string
		err = d.db.QueryRowContext(ctx, `INSERT INTO `+demoTable+` (customer, item, quantity) VALUES ($1, $2, $3) RETURNING id`,
			demoCustomers[rng.IntN(len(demoCustomers))], demoItems[rng.IntN(len(demoItems))], 1+rng.IntN(5)).Scan(&id)
		if err == nil {
			w.live = append(w.live, id)
			d.inserts.Add(1)
		}
	}
	return err
}

// progressLine shows progress: on a terminal one line rewritten in place, otherwise one line
// per update.
type progressLine struct {
	w      io.Writer
	tty    bool
	active bool // a progress line is on screen without its newline
}

// update shows line as the current progress.
func (p *progressLine) update(line string) {
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.active = true
		return
	}
	fmt.Fprintln(p.w, line)
}

// println prints a permanent line, clearing the progress line first on a terminal.
func (p *progressLine) println(line string) {
	if p.active {
		fmt.Fprint(p.w, "\r\033[K")
		p.active = false
	}
	fmt.Fprintln(p.w, line)
}
