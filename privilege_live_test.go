package pgchangestream

import (
	"context"
	"database/sql"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/admin"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/schema"
	"github.com/stretchr/testify/require"
)

// errOf is the error of a schema call, for the tests that check only that.
func errOf(_ schema.Result, err error) error { return err }

// revokeSQL returns the statements schema.RevokeWriterGrants would run with opts: it reads the
// catalog and revokes nothing.
func revokeSQL(ctx context.Context, db *sql.DB, opts schema.Options) ([]string, error) {
	opts.DryRun = true
	res, err := schema.RevokeWriterGrants(ctx, db, opts)
	return res.Statements, err
}

// grant runs one GRANT (or REVOKE) as the owner.
func (e *liveEnv) grant(stmt string) {
	e.t.Helper()
	_, err := e.db.Exec(stmt)
	require.NoError(e.t, err)
}

// TestLiveWriterNeedsOnlyItsTable: a role with INSERT on a captured table and nothing else writes
// it, and its change reaches a watcher; it cannot insert a changelog row of its own.
func TestLiveWriterNeedsOnlyItsTable(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	role, writer := e.withRole("writer")
	e.grant(`GRANT INSERT ON items TO ` + role)
	w := e.start(e.fromBeginning(ModeHybrid))

	_, err := writer.Exec(`INSERT INTO items (n) VALUES (7)`)
	require.NoError(t, err, "a writer needs no privilege on the changelog")
	ids := receiveWithin(t, w, 1, liveWait)
	require.Len(t, ids, 1)

	_, err = writer.Exec(`INSERT INTO datastore_changelog (table_name, record_id, operation, new_values)
		VALUES ('items', gen_random_uuid(), 'INSERT', '{"n": 666}')`)
	require.ErrorContains(t, err, "permission denied for table datastore_changelog")
	requireNothingWithin(t, w, liveQuiet)
}

// dsnAs returns the database's connection string for the role (quoted, as withRole returns it).
func (e *liveEnv) dsnAs(role string) string {
	e.t.Helper()
	u, err := url.Parse(e.dsn)
	require.NoError(e.t, err)
	u.User = url.User(strings.Trim(role, `"`))
	return u.String()
}

// TestLiveClientCannotMoveAnotherClientsToken: a watcher role restricted to client "a" cannot
// save, fence or delete the token of client "c", while its own exclusive watcher claims the
// client, streams and saves fenced checkpoints; the owner still administers every token.
func TestLiveClientCannotMoveAnotherClientsToken(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	role, client := e.withRole("client_a")
	e.grant(`GRANT SELECT, UPDATE ON datastore_changelog TO ` + role)
	e.grant(`GRANT SELECT, INSERT, UPDATE, DELETE ON resume_tokens, datastore_changelog_acks, datastore_changelog_parked TO ` + role)
	e.grant(`GRANT USAGE ON SEQUENCE datastore_changelog_parked_id_seq, datastore_changelog_member_seq TO ` + role)
	e.grant(`GRANT SELECT, INSERT, UPDATE, DELETE ON datastore_changelog_members, datastore_changelog_ranges TO ` + role)
	pgtest.Exec(t, e.db, `INSERT INTO datastore_changelog_members (client_name, member, name, lease_until)
		VALUES ('c', nextval('datastore_changelog_member_seq'), 'm', now() + interval '1 hour')`)
	pgtest.Exec(t, e.db, `INSERT INTO datastore_changelog_ranges (client_name, range_no, owner, resume_token)
		SELECT 'c', 0, member, '{}' FROM datastore_changelog_members WHERE client_name = 'c'`)
	ids := e.insert(3)
	other := e.start(e.fromBeginning(ModePolling)) // client "c", as the owner
	require.Equal(t, ids, receiveWithin(t, other, 3, liveWait))
	require.NoError(t, other.MarkProcessed(t.Context(), []byte(strconv.FormatInt(ids[0], 10))))
	require.NoError(t, other.Close(t.Context()))
	before := e.rawToken("c")
	require.NoError(t, errOf(schema.RestrictTokens(t.Context(), e.db, strings.Trim(role, `"`), []string{"a"}, schema.Options{})))

	forged := `{"timestamp": "2999-01-01T00:00:00Z", "eventID": "99999999"}`
	requireRefused(t, client, `INSERT INTO resume_tokens (client_name, resume_token) VALUES ('c', $1)
		ON CONFLICT (client_name) DO UPDATE SET resume_token = EXCLUDED.resume_token`, forged)
	requireRefused(t, client, `INSERT INTO resume_tokens (client_name, resume_token) VALUES ('new', $1)`, forged)
	requireRefused(t, client, `UPDATE resume_tokens SET resume_token = $1 WHERE client_name = 'c'`, forged)
	requireRefused(t, client, `UPDATE resume_tokens SET owner_epoch = 99 WHERE client_name = 'c'`)
	requireRefused(t, client, `DELETE FROM resume_tokens WHERE client_name = 'c'`)
	require.Equal(t, before, e.rawToken("c"), "another client's token is unchanged")
	requireRefused(t, client, `INSERT INTO datastore_changelog_acks (client_name, changelog_id) VALUES ('c', $1)`, ids[1])
	requireRefused(t, client, `INSERT INTO datastore_changelog_parked
		(client_name, event_key, table_name, changelog_id, event, error, attempts, blocking)
		VALUES ('c', 'k', 'items', 1, '{}', 'x', 1, TRUE)`)
	ranges := pgtest.Scalar[string](t, e.db, `SELECT string_agg(owner || ' ' || resume_token::text, ',') FROM datastore_changelog_ranges`)
	requireRefused(t, client, `UPDATE datastore_changelog_ranges SET owner = 99, resume_token = $1 WHERE client_name = 'c'`, forged)
	requireRefused(t, client, `INSERT INTO datastore_changelog_ranges (client_name, range_no, owner, resume_token)
		VALUES ('c', 1, 99, $1)`, forged)
	requireRefused(t, client, `DELETE FROM datastore_changelog_ranges WHERE client_name = 'c'`)
	requireRefused(t, client, `UPDATE datastore_changelog_members SET lease_until = now() - interval '1 day' WHERE client_name = 'c'`)
	requireRefused(t, client, `INSERT INTO datastore_changelog_members (client_name, member, name, lease_until)
		VALUES ('c', nextval('datastore_changelog_member_seq'), 'forged', now())`)
	require.Equal(t, ranges, pgtest.Scalar[string](t, e.db, `SELECT string_agg(owner || ' ' || resume_token::text, ',') FROM datastore_changelog_ranges`),
		"another client's ranges are unchanged")
	_, err := client.Exec(`INSERT INTO datastore_changelog_members (client_name, member, name, lease_until)
		VALUES ('a', nextval('datastore_changelog_member_seq'), 'own', now())`)
	require.NoError(t, err, "its own client's members")
	_, err = client.Exec(`INSERT INTO datastore_changelog_ranges (client_name, range_no, resume_token) VALUES ('a', 0, '{}')`)
	require.NoError(t, err, "its own client's ranges")
	_, err = client.Exec(`INSERT INTO datastore_changelog_acks (client_name, changelog_id) VALUES ('a', $1)`, ids[1])
	require.NoError(t, err, "its own client's acknowledgement rows")
	_, err = admin.Prune(t.Context(), client, admin.PruneOptions{})
	require.ErrorContains(t, err, "hides other clients' tokens")

	cfg := e.fromBeginning(ModeHybrid)
	cfg.DB, cfg.ConnString, cfg.ClientName, cfg.Exclusive = client, e.dsnAs(role), "a", true
	w := e.start(cfg)
	waitFor(t, func() bool { return w.Stats().Active }, "the exclusive watcher claims client a")
	got := receiveWithin(t, w, 3, liveWait)
	require.Equal(t, ids, got)
	require.NoError(t, w.MarkProcessed(t.Context(), []byte(strconv.FormatInt(got[2], 10))))
	require.Equal(t, e.position(ids[2]), e.savedToken("a"), "its own fenced save works")
	require.Equal(t, int64(1), pgtest.Scalar[int64](t, e.db, `SELECT owner_epoch FROM resume_tokens WHERE client_name = 'a'`))
	listed, err := admin.ListTokens(t.Context(), client, admin.Options{})
	require.NoError(t, err)
	require.Len(t, listed, 1, "it sees its own token only")
	require.NoError(t, w.Close(t.Context()))

	require.NoError(t, resetTo(t.Context(), e.db, "c", Position{}, ""), "the owner administers every token")
	require.NoError(t, errOf(schema.RemoveRestrictions(t.Context(), e.db, strings.Trim(role, `"`), schema.Options{})))
	_, err = client.Exec(`UPDATE resume_tokens SET last_updated = now() WHERE client_name = 'c'`)
	require.NoError(t, err)
	require.Equal(t, 2, pgtest.Scalar[int](t, client, `SELECT count(*) FROM resume_tokens`), "lifted")
}

// requireRefused requires stmt to fail with a permission or row-level security error, or to
// change no row.
func requireRefused(t *testing.T, db *sql.DB, stmt string, args ...any) {
	t.Helper()
	res, err := db.Exec(stmt, args...)
	if err != nil {
		require.Regexp(t, `permission denied|row-level security`, err.Error())
		return
	}
	n, err := res.RowsAffected()
	require.NoError(t, err)
	require.Zero(t, n, "%s changed a row", stmt)
}

// TestLiveUpgradedWriterGrantsCanBeRevoked: on the existing schema a writer holds the old grants
// (INSERT and SELECT (id) on the changelog, USAGE on its sequence). schema.Install, run while it writes, makes
// the trigger function run as the owner; schema.RevokeWriterGrants with DryRun then lists exactly
// the old grants, refusing before the upgrade, and without DryRun revokes them; once they are revoked the writer still writes and can no
// longer forge a changelog row.
func TestLiveUpgradedWriterGrantsCanBeRevoked(t *testing.T) {
	t.Parallel()
	e := newLegacy(t)
	role, writer := e.withRole("writer")
	e.grant(`GRANT INSERT ON health_events TO ` + role)
	// The old trigger function's INSERT ... RETURNING id needs SELECT on id too.
	e.grant(`GRANT INSERT, SELECT (id) ON datastore_changelog TO ` + role)
	e.grant(`GRANT USAGE ON SEQUENCE datastore_changelog_id_seq TO ` + role)
	_, err := revokeSQL(t.Context(), e.db, schema.Options{})
	require.ErrorContains(t, err, "is not SECURITY DEFINER")
	require.ErrorContains(t, err, "schema.Install never ran")

	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { // a writer busy throughout the upgrade
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if _, err := writer.Exec(`INSERT INTO health_events (item) VALUES ('x')`); err != nil {
				done <- err
				return
			}
		}
	}()
	require.NoError(t, errOf(schema.Install(t.Context(), e.db, schema.Options{})))
	close(stop)
	require.NoError(t, <-done, "writes go on during the upgrade")

	stmts, err := revokeSQL(t.Context(), e.db, schema.Options{})
	require.NoError(t, err)
	require.Equal(t, []string{
		`REVOKE INSERT ON TABLE "public"."datastore_changelog" FROM ` + role,
		`REVOKE SELECT (id) ON TABLE "public"."datastore_changelog" FROM ` + role,
		`REVOKE USAGE, UPDATE ON SEQUENCE "public"."datastore_changelog_id_seq" FROM ` + role,
	}, stmts)
	res, err := schema.RevokeWriterGrants(t.Context(), e.db, schema.Options{})
	require.NoError(t, err)
	require.Equal(t, stmts, res.Statements, "it runs what the dry run listed")
	var before int
	require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog WHERE table_name = 'health_events'`).Scan(&before))
	_, err = writer.Exec(`INSERT INTO health_events (item) VALUES ('after')`)
	require.NoError(t, err)
	var after int
	require.NoError(t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog WHERE table_name = 'health_events'`).Scan(&after))
	require.Equal(t, before+1, after)
	_, err = writer.Exec(`INSERT INTO datastore_changelog (table_name, record_id, operation) VALUES ('items', gen_random_uuid(), 'DELETE')`)
	require.ErrorContains(t, err, "permission denied for table datastore_changelog")
	stmts, err = revokeSQL(t.Context(), e.db, schema.Options{})
	require.NoError(t, err)
	require.Empty(t, stmts, "nothing left to revoke")
}

// TestLiveTriggerSearchPathIsPinned: a writer's temporary table named like the changelog does
// not catch its changes: the trigger function's search_path is pinned, pg_temp last.
func TestLiveTriggerSearchPathIsPinned(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	role, writer := e.withRole("writer")
	e.grant(`GRANT INSERT ON items TO ` + role)
	e.grant(`GRANT TEMPORARY ON DATABASE ` + pgtest.Scalar[string](t, e.db, `SELECT quote_ident(current_database())`) + ` TO ` + role)
	conn, err := writer.Conn(t.Context())
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(t.Context(), `CREATE TEMP TABLE datastore_changelog (id bigint, table_name text, record_id text,
		operation text, old_values jsonb, new_values jsonb)`)
	require.NoError(t, err)
	_, err = conn.ExecContext(t.Context(), `SET search_path = pg_temp, public`)
	require.NoError(t, err)
	_, err = conn.ExecContext(t.Context(), `INSERT INTO items (n) VALUES (5)`)
	require.NoError(t, err)
	var n int
	require.NoError(t, conn.QueryRowContext(t.Context(), `SELECT count(*) FROM pg_temp.datastore_changelog`).Scan(&n))
	require.Zero(t, n, "the change did not go to the temporary table")
	require.Equal(t, 1, pgtest.Scalar[int](t, e.db, `SELECT count(*) FROM datastore_changelog WHERE new_values->>'n' = '5'`))
}

// planNodes returns the node lines of an EXPLAIN text, without their conditions.
func planNodes(plan string) []string {
	var nodes []string
	for _, line := range strings.Split(plan, "\n") {
		if !regexp.MustCompile(`^\s*[A-Z][A-Za-z ]*: `).MatchString(line) {
			nodes = append(nodes, line)
		}
	}
	return nodes
}

// TestLiveConsumerReadsOnlyItsTables: a role restricted to the changelog rows of items streams
// items, sees and marks none of the rows of another table, and its reads keep the plans of an
// unrestricted role: index ranges of the stream index and of the txid index. Other roles still
// see every row, and writers still write.
func TestLiveConsumerReadsOnlyItsTables(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	pgtest.Exec(t, e.db, `CREATE TABLE others (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), n int)`)
	require.NoError(t, errOf(schema.Capture(t.Context(), e.db, "others", schema.Options{})))
	role, reader := e.withRole("reader")
	openRole, open := e.withRole("open")
	for _, r := range []string{role, openRole} {
		e.grant(`GRANT SELECT, UPDATE ON datastore_changelog TO ` + r)
		e.grant(`GRANT SELECT, INSERT, UPDATE ON resume_tokens TO ` + r)
	}
	pgtest.Exec(t, e.db, `INSERT INTO items (n) SELECT g FROM generate_series(1, 3000) g`)
	pgtest.Exec(t, e.db, `INSERT INTO others (n) SELECT g FROM generate_series(1, 3000) g`)
	pgtest.Exec(t, e.db, `ANALYZE datastore_changelog`)
	require.NoError(t, errOf(schema.RestrictReads(t.Context(), e.db, strings.Trim(role, `"`), []string{liveTable}, schema.Options{})))

	count := `SELECT count(*) FROM datastore_changelog WHERE table_name = 'others'`
	require.Zero(t, pgtest.Scalar[int](t, reader, count), "the restricted role sees no row of others")
	require.Equal(t, 3000, pgtest.Scalar[int](t, open, count), "an unrestricted role sees them all")
	require.Equal(t, 3000, pgtest.Scalar[int](t, reader, `SELECT count(*) FROM datastore_changelog`))
	requireRefused(t, reader, `UPDATE datastore_changelog SET processed = TRUE WHERE table_name = 'others'`)

	w, err := New(e.config(ModePolling))
	require.NoError(t, err)
	var at time.Time
	var id int64
	require.NoError(t, e.db.QueryRow(`SELECT changed_at, id FROM datastore_changelog WHERE table_name = $1
		ORDER BY changed_at, id OFFSET 1500 LIMIT 1`, liveTable).Scan(&at, &id))
	b := e.snapshot()
	e.insert(1)
	end := e.snapshot()
	lo, loID, hi, hiID := changelog.RangeArrays(position.DeltaRanges(b, end))
	for _, q := range []struct {
		name, sql string
		args      []any
		scan      string // the index range scan the unrestricted plan has too
	}{
		{"read", w.q.Read, []any{liveTable, at, id},
			`^Limit\n  ->  Index Scan using datastore_changelog_stream_idx on datastore_changelog\n.*Index Cond: .*ROW\(changed_at, id\) > ROW\(`},
		{"deltaRead", w.q.DeltaRead, []any{liveTable, lo, loID, hi, hiID, end.String(), int64(position.MinID)},
			`(Bitmap Index Scan on|Index Scan using) datastore_changelog_txid_unit_idx.*\n.*Index Cond: .*ROW\(txid, id\) > ROW\(r\.lo, r\.lo_id\)`},
	} {
		explainAs := func(db *sql.DB) string {
			return pgtest.Explain(t, db, `EXPLAIN (COSTS OFF) `+q.sql, q.args...)
		}
		restricted, unrestricted := explainAs(reader), explainAs(open)
		require.Equal(t, planNodes(unrestricted), planNodes(restricted), "%s: the same plan under the policy:\n%s", q.name, restricted)
		require.Regexp(t, q.scan, restricted, q.name)
		require.NotContains(t, restricted, "Seq Scan", q.name)
	}

	cfg := e.fromBeginning(ModeHybrid)
	cfg.DB, cfg.ConnString = reader, e.dsnAs(role)
	items := e.start(cfg)
	require.Len(t, receiveWithin(t, items, 3001, liveWait), 3001, "it streams items")
	cfg.TableName, cfg.ClientName = "others", "o"
	hidden := e.start(cfg)
	requireNothingWithin(t, hidden, liveQuiet)
	require.NoError(t, hidden.Health(), "a table it may not read looks empty")
	ids := e.insert(1)
	require.Equal(t, ids, receiveWithin(t, items, 1, liveWait), "the trigger still writes under row-level security")
}

// TestLiveHostileRoleCannotForgeChanges: a login role with no grant cannot attach the trigger
// function to a table of its own (EXECUTE is not PUBLIC's); granted EXECUTE, its temporary table
// named like a captured table, and a table of the same name in a schema of its own, are refused
// by the function itself: inserts, updates and deletes carrying a real row's id write no
// changelog row, and the watcher of the real table receives only real changes.
func TestLiveHostileRoleCannotForgeChanges(t *testing.T) {
	inEachSchemaState(t, func(t *testing.T, e *liveEnv) {
		role, hostile := e.withRole("hostile")
		w := e.start(e.fromBeginning(ModeHybrid))
		ids := e.insert(1)
		require.Equal(t, ids, receiveWithin(t, w, 1, liveWait))
		var real string
		require.NoError(t, e.db.QueryRow(`SELECT record_id FROM datastore_changelog WHERE id = $1`, ids[0]).Scan(&real))
		rows := pgtest.Scalar[int](t, e.db, `SELECT count(*) FROM datastore_changelog`)

		conn, err := hostile.Conn(t.Context())
		require.NoError(t, err)
		defer conn.Close()
		exec := func(stmt string, args ...any) error {
			_, err := conn.ExecContext(t.Context(), stmt, args...)
			return err
		}
		require.NoError(t, exec(`CREATE TEMP TABLE items (id uuid, n int, doc jsonb)`), "PUBLIC may create temporary tables")
		require.NoError(t, exec(`INSERT INTO items VALUES ($1, 0, '{}')`, real))
		attach := `CREATE TRIGGER items_changes AFTER INSERT OR UPDATE OR DELETE ON items
			FOR EACH ROW EXECUTE FUNCTION log_table_changes()`
		require.ErrorContains(t, exec(attach), "permission denied for function log_table_changes")

		e.grant(`GRANT EXECUTE ON FUNCTION log_table_changes() TO ` + role) // a grant some deployment made
		e.grant(`CREATE SCHEMA hostile AUTHORIZATION ` + role)
		require.NoError(t, exec(attach))
		require.NoError(t, exec(`CREATE TABLE hostile.items (id uuid, n int, doc jsonb)`))
		require.NoError(t, exec(`CREATE TRIGGER items_changes AFTER INSERT OR UPDATE OR DELETE ON hostile.items
			FOR EACH ROW EXECUTE FUNCTION log_table_changes()`))
		for _, forge := range []string{
			`INSERT INTO items VALUES ($1, 666, '{}')`,
			`UPDATE items SET n = 666 WHERE id = $1`,
			`DELETE FROM items WHERE id = $1`,
			`INSERT INTO hostile.items VALUES ($1, 666, '{}')`,
		} {
			err := exec(forge, real)
			require.ErrorContains(t, err, "is not captured", forge)
			require.ErrorContains(t, err, "SQLSTATE 42501", forge)
		}
		require.Equal(t, rows, pgtest.Scalar[int](t, e.db, `SELECT count(*) FROM datastore_changelog`), "no forged row")
		requireNothingWithin(t, w, liveQuiet)

		writer, wdb := e.withRole("writer")
		e.grant(`GRANT INSERT ON items TO ` + writer)
		_, err = wdb.Exec(`INSERT INTO items (n) VALUES (1)`)
		require.NoError(t, err, "a writer of the captured table still writes")
		require.Len(t, receiveWithin(t, w, 1, liveWait), 1)
	})
}

// TestLiveTablesCapturedBeforeTheUpgradeKeepWorking: on the existing schema, triggers attached
// by the old DDL (no arguments), one of them on a table another role owns, keep writing after
// schema.Install, and so do a trigger dropped and created again by the old runtime DDL and a
// table the changelog's owner captures with a plain CREATE TRIGGER. A table of another role
// attached after the upgrade without schema.Capture is refused until schema.Capture lists it.
func TestLiveTablesCapturedBeforeTheUpgradeKeepWorking(t *testing.T) {
	t.Parallel()
	e := newLegacy(t)
	owner, _ := e.withRole("app_owner")
	pgtest.Exec(t, e.db, `CREATE TABLE app_events (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), item text);
		ALTER TABLE app_events OWNER TO `+owner+`;
		CREATE TRIGGER app_events_changes AFTER INSERT OR UPDATE OR DELETE ON app_events
			FOR EACH ROW EXECUTE FUNCTION log_table_changes()`)
	require.NoError(t, errOf(schema.Install(t.Context(), e.db, schema.Options{})))
	written := func(table string) error {
		before := pgtest.Scalar[int](t, e.db, `SELECT count(*) FROM datastore_changelog WHERE table_name = $1`, table)
		if _, err := e.db.Exec(`INSERT INTO ` + table + ` DEFAULT VALUES`); err != nil {
			return err
		}
		require.Equal(t, before+1, pgtest.Scalar[int](t, e.db, `SELECT count(*) FROM datastore_changelog WHERE table_name = $1`, table))
		return nil
	}
	for _, table := range []string{"health_events", "app_events"} {
		require.NoError(t, written(table), table)
	}
	require.Equal(t, []string{"app_events", "health_events", "items"},
		e.strings(`SELECT table_name FROM datastore_changelog_captured ORDER BY 1`), "adopted at the upgrade")

	pgtest.Exec(t, e.db, `DROP TRIGGER health_events_changes ON health_events`) // the old runtime DDL, at every start
	pgtest.Exec(t, e.db, `CREATE TRIGGER health_events_changes AFTER INSERT OR UPDATE OR DELETE ON health_events
		FOR EACH ROW EXECUTE FUNCTION log_table_changes()`)
	require.NoError(t, written("health_events"))
	pgtest.Exec(t, e.db, `CREATE TABLE maintenance_events (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), item text);
		CREATE TRIGGER maintenance_events_changes AFTER INSERT OR UPDATE OR DELETE ON maintenance_events
			FOR EACH ROW EXECUTE FUNCTION log_table_changes()`)
	require.NoError(t, written("maintenance_events"), "a table of the changelog's owner")

	pgtest.Exec(t, e.db, `CREATE TABLE app_notes (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), item text);
		ALTER TABLE app_notes OWNER TO `+owner+`;
		CREATE TRIGGER app_notes_changes AFTER INSERT OR UPDATE OR DELETE ON app_notes
			FOR EACH ROW EXECUTE FUNCTION log_table_changes()`)
	require.ErrorContains(t, written("app_notes"), "table public.app_notes is not captured")
	require.NoError(t, errOf(schema.Capture(t.Context(), e.db, "app_notes", schema.Options{})))
	require.NoError(t, written("app_notes"), "listed by schema.Capture")

	pgtest.Exec(t, e.db, `CREATE TEMP TABLE temp_items (id uuid)`)
	require.ErrorContains(t, errOf(schema.Capture(t.Context(), e.db, "temp_items", schema.Options{})), "is temporary")
}

// strings returns the first column of query's rows.
func (e *liveEnv) strings(query string, args ...any) []string {
	e.t.Helper()
	rows, err := e.db.Query(query, args...)
	require.NoError(e.t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(e.t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(e.t, rows.Err())
	return out
}

// TestLiveRestrictedReadsHideParkedEvents: a role restricted to the rows of items, holding the
// grants of the dead-letter table, reads, parks, releases and drops only items' parked events,
// also once it is restricted to its clients' rows too; RemoveRestrictions lifts both.
func TestLiveRestrictedReadsHideParkedEvents(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	role, reader := e.withRole("reader")
	name := strings.Trim(role, `"`)
	e.grant(`GRANT SELECT, INSERT, UPDATE, DELETE ON datastore_changelog_parked TO ` + role)
	e.grant(`GRANT USAGE ON SEQUENCE datastore_changelog_parked_id_seq TO ` + role)
	park := `INSERT INTO datastore_changelog_parked (client_name, event_key, table_name, changelog_id, event, error, attempts, blocking)
		VALUES ($1, 'k', $2, 1, '{"fullDocument": {"secret": 1}}', 'x', 1, TRUE)`
	pgtest.Exec(t, e.db, park, "c", liveTable)
	pgtest.Exec(t, e.db, park, "c", "others")
	count := `SELECT count(*) FROM datastore_changelog_parked WHERE table_name = 'others'`
	require.Equal(t, 1, pgtest.Scalar[int](t, reader, count), "unrestricted, it reads every table's parked events")

	require.NoError(t, errOf(schema.RestrictReads(t.Context(), e.db, name, []string{liveTable}, schema.Options{})))
	for i, restrict := range []func(){func() {}, func() {
		require.NoError(t, errOf(schema.RestrictTokens(t.Context(), e.db, name, []string{"c"}, schema.Options{})))
	}} {
		restrict()
		require.Zero(t, pgtest.Scalar[int](t, reader, count), "another table's parked event is hidden")
		listed, err := admin.ListParked(t.Context(), reader, "c", admin.Options{})
		require.NoError(t, err)
		require.Len(t, listed, 1+i, "its own table's, one more parked each round")
		for _, p := range listed {
			require.Equal(t, liveTable, p.Table)
		}
		requireRefused(t, reader, `UPDATE datastore_changelog_parked SET retry_requested = TRUE WHERE table_name = 'others'`)
		requireRefused(t, reader, `DELETE FROM datastore_changelog_parked WHERE table_name = 'others'`)
		requireRefused(t, reader, park, "c", "others")
		_, err = reader.Exec(park, "c", liveTable)
		require.NoError(t, err, "it parks its own table's events")
	}
	requireRefused(t, reader, park, "d", liveTable)
	require.NoError(t, errOf(schema.RemoveRestrictions(t.Context(), e.db, name, schema.Options{})))
	require.Equal(t, 1, pgtest.Scalar[int](t, reader, count), "lifted")
	require.Equal(t, 4, pgtest.Scalar[int](t, reader, `SELECT count(*) FROM datastore_changelog_parked`))
}

// TestLivePruneFunctionRefusesRestrictedRole: the SQL retention function, called by a role that
// RestrictTokens keeps from seeing a client's token, refuses as admin.Prune does, instead of deleting
// rows that client has not read; the owner's call keeps them.
func TestLivePruneFunctionRefusesRestrictedRole(t *testing.T) {
	t.Parallel()
	e := newLive(t) // the function needs the upgraded schema
	ids := e.insert(20)
	e.saveRawToken("behind", `{"timestamp": "2000-01-01T00:00:00Z", "eventID": 0, "table": "items"}`) // read none
	e.consumeTable("a", liveTable, 20, 100, ids[19])
	role, pruner := e.withRole("pruner")
	e.grant(`GRANT SELECT, DELETE ON datastore_changelog TO ` + role)
	e.grant(`GRANT SELECT ON resume_tokens, datastore_changelog_ranges, datastore_changelog_members TO ` + role)
	require.NoError(t, errOf(schema.RestrictTokens(t.Context(), e.db, strings.Trim(role, `"`), []string{"a"}, schema.Options{})))

	_, err := admin.Prune(t.Context(), pruner, admin.PruneOptions{})
	require.ErrorContains(t, err, "hides other clients' tokens")
	_, err = pruner.Exec(`SELECT datastore_changelog_prune()`)
	require.ErrorContains(t, err, `token table "resume_tokens" hides other clients' tokens from this role (RestrictTokens)`)
	require.ErrorContains(t, err, "SQLSTATE 42501")
	require.Equal(t, 20, pgtest.Scalar[int](t, e.db, `SELECT count(*) FROM datastore_changelog`), "nothing deleted")

	require.Zero(t, pgtest.Scalar[int64](t, e.db, `SELECT datastore_changelog_prune()`), "client behind holds every row")
	require.Equal(t, 20, pgtest.Scalar[int](t, e.db, `SELECT count(*) FROM datastore_changelog`))
}

// TestLiveSchemaGrantsNoOtherRoleAnything: a login role with no grant reads, writes and runs
// nothing the schema creates but the list of captured tables (SELECT), the incarnation row (SELECT, INSERT of a new one), the unit function (a
// pure computation) and the retention function, which runs with its caller's rights and so
// reads no token and deletes no row for it.
func TestLiveSchemaGrantsNoOtherRoleAnything(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	role, other := e.withRole("other")
	for _, table := range []string{"datastore_changelog", "resume_tokens",
		"datastore_changelog_parked", "datastore_changelog_acks", "datastore_changelog_members", "datastore_changelog_ranges"} {
		_, err := other.Exec(`SELECT FROM ` + table)
		require.ErrorContains(t, err, "permission denied for table "+table)
		_, err = other.Exec(`DELETE FROM ` + table)
		require.ErrorContains(t, err, "permission denied for table "+table)
	}
	for _, seq := range []string{"datastore_changelog_id_seq", "datastore_changelog_parked_id_seq", "datastore_changelog_member_seq"} {
		_, err := other.Exec(`SELECT nextval($1)`, seq)
		require.ErrorContains(t, err, "permission denied for sequence "+seq)
	}
	_, err := other.Exec(`SELECT FROM datastore_changelog_captured`)
	require.NoError(t, err, "the captured tables are no secret: the catalog lists the triggers")
	requireRefused(t, other, `INSERT INTO datastore_changelog_captured (schema_name, table_name) VALUES ('pg_temp_3', 'items')`)
	requireRefused(t, other, `DELETE FROM datastore_changelog_captured`)
	_, err = other.Exec(`SELECT incarnation FROM datastore_changelog_incarnation`)
	require.NoError(t, err, "any watcher reads the incarnation")
	_, err = other.Exec(`UPDATE datastore_changelog_incarnation SET incarnation = gen_random_uuid()`)
	require.ErrorContains(t, err, "permission denied")
	pgtest.Exec(t, e.db, `INSERT INTO datastore_changelog_incarnation DEFAULT VALUES ON CONFLICT DO NOTHING`) // a watcher's
	seen := pgtest.Scalar[string](t, other, `SELECT incarnation::text FROM datastore_changelog_incarnation`)
	pgtest.Exec(t, e.db, `DELETE FROM datastore_changelog_incarnation`) // what crash recovery does
	_, err = other.Exec(`INSERT INTO datastore_changelog_incarnation (incarnation) VALUES ($1)`, seen)
	require.ErrorContains(t, err, "permission denied", "it cannot put back the value watchers saw before the crash")
	_, err = other.Exec(`INSERT INTO datastore_changelog_incarnation DEFAULT VALUES ON CONFLICT DO NOTHING`)
	require.NoError(t, err, "it inserts a new one, as a watcher does")
	require.NotEqual(t, seen, pgtest.Scalar[string](t, e.db, `SELECT incarnation::text FROM datastore_changelog_incarnation`))
	require.Equal(t, UnitOf("k"), pgtest.Scalar[int](t, other, `SELECT datastore_changelog_unit('k')`))
	_, err = other.Exec(`SELECT datastore_changelog_prune()`)
	require.ErrorContains(t, err, "permission denied for table resume_tokens")
	require.False(t, pgtest.Scalar[bool](t, e.db, `SELECT has_function_privilege($1, 'log_table_changes()', 'EXECUTE')`,
		strings.Trim(role, `"`)), "no EXECUTE on the trigger function")
}
