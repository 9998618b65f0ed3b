package storeclient_test

import (
	"context"
	"database/sql"
	"fmt"
	"go/format"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/pgchangestream/pgchangestream/internal/storeclient/client"
	"github.com/pgchangestream/pgchangestream/internal/storeclient/datastore"
	"github.com/pgchangestream/pgchangestream/internal/storeclient/watcher"
	"github.com/pgchangestream/pgchangestream/schema"
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
	_, err := schema.Install(ctx, db, schema.Options{})
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `CREATE TABLE health_events (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
		document jsonb NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	_, err = schema.Capture(ctx, db, "health_events", schema.Options{})
	require.NoError(t, err)
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

// pgStore stands for the store-client's PostgreSQL datastore (*postgresql.PostgreSQLDataStore),
// as datastore.NewDataStore returns it to the services: its accessor of the database client,
// and its own CreateChangeStreamWatcher, whose watcher has no Unwrap
// here (the services fail at start with such a watcher, as with a bare pgchangestream one).
type pgStore struct{ db *sql.DB }

func (s pgStore) MaintenanceEventStore() datastore.MaintenanceEventStore { return nil }
func (s pgStore) HealthEventStore() datastore.HealthEventStore           { return nil }
func (s pgStore) Ping(ctx context.Context) error                         { return s.db.PingContext(ctx) }
func (s pgStore) Close(context.Context) error                            { return nil }
func (s pgStore) Provider() datastore.DataStoreProvider                  { return datastore.ProviderPostgreSQL }
func (s pgStore) GetDatabaseClient() client.DatabaseClient               { return tokenClient(s) }

func (s pgStore) CreateChangeStreamWatcher(context.Context, string, any) (datastore.ChangeStreamWatcher, error) {
	return datastoreOnly{}, nil
}

// datastoreOnly is a watcher without Unwrap.
type datastoreOnly struct{ datastore.ChangeStreamWatcher }

// tokenClient deletes resume tokens as the store-client's PostgreSQL database client does.
type tokenClient struct{ db *sql.DB }

func (c tokenClient) DeleteResumeToken(ctx context.Context, cfg client.TokenConfig) error {
	_, err := c.db.ExecContext(ctx, `DELETE FROM resume_tokens WHERE client_name = $1`, cfg.ClientName)
	return err
}

// datastoreEnv sets the DATASTORE_* variables of the store-client's deployment to dsn.
func datastoreEnv(t *testing.T, dsn string) {
	t.Helper()
	pc, err := pgconn.ParseConfig(dsn)
	require.NoError(t, err)
	for key, value := range map[string]string{
		"DATASTORE_PROVIDER": "postgresql", "DATASTORE_HOST": pc.Host, "DATASTORE_PORT": fmt.Sprint(pc.Port),
		"DATASTORE_DATABASE": pc.Database, "DATASTORE_USERNAME": pc.User, "DATASTORE_PASSWORD": pc.Password,
		"DATASTORE_SSLMODE": "disable",
	} {
		t.Setenv(key, value)
	}
}

// serviceWatcher gets a change stream watcher from ds as node-drainer's initializer does
// (fault-quarantine's and the health-events-analyzer's reconcilers do the same without the
// resume-control decision): it type-asserts GetDatabaseClient and CreateChangeStreamWatcher on
// the datastore, then ResumeControlDecision and Unwrap on the watcher.
func serviceWatcher(ctx context.Context, ds datastore.DataStore, clientName string, pipeline any) (
	client.ChangeStreamWatcher, client.ResumeControlDecision, error) {
	adapter, ok := ds.(interface {
		GetDatabaseClient() client.DatabaseClient
		CreateChangeStreamWatcher(ctx context.Context, clientName string, pipeline interface{}) (datastore.ChangeStreamWatcher, error)
	})
	if !ok {
		return nil, client.ResumeControlDecision{}, fmt.Errorf("datastore does not support required operations")
	}
	_ = adapter.GetDatabaseClient()
	w, err := adapter.CreateChangeStreamWatcher(ctx, clientName, pipeline)
	if err != nil {
		return nil, client.ResumeControlDecision{}, err
	}
	var decision client.ResumeControlDecision
	if p, ok := w.(interface {
		ResumeControlDecision() client.ResumeControlDecision
	}); ok {
		decision = p.ResumeControlDecision()
	}
	unwrapable, ok := w.(interface {
		Unwrap() client.ChangeStreamWatcher
	})
	if !ok {
		return nil, decision, fmt.Errorf("watcher does not support unwrapping to client.ChangeStreamWatcher")
	}
	return unwrapable.Unwrap(), decision, nil
}

// processableInserts is the data of the store-client's PostgreSQL
// BuildProcessableHealthEventInsertsPipeline (fault-quarantine's): inserts whose processing
// strategy is EXECUTE_REMEDIATION (1) or unset.
func processableInserts() datastore.Pipeline {
	return datastore.Pipeline{{{Key: "$match", Value: datastore.Document{
		{Key: "operationType", Value: datastore.Document{{Key: "$in", Value: datastore.Array{"insert"}}}},
		{Key: "$or", Value: datastore.Array{
			datastore.Document{{Key: "fullDocument.healthevent.processingstrategy", Value: int32(1)}},
			datastore.Document{{Key: "fullDocument.healthevent.processingstrategy",
				Value: datastore.Document{{Key: "$exists", Value: false}}}},
		}},
	}}}}
}

// deliveredNodes inserts health events for nodes with the processing strategies given (0:
// unset), then one for the node "last" with EXECUTE_REMEDIATION, and returns the nodes of the
// events events delivers up to "last".
func deliveredNodes(t *testing.T, db *sql.DB, events <-chan client.Event, strategies map[string]int) []string {
	t.Helper()
	for node, strategy := range strategies {
		he := fmt.Sprintf(`{"nodename":%q}`, node)
		if strategy != 0 {
			he = fmt.Sprintf(`{"nodename":%q,"processingstrategy":%d}`, node, strategy)
		}
		insertHealthEvent(t, db, `{"healthevent":`+he+`}`)
	}
	insertHealthEvent(t, db, `{"healthevent":{"nodename":"last","processingstrategy":1}}`)
	var nodes []string
	for {
		node, err := next(t, events).GetNodeName()
		require.NoError(t, err)
		if node == "last" {
			return nodes
		}
		nodes = append(nodes, node)
	}
}

// TestServicesDropIn gets watchers as node-drainer, fault-quarantine and the
// health-events-analyzer do, from a wrapped datastore: the assertions they make hold, the
// watcher LISTENs on the connection string of the DATASTORE_* variables, and the pipeline
// delivers what the store-client delivered ($exists unsupported), or, wrapped by
// client.WithExtendedFilters, the unset processing strategy too.
func TestServicesDropIn(t *testing.T) {
	db, dsn := healthEventsDB(t)
	datastoreEnv(t, dsn)
	_, _, err := serviceWatcher(t.Context(), pgStore{db}, "node-drainer", nil)
	require.ErrorContains(t, err, "does not support unwrapping", "the store-client's datastore with a bare replacement")
	ds := WrapDataStore(pgStore{db})
	strategies := map[string]int{"remediate": 1, "store-only": 2, "analyse": 3, "unset": 0}
	for _, tc := range []struct {
		client   string
		pipeline any
		want     []string
	}{
		{"fault-quarantine", processableInserts(), []string{"remediate"}},
		{"node-drainer", client.WithExtendedFilters(processableInserts()), []string{"remediate", "unset"}},
	} {
		t.Run(tc.client, func(t *testing.T) {
			w, decision, err := serviceWatcher(t.Context(), ds, tc.client, tc.pipeline)
			require.NoError(t, err)
			require.Zero(t, decision)
			w.Start(context.Background())
			defer func() { require.NoError(t, w.Close(context.Background())) }()
			pw := w.(ClientWatcher).Watcher.Watcher
			waitStarted(t, pw)
			require.Eventually(t, func() bool { return pw.Stats().ListenUp }, 30*time.Second, 10*time.Millisecond)
			got := deliveredNodes(t, db, w.Events(), strategies)
			slices.Sort(got)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestFactoryRoute creates fault-remediation's watcher through the watcher factory registry,
// with resume control asking to start fresh: the client's token is deleted, the decision says
// so, and the watcher starts at the newest row.
func TestFactoryRoute(t *testing.T) {
	db, dsn := healthEventsDB(t)
	datastoreEnv(t, dsn)
	ctx := t.Context()
	RegisterWatcherFactory()

	first, err := watcher.CreateChangeStreamWatcher(ctx, pgStore{db}, watcher.WatcherConfig{
		ClientName: "fault-remediation", CollectionName: "HealthEvents"})
	require.NoError(t, err)
	first.Start(context.Background())
	waitStarted(t, first.(*Watcher).Watcher)
	insertHealthEvent(t, db, `{"healthevent":{"nodename":"n1"}}`)
	ev := next(t, first.Events())
	require.Equal(t, "n1", ev.Event["fullDocument"].(map[string]any)["healthevent"].(map[string]any)["nodename"])
	require.NoError(t, first.MarkProcessed(ctx, ev.ResumeToken))
	require.NoError(t, first.Close(context.Background()))
	insertHealthEvent(t, db, `{"healthevent":{"nodename":"skipped"}}`)

	client.SetResumeControlMode("fault-remediation", "CREATE")
	t.Cleanup(func() { client.SetResumeControlMode("fault-remediation", "") })
	w, err := watcher.CreateChangeStreamWatcher(ctx, pgStore{db}, watcher.WatcherConfig{
		ClientName: "fault-remediation", CollectionName: "HealthEvents"})
	require.NoError(t, err)
	decision := w.(interface {
		ResumeControlDecision() client.ResumeControlDecision
	}).ResumeControlDecision()
	require.True(t, decision.StartFresh)
	require.False(t, decision.ColdStartCutoff.IsZero(), "fault-remediation gets a cold-start cutoff")
	var tokens int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM resume_tokens WHERE client_name = 'fault-remediation'`).Scan(&tokens))
	require.Zero(t, tokens, "resume control deleted the token")
	w.Start(context.Background())
	defer func() { require.NoError(t, w.Close(context.Background())) }()
	waitStarted(t, w.(*Watcher).Watcher)
	insertHealthEvent(t, db, `{"healthevent":{"nodename":"n2"}}`)
	ev = next(t, w.Events())
	require.Equal(t, "n2", ev.Event["fullDocument"].(map[string]any)["healthevent"].(map[string]any)["nodename"],
		"a fresh start begins at the newest row")
	require.NoError(t, w.MarkProcessed(ctx, ev.ResumeToken))

	// Resume control went back to RESUME: the next watcher keeps the token and is handed the
	// cutoff, as the service's cold start reads it.
	again, err := watcher.CreateChangeStreamWatcher(ctx, pgStore{db}, watcher.WatcherConfig{
		ClientName: "fault-remediation", CollectionName: "HealthEvents"})
	require.NoError(t, err)
	defer func() { require.NoError(t, again.Close(context.Background())) }()
	require.Equal(t, client.ResumeControlDecision{ColdStartCutoff: decision.ColdStartCutoff},
		again.(interface {
			ResumeControlDecision() client.ResumeControlDecision
		}).ResumeControlDecision())
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM resume_tokens WHERE client_name = 'fault-remediation'`).Scan(&tokens))
	require.Equal(t, 1, tokens, "RESUME keeps the token")
}

// TestClientWatcherOnHealthEvents checks the client view of the drop-in constructor's watcher:
// the event accessors, and the store-client's updatedFields.
func TestClientWatcherOnHealthEvents(t *testing.T) {
	db, dsn := healthEventsDB(t)
	w := Adapt(pgchangestream.NewPostgreSQLChangeStreamWatcher(db, "svc", "health_events", dsn, pgchangestream.ModeHybrid),
		client.ResumeControlDecision{}).Unwrap()
	w.Start(context.Background())
	defer func() { require.NoError(t, w.Close(context.Background())) }()
	waitStarted(t, w.(ClientWatcher).Watcher.Watcher)

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

	// The status set, and a key that goes from absent to null: the store-client listed only the
	// status, so EventUpdatesOnly(ev, status) held.
	_, err = db.ExecContext(t.Context(), `UPDATE health_events
		SET document = jsonb_set(jsonb_set(document, '{healtheventstatus,nodequarantined}', '"Quarantined"'),
			'{healtheventstatus,drained}', 'null') WHERE id = $1`, id)
	require.NoError(t, err)
	ev = next(t, w.Events())
	require.True(t, client.EventUpdatesOnly(ev, "healtheventstatus.nodequarantined"))
	require.Equal(t, map[string]any{"healtheventstatus.nodequarantined": "Quarantined"},
		ev.(pgchangestream.EventWithToken).UpdatedFields())
	require.NoError(t, w.MarkProcessed(t.Context(), ev.GetResumeToken()))

	count, err := w.(client.ChangeStreamMetrics).GetUnprocessedEventCount(t.Context(), "")
	require.NoError(t, err)
	require.Zero(t, count)
}

// TestCloseStopsRelays checks that Close ends both event views, whether or not they were read.
func TestCloseStopsRelays(t *testing.T) {
	db, _ := healthEventsDB(t)
	pw, err := pgchangestream.New(pgchangestream.Config{DB: db, ClientName: "svc", TableName: "health_events",
		Mode: pgchangestream.ModePolling, DocumentField: "document"})
	require.NoError(t, err)
	w := Adapt(pw, client.ResumeControlDecision{})
	w.Start(context.Background())
	waitStarted(t, pw)
	insertHealthEvent(t, db, `{"healthevent":{"nodename":"n1"}}`)
	insertHealthEvent(t, db, `{"healthevent":{"nodename":"n2"}}`)
	events := w.Events()
	next(t, events)
	require.Eventually(t, func() bool { return pw.Stats().Delivered == 2 }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, w.Close(context.Background()), "closing with a delivery not read stops the relay")
	late := 0
	for range events { // closes; the relay may hand over the delivery it held
		late++
	}
	require.LessOrEqual(t, late, 1)
	_, open := <-w.Unwrap().Events()
	require.False(t, open, "a view not read before Close is closed")
}

// TestOpenRejectsBadPipelines checks that a pipeline the store-client skipped or misread is an
// error naming it, and that Open then leaves no connection pool behind (TestMain checks for
// goroutines).
func TestOpenRejectsBadPipelines(t *testing.T) {
	for _, tc := range []struct {
		pipeline any
		want     string
	}{
		{datastore.Pipeline{{{Key: "$match", Value: datastore.Document{{Key: "a", Value: datastore.Document{{Key: "$regex", Value: "x"}}}}}}},
			`Config.Pipeline: pgchangestream: pipeline stage 0: field "a": $regex`},
		{[]any{"not a stage"}, "pipeline stage 0: want a document, got string"},
		{"not a pipeline", "unsupported pipeline type: string"},
	} {
		_, err := Open("svc", "health_events", tc.pipeline, client.ResumeControlDecision{})
		require.ErrorContains(t, err, tc.want)
	}
}

// exporterTokenSQL returns the statement docs/migrating.md gives to convert the event-exporter's
// old token.
func exporterTokenSQL(t *testing.T) string {
	t.Helper()
	guide, err := os.ReadFile("../../docs/migrating.md")
	require.NoError(t, err)
	block := regexp.MustCompile("(?s)```sql\n(UPDATE resume_tokens .*?lastChangelogID.*?)```").FindSubmatch(guide)
	require.NotNil(t, block, "docs/migrating.md has the sql block converting lastChangelogID")
	return string(block[1])
}

// TestExporterTokenConversion checks the guide's conversion of the old event-exporter's token
// ({"lastChangelogID": N}): before it the exporter's watcher reports the token in Health; after
// it the watcher resumes right after row N; a token without a row to convert stays as it was.
func TestExporterTokenConversion(t *testing.T) {
	db, dsn := healthEventsDB(t)
	datastoreEnv(t, dsn)
	ctx := t.Context()
	for _, node := range []string{"done", "next"} {
		insertHealthEvent(t, db, fmt.Sprintf(`{"healthevent":{"nodename":%q}}`, node))
	}
	var done, following int64
	require.NoError(t, db.QueryRowContext(ctx, `SELECT min(id), max(id) FROM datastore_changelog`).Scan(&done, &following))
	_, err := db.ExecContext(ctx, `INSERT INTO resume_tokens (client_name, resume_token)
		VALUES ('event-exporter', jsonb_build_object('lastChangelogID', $1::bigint)),
		       ('gone', '{"lastChangelogID": 0}')`, done)
	require.NoError(t, err)
	allInserts := datastore.Pipeline{{{Key: "$match", Value: datastore.Document{
		{Key: "operationType", Value: datastore.Document{{Key: "$in", Value: datastore.Array{"insert"}}}}}}}}

	old, err := Open("event-exporter", "health_events", allInserts, client.ResumeControlDecision{})
	require.NoError(t, err)
	old.Start(context.Background())
	require.Eventually(t, func() bool { return old.Health() != nil }, 30*time.Second, 10*time.Millisecond,
		"an old token is not read: Health says so")
	require.ErrorContains(t, old.Health(), "no eventID")
	require.NoError(t, old.Close(context.Background()))

	_, err = db.ExecContext(ctx, strings.ReplaceAll(exporterTokenSQL(t), "'event-exporter'", "ANY('{event-exporter,gone}')"))
	require.NoError(t, err)
	var gone string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT resume_token::text FROM resume_tokens WHERE client_name = 'gone'`).Scan(&gone))
	require.JSONEq(t, `{"lastChangelogID": 0}`, gone, "a token whose row is gone is not updated")

	w, err := Open("event-exporter", "health_events", allInserts, client.ResumeControlDecision{})
	require.NoError(t, err)
	cw := w.Unwrap()
	cw.Start(context.Background())
	defer func() { require.NoError(t, cw.Close(context.Background())) }()
	ev := next(t, cw.Events())
	node, err := ev.GetNodeName()
	require.NoError(t, err)
	require.Equal(t, "next", node, "the exporter resumes right after its old token's row")
	id, err := ev.GetDocumentID()
	require.NoError(t, err)
	require.Equal(t, fmt.Sprint(following), id)
	require.NoError(t, w.Health())
}

// TestBadPipelineKeepsToken checks that a pipeline the adapter refuses fails the watcher's
// creation before resume control runs: with the ConfigMap at CREATE, the client's token is
// still there, and CREATE still pending, for the start with a corrected pipeline.
func TestBadPipelineKeepsToken(t *testing.T) {
	db, dsn := healthEventsDB(t)
	datastoreEnv(t, dsn)
	ctx := t.Context()
	_, err := db.ExecContext(ctx, `INSERT INTO resume_tokens (client_name, resume_token)
		VALUES ('node-drainer', '{"timestamp": "2026-01-01T00:00:00Z", "eventID": 1}')`)
	require.NoError(t, err)
	client.SetResumeControlMode("node-drainer", "CREATE")
	t.Cleanup(func() { client.SetResumeControlMode("node-drainer", "") })
	bad := datastore.Pipeline{{{Key: "$match", Value: datastore.Document{{Key: "a", Value: datastore.Document{{Key: "$regex", Value: "x"}}}}}}}
	_, _, err = serviceWatcher(ctx, WrapDataStore(pgStore{db}), "node-drainer", bad)
	require.ErrorContains(t, err, "$regex")
	var tokens int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM resume_tokens WHERE client_name = 'node-drainer'`).Scan(&tokens))
	require.Equal(t, 1, tokens, "the token is kept")

	w, decision, err := serviceWatcher(ctx, WrapDataStore(pgStore{db}), "node-drainer", processableInserts())
	require.NoError(t, err)
	require.NoError(t, w.Close(context.Background()))
	require.True(t, decision.StartFresh, "CREATE is carried out by the start with a valid pipeline")
}
