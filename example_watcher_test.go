package pgchangestream_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// openDB opens the database of the examples.
func openDB() *sql.DB {
	db, err := sql.Open("pgx", "postgres://app@localhost:5432/platform")
	if err != nil {
		log.Fatal(err)
	}
	return db
}

// NewPostgreSQLChangeStreamWatcher is the drop-in constructor of the store-client provider: the
// same arguments, tables, token JSON and event documents. It returns no error: invalid
// arguments are reported by Err, and the Events channel closes at Start.
func ExampleNewPostgreSQLChangeStreamWatcher() {
	ctx := context.Background()
	db := openDB()
	defer db.Close()

	w := pgchangestream.NewPostgreSQLChangeStreamWatcher(db, "fault-quarantine", "health_events",
		"postgres://app@localhost:5432/platform", pgchangestream.ModeHybrid)
	w.Start(ctx)
	defer w.Close(context.Background())
	for ev := range w.Events() {
		node, _ := ev.GetNodeName()
		log.Printf("%s on %s", ev.Event["operationType"], node)
		if err := w.MarkProcessed(ctx, ev.ResumeToken); err != nil {
			log.Print(err)
		}
	}
	if err := w.Err(); err != nil {
		log.Fatal(err)
	}
}

// Exclusive runs one active watcher per client and keeps the others as standbys: run the same
// code in every replica. A standby takes over from the saved token within seconds of the active
// one stopping; an earlier owner that wakes up later cannot save over it.
func ExampleNew_exclusive() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	db := openDB()
	defer db.Close()

	w, err := pgchangestream.New(pgchangestream.Config{
		DB: db, ConnString: "postgres://app@localhost:5432/platform",
		ClientName: "node-drainer", TableName: "health_events",
		Exclusive: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	w.Start(ctx)
	defer w.Close(context.Background())
	err = w.Process(ctx, pgchangestream.ProcessOptions{Workers: 4, Key: pgchangestream.NodeNameKey},
		func(ctx context.Context, ev pgchangestream.EventWithToken) error {
			return nil // drain the node
		})
	if errors.Is(err, pgchangestream.ErrExclusiveLost) {
		log.Fatal("lost the lock; restart to wait as a standby again")
	}
}

// Shared divides one client's events between any number of members: each row goes to one
// member, one key's rows to one member at a time, in order. Members join and leave at will.
func ExampleNew_shared() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	db := openDB()
	defer db.Close()

	w, err := pgchangestream.New(pgchangestream.Config{
		DB: db, ClientName: "health-events-analyzer", TableName: "health_events",
		Shared: true, MemberName: os.Getenv("HOSTNAME"),
	})
	if err != nil {
		log.Fatal(err)
	}
	w.Start(ctx)
	defer w.Close(context.Background())
	_ = w.Process(ctx, pgchangestream.ProcessOptions{Workers: 8, Key: pgchangestream.NodeNameKey},
		func(ctx context.Context, ev pgchangestream.EventWithToken) error {
			return nil // analyze the event
		})
	fmt.Println(w.Stats().Shared)
}

// ProcessTx runs each handler in a transaction that also claims the event: the handler's
// writes and the acknowledgement commit together, so each event's effects are applied exactly
// once, across crashes and restarts.
func ExampleWatcher_ProcessTx() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	db := openDB()
	defer db.Close()

	w, err := pgchangestream.New(pgchangestream.Config{DB: db, ClientName: "event-exporter", TableName: "health_events"})
	if err != nil {
		log.Fatal(err)
	}
	w.Start(ctx)
	defer w.Close(context.Background())
	err = w.ProcessTx(ctx, pgchangestream.ProcessOptions{Workers: 4},
		func(ctx context.Context, tx *sql.Tx, ev pgchangestream.EventWithToken) error {
			node, err := ev.GetNodeName()
			if err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, `UPDATE node_counts SET events = events + 1 WHERE node = $1`, node)
			return err
		})
	if err != nil {
		log.Fatal(err)
	}
}

// MarkProcessedTx acknowledges an event in the caller's transaction, for a consumer that reads
// Events itself: the effect and the acknowledgement are kept or lost together.
func ExampleWatcher_MarkProcessedTx() {
	ctx := context.Background()
	db := openDB()
	defer db.Close()

	w, err := pgchangestream.New(pgchangestream.Config{DB: db, ClientName: "billing", TableName: "orders"})
	if err != nil {
		log.Fatal(err)
	}
	w.Start(ctx)
	defer w.Close(context.Background())
	for ev := range w.Events() {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			log.Fatal(err)
		}
		id, _ := ev.GetDocumentID()
		if _, err := tx.ExecContext(ctx, `INSERT INTO invoices (order_id) VALUES ($1)`, id); err != nil {
			_ = tx.Rollback()
			log.Fatal(err)
		}
		if err := w.MarkProcessedTx(ctx, tx, ev.ResumeToken); err != nil {
			_ = tx.Rollback() // not acknowledged: the event comes again after a restart
			log.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			log.Fatal(err)
		}
	}
}

// Health and Ready back a Kubernetes readiness probe: not ready until the first read returned,
// unhealthy while an operation keeps failing (with what fails and for how long).
func ExampleWatcher_Health() {
	db := openDB()
	w, err := pgchangestream.New(pgchangestream.Config{DB: db, ClientName: "fault-remediation", TableName: "health_events"})
	if err != nil {
		log.Fatal(err)
	}
	w.Start(context.Background())
	http.HandleFunc("/readyz", func(rw http.ResponseWriter, r *http.Request) {
		select {
		case <-w.Ready():
		default:
			http.Error(rw, "loading the saved token", http.StatusServiceUnavailable)
			return
		}
		if err := w.Health(); err != nil {
			http.Error(rw, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(rw, "ok, lag %s\n", w.Stats().Lag)
	})
	log.Fatal(http.ListenAndServe(":8080", nil))
}

// With CheckpointInterval, acknowledgements are kept in memory and saved in the background;
// Flush saves at once, for example before a planned hand-over.
func ExampleWatcher_Flush() {
	ctx := context.Background()
	db := openDB()
	defer db.Close()
	w, err := pgchangestream.New(pgchangestream.Config{DB: db, ClientName: "audit", TableName: "orders",
		CheckpointInterval: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	w.Start(ctx)
	for ev := range w.Events() {
		_ = w.MarkProcessed(ctx, ev.ResumeToken) // in memory: returns at once
		if w.Stats().Pending == 0 {
			if err := w.Flush(ctx); err != nil {
				log.Print(err)
			}
		}
	}
	if err := w.Close(ctx); err != nil { // Close saves what was acknowledged
		log.Fatal(err)
	}
}

// MatchFilter compiles the $match pipelines the store-client services pass to their watchers
// into a Config.Filter.
func ExampleMatchFilter() {
	filter, err := pgchangestream.MatchFilter([]map[string]any{
		{"$match": map[string]any{
			"operationType":                    map[string]any{"$in": []any{"insert", "update"}},
			"fullDocument.healthevent.isfatal": true,
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fatal := pgchangestream.Event{"operationType": "insert",
		"fullDocument": map[string]any{"healthevent": map[string]any{"isfatal": true}}}
	deleted := pgchangestream.Event{"operationType": "delete"}
	fmt.Println(filter(fatal), filter(deleted))
	// Output: true false
}

// Document decodes an event's fullDocument into a typed value.
func ExampleDocument() {
	type healthEvent struct {
		NodeName string `json:"nodename"`
		IsFatal  bool   `json:"isfatal"`
	}
	type row struct {
		HealthEvent healthEvent `json:"healthevent"`
	}
	ev := pgchangestream.EventWithToken{ResumeToken: []byte("452"), Event: pgchangestream.Event{
		"operationType": "insert",
		"fullDocument":  map[string]any{"healthevent": map[string]any{"nodename": "gpu-node-7", "isfatal": true}},
	}}
	doc, err := pgchangestream.Document[row](ev)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(doc.HealthEvent.NodeName, doc.HealthEvent.IsFatal)
	// Output: gpu-node-7 true
}
