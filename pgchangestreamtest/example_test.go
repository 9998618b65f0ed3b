package pgchangestreamtest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"sync"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/pgchangestreamtest"
)

// billing is the consumer under test: it counts orders that became paid, and acknowledges each
// event once it is handled.
type billing struct{ paid int }

// handle handles one event and acknowledges it.
func (b *billing) handle(ctx context.Context, w pgchangestream.ChangeStreamWatcher, ev pgchangestream.EventWithToken) error {
	if doc, ok := ev.Event["fullDocument"].(map[string]any); ok && ev.Event["operationType"] == "update" && doc["status"] == "paid" {
		b.paid++
	}
	return w.MarkProcessed(ctx, ev.ResumeToken)
}

// run handles events until the watcher stops.
func (b *billing) run(ctx context.Context, w pgchangestream.ChangeStreamWatcher) error {
	for ev := range w.Events() {
		if err := b.handle(ctx, w, ev); err != nil {
			return err
		}
	}
	return nil
}

// A consumer tested with the fake watcher: push changes, run the consumer until the fake has
// delivered them, then check what was acknowledged and saved.
func ExampleFakeWatcher() {
	ctx := context.Background()
	w := pgchangestreamtest.NewFakeWatcher(pgchangestream.Config{TableName: "orders"})
	w.Push(
		pgchangestreamtest.Insert("o1", map[string]any{"status": "new"}),
		pgchangestreamtest.Update("o1", map[string]any{"status": "new"}, map[string]any{"status": "paid"}),
		pgchangestreamtest.Delete("o1", map[string]any{"status": "paid"}),
	)
	w.Start(ctx)
	w.CloseWhenDelivered() // Events closes after the three changes, so run returns

	var b billing
	if err := b.run(ctx, w); err != nil {
		log.Fatal(err)
	}
	saved, _ := w.Saved()
	fmt.Println("paid:", b.paid)
	fmt.Println("acknowledged:", w.Acked())      // the deliveries the acknowledgements certified
	fmt.Println("saved after change:", saved.ID) // the checkpoint the watcher would have written
	// Output:
	// paid: 1
	// acknowledged: [1 2 3]
	// saved after change: 3
}

// exampleT stands in for the *testing.T a test passes to NewMock.
type exampleT struct{ cleanups []func() }

func (*exampleT) Helper()                           {}
func (*exampleT) Fatalf(format string, args ...any) { log.Fatalf(format, args...) }
func (t *exampleT) Cleanup(f func())                { t.cleanups = append(t.cleanups, f) }

// done runs the cleanups, as the end of a test does.
func (t *exampleT) done() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

// The same consumer, run by a real watcher on a sqlmock database: the expectations are built
// from the watcher's own statements.
func ExampleMock() {
	t := &exampleT{} // in a test, the *testing.T
	defer t.done()
	ctx := context.Background()

	m := pgchangestreamtest.NewMock(t, pgchangestream.Config{ClientName: "billing", TableName: "orders",
		Mode: pgchangestream.ModePolling})
	m.ExpectStart(pgchangestreamtest.Start{Newest: pgchangestream.Position{ID: 41}}) // a new client, legacy changelog
	m.ExpectRead(pgchangestreamtest.Update("o1", map[string]any{"status": "new"}, map[string]any{"status": "paid"}))
	m.ExpectSave(42) // the token certifies change 42 and nothing after it

	w, err := pgchangestream.New(m.Config())
	if err != nil {
		log.Fatal(err)
	}
	m.StartWatcher(ctx, w) // waits for w.Ready(), the first read

	var b billing
	if err := b.handle(ctx, w, <-w.Events()); err != nil {
		log.Fatal(err)
	}
	if err := w.Close(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("paid:", b.paid)
	fmt.Println("expectations met:", m.ExpectationsWereMet() == nil)
	// Output:
	// paid: 1
	// expectations met: true
}

// invoicing is a consumer that writes its effect and acknowledges the event in one transaction.
type invoicing struct{ db *sql.DB }

func (c invoicing) handle(ctx context.Context, w *pgchangestreamtest.FakeWatcher, ev pgchangestream.EventWithToken) error {
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // after Commit it does nothing
	key, _ := ev.Event["documentKey"].(map[string]any)
	if _, err := tx.ExecContext(ctx, "INSERT INTO invoices (order_id) VALUES ($1)", key["_id"]); err != nil {
		return err
	}
	if err := w.MarkProcessedTx(ctx, tx, ev.ResumeToken); err != nil {
		return err
	}
	return tx.Commit()
}

// A consumer acknowledging in its own transaction, on a sqlmock database: the test expects the
// commit, so it tells the fake the transaction committed.
func ExampleFakeWatcher_MarkProcessedTx() {
	ctx := context.Background()
	db, mock, err := sqlmock.New()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	w := pgchangestreamtest.NewFakeWatcher(pgchangestream.Config{TableName: "orders"})
	w.Push(pgchangestreamtest.Insert("o1", map[string]any{"total": 5}))
	w.Start(ctx)
	defer w.Close(ctx)

	mock.ExpectBegin()
	mock.ExpectExec("INSERT INTO invoices").WillReturnResult(sqlmock.NewResult(1, 1))
	mock.ExpectCommit()
	if err := (invoicing{db}).handle(ctx, w, <-w.Events()); err != nil {
		log.Fatal(err)
	}
	fmt.Println("acknowledged before the fake is told:", w.Acked())
	for _, tx := range w.OpenTxs() {
		w.Committed(tx)
	}
	saved, _ := w.Saved()
	fmt.Println("acknowledged:", w.Acked())
	fmt.Println("saved after change:", saved.ID)
	fmt.Println("expectations met:", mock.ExpectationsWereMet() == nil)
	// Output:
	// acknowledged before the fake is told: []
	// acknowledged: [1]
	// saved after change: 1
	// expectations met: true
}

// A consumer that handles events in parallel with Process, tested with the fake: events of one
// order run in order, a failing event is parked, and Process acknowledges the finished prefix.
func ExampleFakeWatcher_Process() {
	ctx := context.Background()
	w := pgchangestreamtest.NewFakeWatcher(pgchangestream.Config{ClientName: "billing", TableName: "orders"})
	w.Push(
		pgchangestreamtest.Insert("o1", map[string]any{"status": "new"}),
		pgchangestreamtest.Insert("o2", map[string]any{"status": "new"}),
		pgchangestreamtest.Update("o1", map[string]any{"status": "new"}, map[string]any{"status": "paid"}),
		pgchangestreamtest.Update("o2", map[string]any{"status": "new"}, map[string]any{"status": "void"}),
	)
	w.Start(ctx)
	w.CloseWhenDelivered() // Process returns once the events it took are handled

	var mu sync.Mutex
	handled := map[string][]string{} // tokens by order, in handling order
	err := w.Process(ctx, pgchangestream.ProcessOptions{Workers: 2, MaxAttempts: 1, OnFailure: pgchangestream.ParkOnFailure},
		func(_ context.Context, ev pgchangestream.EventWithToken) error {
			if doc, _ := ev.Event["fullDocument"].(map[string]any); doc["status"] == "void" {
				return errors.New("void orders are not billed")
			}
			mu.Lock()
			defer mu.Unlock()
			key := pgchangestream.DocumentKey(ev)
			handled[key] = append(handled[key], string(ev.ResumeToken))
			return nil
		})
	if err != nil {
		log.Fatal(err)
	}
	saved, _ := w.Saved()
	fmt.Println("o1:", handled["orders/o1"], "o2:", handled["orders/o2"])
	fmt.Println("acknowledged:", w.Acked())
	fmt.Println("saved after change:", saved.ID)
	for _, p := range w.Parked() {
		fmt.Printf("parked: change %d of %s: %s\n", p.ChangelogID, p.Key, p.Error)
	}
	// Output:
	// o1: [1 3] o2: [2]
	// acknowledged: [1 2 3 4]
	// saved after change: 4
	// parked: change 4 of orders/o2: void orders are not billed
}
