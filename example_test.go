package pgchangestream_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"os/signal"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/schema"
)

// This is the quick start of the README: stream the changes of the orders table and acknowledge
// each event once it is handled.
func Example() {
	ctx := context.Background()
	dsn := "postgres://app@localhost:5432/shop"

	db, err := sql.Open("pgx", dsn) // import _ "github.com/jackc/pgx/v5/stdlib"
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	// Once per database: the changelog, the token table and the trigger on orders.
	if _, err := schema.Install(ctx, db, schema.Options{}); err != nil {
		log.Fatal(err)
	}
	if _, err := schema.Capture(ctx, db, "orders", schema.Options{}); err != nil {
		log.Fatal(err)
	}

	w, err := pgchangestream.New(pgchangestream.Config{
		DB:         db,
		ConnString: dsn, // LISTEN/NOTIFY for low latency; polling stays as a fallback
		ClientName: "billing",
		TableName:  "orders",
	})
	if err != nil {
		log.Fatal(err)
	}
	w.Start(ctx)
	defer w.Close(context.Background())

	for ev := range w.Events() {
		fmt.Println(ev.Event["operationType"], ev.Event["documentKey"])
		// Acknowledge after the work is done: the saved token never passes an event that was
		// not acknowledged, so a crash replays it.
		if err := w.MarkProcessed(ctx, ev.ResumeToken); err != nil {
			log.Printf("saving the checkpoint failed, the next acknowledgement retries: %v", err)
		}
	}
	if err := w.Err(); err != nil {
		log.Fatal(err)
	}
}

// Process handles health events in parallel: eight at a time, one at a time per node, at most
// 2,000 taken and unfinished, and an event that still fails after its retries is parked in the
// dead-letter table (see admin.ListParked and admin.RetryParked) instead of stopping the
// consumer. It acknowledges by itself.
func ExampleWatcher_Process() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	db, err := sql.Open("pgx", "postgres://app@localhost:5432/platform")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	w, err := pgchangestream.New(pgchangestream.Config{DB: db, ClientName: "remediation", TableName: "health_events"})
	if err != nil {
		log.Fatal(err)
	}
	w.Start(ctx)
	defer w.Close(context.Background())

	err = w.Process(ctx, pgchangestream.ProcessOptions{
		Workers:     8,
		Key:         pgchangestream.NodeNameKey, // one node's events in order
		MaxInFlight: 2000,
		OnFailure:   pgchangestream.ParkOnFailure,
	}, func(ctx context.Context, ev pgchangestream.EventWithToken) error {
		node, err := ev.GetNodeName()
		if err != nil {
			return err
		}
		log.Printf("remediating %s", node) // return nil when done; an error is retried
		return nil
	})
	if err != nil { // nil when ctx ended and the final save succeeded
		log.Fatal(err)
	}
}
