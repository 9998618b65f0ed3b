package storeclient_test

import (
	"context"
	"database/sql"
	"fmt"
	"go/format"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/pgchangestream/pgchangestream/internal/storeclient/datastore"
)

func TestMain(m *testing.M) {
	code := pgtest.RunMain(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left after the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestMigratingGuideShowsThisAdapter keeps docs/migrating.md and adapter_test.go the same file,
// up to the package name and the import paths (and so the order) of the store-client packages.
func TestMigratingGuideShowsThisAdapter(t *testing.T) {
	guide, err := os.ReadFile("../../docs/migrating.md")
	require.NoError(t, err)
	blocks := regexp.MustCompile("(?s)```go\n(package pgadapter\n.*?)```").FindSubmatch(guide)
	require.NotNil(t, blocks, "docs/migrating.md has a go block starting with package pgadapter")
	source, err := os.ReadFile("adapter_test.go")
	require.NoError(t, err)
	// Formatting sorts the imports, whose order the new paths change.
	want, err := format.Source([]byte(strings.NewReplacer(
		"package storeclient_test", "package pgadapter",
		"github.com/pgchangestream/pgchangestream/internal/storeclient/", "github.com/nvidia/nvsentinel/store-client/pkg/",
	).Replace(string(source))))
	require.NoError(t, err)
	require.Equal(t, string(want), string(blocks[1]))
}

// healthEventsDB returns a database with the schema, a captured health_events table shaped like
// the store-client one, and its DSN.
func healthEventsDB(t *testing.T) (*sql.DB, string) {
	t.Helper()
	ctx := t.Context()
	db, dsn := pgtest.NewDatabase(t, "")
	require.NoError(t, pgchangestream.InstallSchema(ctx, db, pgchangestream.SchemaOptions{}))
	_, err := db.ExecContext(ctx, `CREATE TABLE health_events (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
		document jsonb NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	require.NoError(t, pgchangestream.CaptureChanges(ctx, db, "health_events", pgchangestream.SchemaOptions{}))
	return db, dsn
}

func insertHealthEvent(t *testing.T, db *sql.DB, doc string) (id string, createdAt time.Time) {
	t.Helper()
	require.NoError(t, db.QueryRowContext(t.Context(),
		`INSERT INTO health_events (document) VALUES ($1) RETURNING id::text, created_at`, doc).Scan(&id, &createdAt))
	return id, createdAt
}

// waitStarted waits for the watcher's first read, so that rows inserted afterwards are new to it.
func waitStarted(t *testing.T, w *pgchangestream.Watcher) {
	t.Helper()
	require.Eventually(t, func() bool { empty, _ := w.LagState(); return !empty.IsZero() }, 30*time.Second, 5*time.Millisecond)
}

func next[T any](t *testing.T, events <-chan T) T {
	t.Helper()
	select {
	case ev, ok := <-events:
		require.True(t, ok, "events closed")
		return ev
	case <-time.After(30 * time.Second):
		t.Fatal("no event")
	}
	panic("unreachable")
}

func TestClientWatcherOnHealthEvents(t *testing.T) {
	db, dsn := healthEventsDB(t)
	w := NewClientWatcher(pgchangestream.NewPostgreSQLChangeStreamWatcher(db, "svc", "health_events", dsn, pgchangestream.ModeHybrid))
	w.Start(context.Background())
	defer func() { require.NoError(t, w.Close(context.Background())) }()
	waitStarted(t, w.Watcher)

	id, createdAt := insertHealthEvent(t, db,
		`{"healthevent":{"nodename":"n1","isfatal":true},"healtheventstatus":{"nodequarantined":null}}`)
	ev := next(t, w.Events())
	rec, err := ev.GetRecordUUID()
	require.NoError(t, err)
	require.Equal(t, id, rec)
	node, err := ev.GetNodeName()
	require.NoError(t, err)
	require.Equal(t, "n1", node)
	docID, err := ev.GetDocumentID()
	require.NoError(t, err)
	require.Equal(t, string(ev.GetResumeToken()), docID)
	var doc struct {
		ID          string    `json:"id"`
		CreatedAt   time.Time `json:"createdAt"`
		HealthEvent struct {
			IsFatal bool `json:"isfatal"`
		} `json:"healthevent"`
	}
	require.NoError(t, ev.UnmarshalDocument(&doc))
	require.Equal(t, id, doc.ID)
	require.True(t, doc.HealthEvent.IsFatal)
	require.True(t, createdAt.Equal(doc.CreatedAt), "createdAt %v, want the row's created_at %v", doc.CreatedAt, createdAt)
	require.NoError(t, w.MarkProcessed(t.Context(), ev.GetResumeToken()))

	_, err = db.ExecContext(t.Context(), `UPDATE health_events
		SET document = jsonb_set(document, '{healtheventstatus,nodequarantined}', '"Quarantined"') WHERE id = $1`, id)
	require.NoError(t, err)
	ev = next(t, w.Events())
	updated, ok := ev.(interface{ UpdatedFields() map[string]any })
	require.True(t, ok, "the event exposes UpdatedFields for client.EventUpdatesOnly")
	require.Equal(t, map[string]any{"healtheventstatus.nodequarantined": "Quarantined"}, updated.UpdatedFields())
	require.NoError(t, w.MarkProcessed(t.Context(), ev.GetResumeToken()))

	count, err := w.GetUnprocessedEventCount(t.Context(), "")
	require.NoError(t, err)
	require.Zero(t, count)
}

func TestDatastoreWatcherWithPipeline(t *testing.T) {
	db, _ := healthEventsDB(t)
	filter, err := MatchFilter(datastore.Pipeline{{{Key: "$match", Value: datastore.Document{
		{Key: "operationType", Value: "insert"},
		{Key: "$or", Value: datastore.Array{
			datastore.Document{{Key: "fullDocument.healthevent.isfatal", Value: true}},
			datastore.Document{{Key: "fullDocument.healthevent.agent", Value: map[string]any{"$in": []any{"a", "b"}}}},
		}},
	}}}})
	require.NoError(t, err)
	pw, err := pgchangestream.New(pgchangestream.Config{DB: db, ClientName: "svc", TableName: "health_events",
		Mode: pgchangestream.ModePolling, DocumentField: "document", Filter: filter})
	require.NoError(t, err)
	w := NewDatastoreWatcher(pw)
	w.Start(context.Background())
	waitStarted(t, pw)

	insertHealthEvent(t, db, `{"healthevent":{"nodename":"n1","agent":"c"}}`)
	id, _ := insertHealthEvent(t, db, `{"healthevent":{"nodename":"n2","agent":"b"}}`)
	ev := next(t, w.Events())
	require.Equal(t, "n2", ev.Event["fullDocument"].(map[string]any)["healthevent"].(map[string]any)["nodename"])
	require.Equal(t, id, ev.Event["fullDocument"].(map[string]any)["id"])
	require.NoError(t, w.MarkProcessed(t.Context(), ev.ResumeToken))

	insertHealthEvent(t, db, `{"healthevent":{"nodename":"n3","isfatal":true}}`)
	require.Eventually(t, func() bool { return pw.Stats().Delivered == 2 }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, w.Close(context.Background()), "closing with a delivery not read stops the relay")
	late := 0
	for range w.Events() { // closes; the relay may hand over the delivery it held
		late++
	}
	require.LessOrEqual(t, late, 1)
	require.Equal(t, uint64(1), pw.Stats().Filtered)
}
