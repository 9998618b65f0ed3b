package pgchangestream

import (
	"database/sql"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/pgchangestream/pgchangestream/schema"
	"github.com/stretchr/testify/require"
)

// upstreamFunction is the trigger function as the upstream services create it, at every start in
// their runtime-DDL generation and in SQL migration 00002 in the newer one: a plain CREATE OR
// REPLACE, without SECURITY DEFINER or a search_path, whose body ignores trigger arguments.
const upstreamFunction = `CREATE OR REPLACE FUNCTION log_table_changes()
RETURNS TRIGGER AS $$
DECLARE
    changelog_id BIGINT;
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO datastore_changelog (table_name, record_id, operation, old_values)
        VALUES (TG_TABLE_NAME, OLD.id, TG_OP, to_jsonb(OLD))
        RETURNING id INTO changelog_id;
        PERFORM pg_notify('nvsentinel_changes',
            json_build_object('id', changelog_id, 'table', TG_TABLE_NAME, 'operation', TG_OP)::text);
        RETURN OLD;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO datastore_changelog (table_name, record_id, operation, old_values, new_values)
        VALUES (TG_TABLE_NAME, NEW.id, TG_OP, to_jsonb(OLD), to_jsonb(NEW))
        RETURNING id INTO changelog_id;
        PERFORM pg_notify('nvsentinel_changes',
            json_build_object('id', changelog_id, 'table', TG_TABLE_NAME, 'operation', TG_OP)::text);
        RETURN NEW;
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO datastore_changelog (table_name, record_id, operation, new_values)
        VALUES (TG_TABLE_NAME, NEW.id, TG_OP, to_jsonb(NEW))
        RETURNING id INTO changelog_id;
        PERFORM pg_notify('nvsentinel_changes',
            json_build_object('id', changelog_id, 'table', TG_TABLE_NAME, 'operation', TG_OP)::text);
        RETURN NEW;
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql`

// upstreamMigration runs what upstream's SQL migration 00002 does to the trigger function.
func upstreamMigration(t *testing.T, db *sql.DB) {
	t.Helper()
	pgtest.Exec(t, db, upstreamFunction)
}

// upstreamStart runs what an upstream service's start-up (createChangeTriggers) does: the plain
// function, then, statement by statement, each table's trigger dropped and created again
// without arguments.
func upstreamStart(t *testing.T, db *sql.DB, tables ...string) {
	t.Helper()
	upstreamMigration(t, db)
	for _, table := range tables {
		pgtest.Exec(t, db, `DROP TRIGGER IF EXISTS `+table+`_changes ON `+table)
		pgtest.Exec(t, db, `CREATE TRIGGER `+table+`_changes
			AFTER INSERT OR UPDATE OR DELETE ON `+table+`
			FOR EACH ROW EXECUTE FUNCTION log_table_changes()`)
	}
}

// capturedTables are the tables captureAll captures, with their options: health_events with
// its default key, a table written by prepared transactions, one with a key of its own, and
// the live tests' items.
var capturedTables = []struct {
	table string
	opts  schema.Options
}{
	{"health_events", schema.Options{}},
	{"quiet", schema.Options{WithoutNotify: true}},
	{"docs", schema.Options{Key: "document.k"}},
	{liveTable, schema.Options{}},
}

// withCapturedTables creates the tables of capturedTables that the live template lacks and
// captures them.
func (e *liveEnv) withCapturedTables() {
	e.t.Helper()
	pgtest.Exec(e.t, e.db, `CREATE TABLE health_events (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), document jsonb);
		CREATE TABLE quiet (id bigserial PRIMARY KEY, item text);
		CREATE TABLE docs (id bigserial PRIMARY KEY, document jsonb)`)
	e.reapplySchema()
}

// reapplySchema is what an operator runs after upstream DDL: schema.Install, then schema.Capture
// for each captured table with the options it was captured with.
func (e *liveEnv) reapplySchema() {
	e.t.Helper()
	require.NoError(e.t, errOf(schema.Install(e.t.Context(), e.db, schema.Options{})))
	for _, c := range capturedTables {
		require.NoError(e.t, errOf(schema.Capture(e.t.Context(), e.db, c.table, c.opts)), c.table)
	}
}

// schemaState describes the trigger functions (by name: body, SECURITY DEFINER, settings,
// owner, grants) and the triggers (by table: name, arguments, function) of the database.
func schemaState(t *testing.T, db *sql.DB) string {
	t.Helper()
	return pgtest.Scalar[string](t, db, `SELECT concat_ws(E'\n',
		(SELECT string_agg(concat_ws(' | ', p.oid::regprocedure, p.prosecdef, p.proconfig::text, p.proowner::regrole,
			p.proacl::text, md5(p.prosrc)), E'\n' ORDER BY p.oid::regprocedure::text)
		FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace),
		(SELECT string_agg(concat_ws(' | ', t.tgrelid::regclass, t.tgname, encode(t.tgargs, 'escape'), t.tgfoid::regprocedure,
			t.tgtype, t.tgenabled), E'\n' ORDER BY t.tgrelid::regclass::text)
		FROM pg_trigger t WHERE NOT t.tgisinternal))`)
}

// catalogState is schemaState with the objects' identities: the oids of the functions and
// triggers, and every relation of the schema with its storage.
func catalogState(t *testing.T, db *sql.DB) string {
	t.Helper()
	return schemaState(t, db) + "\n" + pgtest.Scalar[string](t, db, `SELECT concat_ws(E'\n',
		(SELECT string_agg(p.oid::text, ',' ORDER BY p.oid) FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace),
		(SELECT string_agg(t.oid::text, ',' ORDER BY t.oid) FROM pg_trigger t WHERE NOT t.tgisinternal),
		(SELECT string_agg(concat_ws(' ', c.oid, c.relname, c.relkind, c.relfilenode, c.relacl::text), E'\n' ORDER BY c.oid)
		FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace))`)
}

// TestLiveUpstreamDDLDetectedAtStart: after an upstream service's start-up DDL, a watcher of
// health_events reports at Start, in every mode and schema state, that the trigger function is
// no longer the library's and that the trigger lost its key, naming both objects and the fix,
// well before the first periodic check (30s).
func TestLiveUpstreamDDLDetectedAtStart(t *testing.T) {
	inEachSchemaState(t, func(t *testing.T, e *liveEnv) {
		e.withCapturedTables()
		upstreamStart(t, e.db, "health_events", liveTable)
		for _, mode := range []Mode{ModePolling, ModeNotify, ModeHybrid} {
			cfg := e.config(mode)
			cfg.TableName, cfg.ClientName = "health_events", "c-"+string(mode)
			w := e.start(cfg)
			waitFor(t, func() bool { return w.Health() != nil }, mode)
			msg := w.Health().Error()
			for _, want := range []string{
				"capture trigger: trigger function log_table_changes() is not the one schema.Install installs",
				"is not SECURITY DEFINER", "has no pinned search_path", "ignores the trigger arguments",
				"trigger health_events_changes on public.health_events has no arguments, so its rows lose their key document.healthevent.nodename",
				"schema.Install (pgchangestream schema install), then schema.Capture",
			} {
				require.Contains(t, msg, want, mode)
			}
			require.NoError(t, w.Close(t.Context()))
		}
	})
}

// TestLiveUpstreamDDLDetectedWhileRunning: a running watcher reports upstream DDL within its
// check interval and a re-applied schema at the next check, logging each change once, not at
// every check.
func TestLiveUpstreamDDLDetectedWhileRunning(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	e.withCapturedTables()
	logs := newLogCounter()
	cfg := e.config(ModeHybrid)
	cfg.TableName, cfg.Logger = "health_events", slog.New(logs)
	w, err := New(cfg)
	require.NoError(t, err)
	var checks atomic.Int64
	w.schemaEvery, w.schemaChecked = liveQuiet/10, func() { checks.Add(1) }
	w.Start(t.Context())
	t.Cleanup(func() { _ = w.Close(t.Context()) })
	afterChecks := func(n int64) {
		t.Helper()
		target := checks.Load() + n
		waitFor(t, func() bool { return checks.Load() >= target }, "schema checks")
	}
	afterChecks(2)
	require.NoError(t, w.Health())

	upstreamMigration(t, e.db) // the function only
	waitFor(t, func() bool { return w.Health() != nil })
	require.Contains(t, w.Health().Error(), "is not SECURITY DEFINER")
	require.NotContains(t, w.Health().Error(), "has no arguments")
	afterChecks(5)
	require.Equal(t, 1, logs.count(logSchemaChanged), "logged once")

	e.reapplySchema()
	waitFor(t, func() bool { return w.Health() == nil })
	afterChecks(5)
	require.Equal(t, 1, logs.count(logSchemaRestored), "logged once")

	upstreamStart(t, e.db, "health_events")
	waitFor(t, func() bool { return w.Health() != nil && strings.Contains(w.Health().Error(), "has no arguments") })
	afterChecks(5)
	require.Equal(t, 2, logs.count(logSchemaChanged))
	e.reapplySchema()
	waitFor(t, func() bool { return w.Health() == nil })
}

// TestLiveReapplySchemaIsIdempotent: re-applying the schema (schema.Install and schema.Capture
// with the same options) changes nothing in the catalog: no function, trigger or relation is
// replaced or rewritten.
func TestLiveReapplySchemaIsIdempotent(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	e.withCapturedTables()
	before := catalogState(t, e.db)
	for range 2 {
		e.reapplySchema()
		require.Equal(t, before, catalogState(t, e.db))
	}
}

// TestLiveReapplySchemaAfterUpstreamDDL: writers without changelog grants (revoked by
// schema.RevokeWriterGrants) fail every write after an upstream service's start-up DDL;
// schema.RevokeWriterGrants then refuses; re-applying the schema restores SECURITY DEFINER, the
// search_path and the triggers' arguments, and the writers' changes reach the changelog again,
// with their units.
func TestLiveReapplySchemaAfterUpstreamDDL(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	e.withCapturedTables()
	role, writer := e.withRole("writer")
	e.grant(`GRANT INSERT ON health_events, quiet, docs, items TO ` + role)
	e.grant(`GRANT USAGE ON SEQUENCE quiet_id_seq, docs_id_seq TO ` + role)
	e.grant(`GRANT INSERT, SELECT (id) ON datastore_changelog TO ` + role)
	e.grant(`GRANT USAGE ON SEQUENCE datastore_changelog_id_seq TO ` + role)
	stmts, err := revokeSQL(t.Context(), e.db, schema.Options{})
	require.NoError(t, err)
	require.Len(t, stmts, 3)
	for _, s := range stmts {
		e.grant(s)
	}
	want := schemaState(t, e.db)
	writes := []string{
		`INSERT INTO health_events (document) VALUES ('{"healthevent": {"nodename": "n1"}}')`,
		`INSERT INTO quiet (item) VALUES ('q')`,
		`INSERT INTO docs (document) VALUES ('{"k": "x"}')`,
		`INSERT INTO items (n) VALUES (1)`,
	}
	for _, q := range writes {
		_, err := writer.Exec(q)
		require.NoError(t, err, q)
	}

	upstreamStart(t, e.db, "health_events", "quiet", "docs", liveTable)
	for _, q := range writes {
		_, err := writer.Exec(q)
		require.ErrorContains(t, err, "permission denied for table datastore_changelog", q)
	}
	require.Empty(t, pgtest.TriggerArgs(t, e.db, "health_events"))
	_, err = revokeSQL(t.Context(), e.db, schema.Options{})
	require.ErrorContains(t, err, "not revoking the writer grants: trigger function log_table_changes() is not the one schema.Install installs")

	e.reapplySchema()
	require.Equal(t, want, schemaState(t, e.db), "the function and the triggers' arguments are restored")
	require.Equal(t, []string{"notify", "key=" + schema.DefaultHealthEventsKey}, pgtest.TriggerArgs(t, e.db, "health_events"))
	require.Equal(t, []string{"no_notify"}, pgtest.TriggerArgs(t, e.db, "quiet"))
	require.Equal(t, []string{"notify", "key=document.k"}, pgtest.TriggerArgs(t, e.db, "docs"))
	for _, q := range writes {
		_, err := writer.Exec(q)
		require.NoError(t, err, q)
	}
	require.Equal(t, pgtest.Keyed(UnitOf("n1")), pgtest.LastUnit(t, e.db, "health_events"))
	require.Equal(t, pgtest.Keyed(UnitOf("x")), pgtest.LastUnit(t, e.db, "docs"))
}

// TestLiveRevokeWriterGrantsRefusesWhereDDLWouldUndoIt: schema.RevokeWriterGrants refuses, with the
// reason, to revoke the grants of a writer that could undo the trigger function the way a
// service's start-up DDL does: one with the privileges of the function's owner, and one that
// owns a captured table and may create functions in a schema of its own. IgnoreReplaceable
// overrides it; a writer that can do neither is revoked as before.
func TestLiveRevokeWriterGrantsRefusesWhereDDLWouldUndoIt(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	grantWriter := func(role string) {
		e.grant(`GRANT INSERT, SELECT (id) ON datastore_changelog TO ` + role)
		e.grant(`GRANT USAGE ON SEQUENCE datastore_changelog_id_seq TO ` + role)
	}
	member, _ := e.withRole("member")
	grantWriter(member)
	e.grant(`GRANT ` + changelog.Quote(pgtest.Scalar[string](t, e.db, `SELECT current_user`)) + ` TO ` + member)
	_, err := revokeSQL(t.Context(), e.db, schema.Options{})
	require.ErrorContains(t, err, "not revoking the writer grants: role "+member+" has the privileges of role")
	require.ErrorContains(t, err, "so it can replace the function (CREATE OR REPLACE FUNCTION)")
	require.ErrorContains(t, err, "schema.Options.IgnoreReplaceable")
	stmts, err := revokeSQL(t.Context(), e.db, schema.Options{IgnoreReplaceable: true})
	require.NoError(t, err)
	require.Len(t, stmts, 3)
	for _, s := range stmts {
		e.grant(s)
	}

	owner, _ := e.withRole("owner")
	grantWriter(owner)
	pgtest.Exec(t, e.db, `CREATE TABLE own_events (id bigserial PRIMARY KEY); ALTER TABLE own_events OWNER TO `+owner)
	require.NoError(t, errOf(schema.Capture(t.Context(), e.db, "own_events", schema.Options{})))
	stmts, err = revokeSQL(t.Context(), e.db, schema.Options{})
	require.NoError(t, err, "it owns a captured table but can create in no other schema")
	require.Len(t, stmts, 3)
	pgtest.Exec(t, e.db, `CREATE SCHEMA `+owner+` AUTHORIZATION `+owner)
	_, err = revokeSQL(t.Context(), e.db, schema.Options{})
	require.ErrorContains(t, err, "role "+owner+" has the privileges of the owner of own_events, whose trigger calls "+
		"log_table_changes(), and may create in schema "+strings.Trim(owner, `"`))
	pgtest.Exec(t, e.db, `DROP SCHEMA `+owner)

	// What that DDL leaves: a plain function of the name in another schema, which a trigger calls.
	pgtest.Exec(t, e.db, `CREATE SCHEMA shadow; SET search_path = shadow, public; `+upstreamFunction+`;
		SET search_path = public;
		DROP TRIGGER own_events_changes ON own_events;
		CREATE TRIGGER own_events_changes AFTER INSERT ON own_events FOR EACH ROW EXECUTE FUNCTION shadow.log_table_changes()`)
	_, err = revokeSQL(t.Context(), e.db, schema.Options{IgnoreReplaceable: true})
	require.ErrorContains(t, err, "trigger function shadow.log_table_changes() is not the one schema.Install installs")
}
