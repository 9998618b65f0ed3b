package schema

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
)

var schemaExecOK = sqlmock.NewResult(0, 0)

func schemaBoolRow(v bool) *sqlmock.Rows { return sqlmock.NewRows([]string{"v"}).AddRow(v) }

// expectStart expects a default Install run up to the index builds: the install lock, the
// script, and the invalid-index query, which returns the (schema, name) rows in invalid.
func expectStart(t *testing.T, mock sqlmock.Sqlmock, invalid ...[2]string) []string {
	t.Helper()
	stmts, err := installSQL(Options{})
	require.NoError(t, err)
	mock.ExpectQuery(tryInstallLockSQL).WithArgs(installLockKey).WillReturnRows(schemaBoolRow(true))
	mock.ExpectExec(stmts[0]).WillReturnResult(schemaExecOK)
	rows := sqlmock.NewRows([]string{"nspname", "relname"})
	for _, r := range invalid {
		rows.AddRow(r[0], r[1])
	}
	mock.ExpectQuery(invalidIndexesSQL).WithArgs(`"datastore_changelog"`).WillReturnRows(rows)
	return stmts
}

// expectBuilds expects the index builds of stmts and the release of the install lock.
func expectBuilds(mock sqlmock.Sqlmock, stmts []string) *sqlmock.ExpectedQuery {
	mock.ExpectQuery(serverVersionSQL).WillReturnRows(sqlmock.NewRows([]string{"v"}).AddRow(150000))
	for _, stmt := range stmts[1:] {
		mock.ExpectExec(stmt).WillReturnResult(schemaExecOK)
	}
	return mock.ExpectQuery(installUnlockSQL).WithArgs(installLockKey)
}

func TestInstallDryRunDefaults(t *testing.T) {
	stmts, err := installSQL(Options{})
	require.NoError(t, err)
	require.Len(t, stmts, 5)
	for _, want := range []string{
		fmt.Sprintf("SELECT pg_advisory_xact_lock(%d);", ddlLockKey),
		`changelog regclass := to_regclass('"datastore_changelog"');`,
		`CREATE TABLE "datastore_changelog" (`,
		"record_id  TEXT NOT NULL,",
		`CREATE INDEX IF NOT EXISTS "datastore_changelog_stream_idx" ON "datastore_changelog" (table_name, changed_at, id);`,
		`CREATE INDEX IF NOT EXISTS "idx_changelog_unprocessed" ON "datastore_changelog" (changed_at) WHERE processed = FALSE;`,
		`CREATE INDEX IF NOT EXISTS "idx_changelog_table_record" ON "datastore_changelog" (table_name, record_id);`,
		`ALTER TABLE "datastore_changelog" ADD COLUMN txid xid8;`,
		`ALTER TABLE "datastore_changelog" ALTER COLUMN txid SET DEFAULT pg_current_xact_id();`,
		`CREATE INDEX IF NOT EXISTS "datastore_changelog_txid_unit_idx" ON "datastore_changelog" (table_name, txid, id, (COALESCE(unit, "datastore_changelog_unit"(record_id::text))));`,
		"ALTER TABLE \"datastore_changelog\" ADD COLUMN unit smallint;",
		`CREATE OR REPLACE FUNCTION "datastore_changelog_unit"(key text) RETURNS smallint`,
		`CREATE SEQUENCE IF NOT EXISTS "datastore_changelog_member_seq";`,
		`CREATE TABLE IF NOT EXISTS "datastore_changelog_members" (`,
		`CREATE TABLE IF NOT EXISTS "datastore_changelog_ranges" (`,
		`CREATE TABLE IF NOT EXISTS "resume_tokens" (`,
		`CREATE OR REPLACE FUNCTION "log_table_changes"() RETURNS trigger`,
		`INSERT INTO "datastore_changelog" (table_name, record_id, operation, new_values)`,
		"VALUES (TG_TABLE_NAME, OLD.id, TG_OP, to_jsonb(OLD))",
		`CREATE TABLE "datastore_changelog_captured" (`,
		"WHERE fn IS NOT NULL AND t.tgfoid = fn AND c.relpersistence <> 't';",
		`IF NOT EXISTS (SELECT FROM "datastore_changelog_captured" k WHERE k.schema_name = TG_TABLE_SCHEMA AND k.table_name = TG_TABLE_NAME)`,
		"AND pg_has_role(c.relowner, current_user, 'USAGE')) THEN",
		"EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);",
		`IF COALESCE(row_security_active(to_regclass('"resume_tokens"')), false) AND EXISTS (`,
		"IF notify THEN\n        PERFORM pg_notify('nvsentinel_changes', json_build_object(\n" +
			"            'id', changelog_id, 'table', TG_TABLE_NAME, 'operation', TG_OP)::text);",
	} {
		assert.Contains(t, stmts[0], want)
	}
	assert.NotContains(t, stmts[0], "CONCURRENTLY")
	assert.Equal(t, []string{
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "datastore_changelog_stream_idx" ON "datastore_changelog" (table_name, changed_at, id)`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "datastore_changelog_txid_unit_idx" ON "datastore_changelog" (table_name, txid, id, (COALESCE(unit, "datastore_changelog_unit"(record_id::text))))`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "idx_changelog_unprocessed" ON "datastore_changelog" (changed_at) WHERE processed = FALSE`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "idx_changelog_table_record" ON "datastore_changelog" (table_name, record_id)`,
	}, stmts[1:])
}

func TestInstallDryRunNames(t *testing.T) {
	stmts, err := installSQL(Options{
		ChangelogTable: "audit.changes", TokenTable: "audit.tokens",
		NotifyChannel: "audit_events", FunctionName: "audit.log_changes",
	})
	require.NoError(t, err)
	for _, want := range []string{
		`changelog regclass := to_regclass('"audit"."changes"');`,
		`CREATE TABLE IF NOT EXISTS "audit"."tokens" (`,
		`CREATE OR REPLACE FUNCTION "audit"."log_changes"() RETURNS trigger`,
		"pg_notify('audit_events', ",
	} {
		assert.Contains(t, stmts[0], want)
	}
	assert.Equal(t, []string{
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "changes_stream_idx" ON "audit"."changes" (table_name, changed_at, id)`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "changes_txid_unit_idx" ON "audit"."changes" (table_name, txid, id, (COALESCE(unit, "audit"."changes_unit"(record_id::text))))`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "changes_unprocessed_idx" ON "audit"."changes" (changed_at) WHERE processed = FALSE`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "changes_table_record_idx" ON "audit"."changes" (table_name, record_id)`,
	}, stmts[1:])
}

func TestSchemaRejectsInvalidNames(t *testing.T) {
	const install, capture = 1, 2 // which calls reject the case
	for _, tc := range []struct {
		name, table, field string
		opts               Options
		rejectedBy         int
	}{
		{"changelog", "orders", "schema.Options.ChangelogTable", Options{ChangelogTable: "bad-name"}, install | capture},
		{"changelog dollars", "orders", "schema.Options.ChangelogTable", Options{ChangelogTable: "a$body$b"}, install | capture},
		{"changelog index too long", "orders", "schema.Options.ChangelogTable",
			Options{ChangelogTable: strings.Repeat("c", 50)}, install},
		{"token table", "orders", "schema.Options.TokenTable", Options{TokenTable: "a.b.c"}, install | capture},
		{"channel", "orders", "schema.Options.NotifyChannel", Options{NotifyChannel: "s.events"}, install | capture},
		{"function", "orders", "schema.Options.FunctionName", Options{FunctionName: "1fn"}, install | capture},
		{"table", "orders; DROP TABLE x", "schema.Capture table", Options{}, capture},
		{"empty table", "", "schema.Capture table", Options{}, capture},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, mock := mockDB(t)
			check := func(rejected bool, errs ...error) {
				for _, err := range errs {
					if !rejected {
						require.NoError(t, err)
						continue
					}
					require.ErrorIs(t, err, ErrInvalidConfig)
					assert.Contains(t, err.Error(), "pgchangestream: invalid config: "+tc.field+": ")
				}
			}
			_, sqlErr := installSQL(tc.opts)
			check(tc.rejectedBy&install != 0, sqlErr)
			if tc.rejectedBy&install != 0 {
				check(true, errOf(Install(t.Context(), db, tc.opts)))
			}
			_, sqlErr = captureSQL(tc.table, tc.opts)
			check(tc.rejectedBy&capture != 0, sqlErr)
			if tc.rejectedBy&capture != 0 {
				check(true, errOf(Capture(t.Context(), db, tc.table, tc.opts)))
			}
			require.NoError(t, mock.ExpectationsWereMet())
		})
	}
}

func TestInstallRunsStatementsInOrder(t *testing.T) {
	db, mock := mockDB(t)
	stmts := expectStart(t, mock)
	expectBuilds(mock, stmts).WillReturnRows(schemaBoolRow(true))

	res, err := Install(t.Context(), db, Options{})
	require.NoError(t, err)
	assert.Equal(t, stmts, res.Statements, "a run lists what it ran: what a dry run lists")
	require.NoError(t, mock.ExpectationsWereMet())
}

func TestInstallRebuildsInvalidIndex(t *testing.T) {
	db, mock := mockDB(t)
	stmts := expectStart(t, mock, [2]string{"public", "datastore_changelog_stream_idx"},
		[2]string{"public", "unrelated_idx"})
	mock.ExpectExec(`DROP INDEX CONCURRENTLY IF EXISTS "public"."datastore_changelog_stream_idx"`).
		WillReturnResult(schemaExecOK)
	expectBuilds(mock, stmts).WillReturnRows(schemaBoolRow(true))

	res, err := Install(t.Context(), db, Options{})
	require.NoError(t, err)
	assert.Equal(t, append([]string{stmts[0], `DROP INDEX CONCURRENTLY IF EXISTS "public"."datastore_changelog_stream_idx"`},
		stmts[1:]...), res.Statements, "the drop is listed among the statements run")
	require.NoError(t, mock.ExpectationsWereMet())
}

func TestInstallWrapsErrors(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name, want string
		fail       func(mock sqlmock.Sqlmock, stmts []string)
	}{
		{"script", "pgchangestream: install schema: create tables and trigger function: boom",
			func(mock sqlmock.Sqlmock, stmts []string) {
				mock.ExpectExec(stmts[0]).WillReturnError(boom)
			}},
		{"index build", "pgchangestream: install schema: build index datastore_changelog_stream_idx: boom",
			func(mock sqlmock.Sqlmock, stmts []string) {
				mock.ExpectExec(stmts[0]).WillReturnResult(schemaExecOK)
				mock.ExpectQuery(invalidIndexesSQL).WillReturnRows(sqlmock.NewRows([]string{"nspname", "relname"}))
				mock.ExpectQuery(serverVersionSQL).WillReturnRows(sqlmock.NewRows([]string{"v"}).AddRow(150000))
				mock.ExpectExec(stmts[1]).WillReturnError(boom)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, mock := mockDB(t)
			stmts, err := installSQL(Options{})
			require.NoError(t, err)
			mock.ExpectQuery(tryInstallLockSQL).WillReturnRows(schemaBoolRow(true))
			tc.fail(mock, stmts)
			mock.ExpectQuery(installUnlockSQL).WillReturnRows(schemaBoolRow(true))

			err = errOf(Install(t.Context(), db, Options{}))
			require.ErrorIs(t, err, boom)
			assert.EqualError(t, err, tc.want)
			require.NoError(t, mock.ExpectationsWereMet())
		})
	}
}

func TestInstallDiscardsConnectionWhenUnlockFails(t *testing.T) {
	db, mock := mockDB(t)
	expectBuilds(mock, expectStart(t, mock)).WillReturnError(errors.New("connection reset"))
	mock.ExpectClose() // the session, and its lock, end with the connection

	require.NoError(t, errOf(Install(t.Context(), db, Options{})))
	require.NoError(t, mock.ExpectationsWereMet())
}

func TestInstallWaitsForConcurrentInstall(t *testing.T) {
	t.Run("gets the lock", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			db, mock := mockDB(t)
			for range 2 {
				mock.ExpectQuery(tryInstallLockSQL).WithArgs(installLockKey).WillReturnRows(schemaBoolRow(false))
			}
			expectBuilds(mock, expectStart(t, mock)).WillReturnRows(schemaBoolRow(true))

			start := time.Now()
			require.NoError(t, errOf(Install(t.Context(), db, Options{})))
			assert.Equal(t, 2*installLockRetry, time.Since(start))
			require.NoError(t, mock.ExpectationsWereMet())
		})
	})
	t.Run("gives up with the context", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			db, mock := mockDB(t)
			for range 3 {
				mock.ExpectQuery(tryInstallLockSQL).WithArgs(installLockKey).WillReturnRows(schemaBoolRow(false))
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*installLockRetry/2)
			defer cancel()

			err := errOf(Install(ctx, db, Options{}))
			require.ErrorIs(t, err, context.DeadlineExceeded)
			assert.EqualError(t, err, "pgchangestream: install schema: wait for a concurrent install: context deadline exceeded")
			require.NoError(t, mock.ExpectationsWereMet())
		})
	})
}

func TestCaptureDryRun(t *testing.T) {
	long := strings.Repeat("t", 60)
	for _, tc := range []struct {
		table, trigger, on string
		opts               Options
	}{
		{"orders", "orders_changes", `"orders"`, Options{}},
		{"s.orders", "orders_changes", `"s"."orders"`, Options{}},
		{long, (long + "_changes")[:63], `"` + long + `"`, Options{}},
		{"orders", "orders_changes", `"orders"`, Options{ChangelogTable: "audit.changes", FunctionName: "audit.log_changes"}},
	} {
		t.Run(tc.table, func(t *testing.T) {
			stmts, err := captureSQL(tc.table, tc.opts)
			require.NoError(t, err)
			require.Len(t, stmts, 1)
			opts, err := tc.opts.resolve()
			require.NoError(t, err)
			for _, want := range []string{
				"DO $capture$",
				fmt.Sprintf("PERFORM pg_advisory_xact_lock(%d);", ddlLockKey),
				"target      regclass := to_regclass('" + tc.on + "');",
				"changelog   regclass := to_regclass('" + changelog.Quote(opts.ChangelogTable) + "');",
				"tgname = '" + tc.trigger + "'",
				fmt.Sprintf(`CREATE TRIGGER "%s" AFTER INSERT OR UPDATE OR DELETE ON %s`, tc.trigger, tc.on),
				"FOR EACH ROW EXECUTE FUNCTION " + changelog.Quote(opts.FunctionName) + "('notify');",
				"IF quiet <> false THEN",
				"INSERT INTO " + changelog.Quote(changelog.CapturedTable(opts.ChangelogTable)) + " (schema_name, table_name)",
			} {
				assert.Contains(t, stmts[0], want)
			}
		})
	}
}

func TestCaptureDryRunWithoutNotify(t *testing.T) {
	stmts, err := captureSQL("orders", Options{WithoutNotify: true})
	require.NoError(t, err)
	assert.Contains(t, stmts[0], `FOR EACH ROW EXECUTE FUNCTION "log_table_changes"('no_notify');`)
	assert.Contains(t, stmts[0], "IF quiet <> true THEN")
}

func TestCapture(t *testing.T) {
	db, mock := mockDB(t)
	stmts, err := captureSQL("s.orders", Options{})
	require.NoError(t, err)
	mock.ExpectExec(stmts[0]).WillReturnResult(schemaExecOK)
	mock.ExpectExec(stmts[0]).WillReturnError(errors.New("boom"))

	require.NoError(t, errOf(Capture(t.Context(), db, "s.orders", Options{})))
	err = errOf(Capture(t.Context(), db, "s.orders", Options{}))
	assert.EqualError(t, err, "pgchangestream: capture changes of s.orders: boom")
	require.NoError(t, mock.ExpectationsWereMet())
}

// changelogIndexState maps the changelog's index names to whether they are valid.
func changelogIndexState(t *testing.T, db *sql.DB) map[string]bool {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), `SELECT c.relname, i.indisvalid FROM pg_index i
		JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'datastore_changelog'::regclass`)
	require.NoError(t, err)
	defer rows.Close()
	state := map[string]bool{}
	for rows.Next() {
		var name string
		var valid bool
		require.NoError(t, rows.Scan(&name, &valid))
		state[name] = valid
	}
	require.NoError(t, rows.Err())
	return state
}

func recordIDType(t *testing.T, db *sql.DB) string {
	return pgtest.Scalar[string](t, db, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = 'datastore_changelog'::regclass AND attname = 'record_id'`)
}

func triggerCount(t *testing.T, db *sql.DB, table string) int {
	return pgtest.Scalar[int](t, db,
		"SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::text::regclass AND NOT tgisinternal", table)
}

// liveListen opens a connection listening on the default channel.
func liveListen(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(t.Context(), "LISTEN "+changelog.DefaultNotifyChannel)
	require.NoError(t, err)
	return conn
}

// checkCapture inserts, updates and deletes a row of table (columns id and item) and checks the
// changelog rows written and the notifications sent.
func checkCapture(t *testing.T, db *sql.DB, listener *pgx.Conn, table string) {
	t.Helper()
	id := pgtest.Scalar[string](t, db, "INSERT INTO "+table+" (item) VALUES ('a') RETURNING id::text")
	pgtest.Exec(t, db, "UPDATE "+table+" SET item = 'b' WHERE id::text = $1", id)
	pgtest.Exec(t, db, "DELETE FROM "+table+" WHERE id::text = $1", id)

	rows, err := db.QueryContext(t.Context(), `SELECT id, operation, old_values->>'item', new_values->>'item'
		FROM datastore_changelog WHERE table_name = $1 AND record_id::text = $2 ORDER BY id`, changelog.Unqualified(table), id)
	require.NoError(t, err)
	defer rows.Close()
	var got []string
	for rows.Next() {
		var changeID int64
		var op string
		var oldItem, newItem sql.NullString
		require.NoError(t, rows.Scan(&changeID, &op, &oldItem, &newItem))
		got = append(got, fmt.Sprintf("%s %s>%s", op, oldItem.String, newItem.String))

		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		n, err := listener.WaitForNotification(ctx)
		cancel()
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf(`{"id" : %d, "table" : "%s", "operation" : "%s"}`, changeID, changelog.Unqualified(table), op), n.Payload)
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []string{"INSERT >a", "UPDATE a>b", "DELETE b>"}, got, table)
}

// fillChangelog adds n changelog rows spread over four tables, one millisecond apart, and
// analyzes the table.
func fillChangelog(t *testing.T, db *sql.DB, n int) {
	pgtest.Exec(t, db, `INSERT INTO datastore_changelog (table_name, record_id, operation, new_values, changed_at)
		SELECT 'table_' || g % 4, gen_random_uuid(), 'INSERT', jsonb_build_object('n', g),
		       now() - interval '1 day' + g * interval '1 ms'
		FROM generate_series(1, $1::int) g`, n)
	pgtest.Exec(t, db, "ANALYZE datastore_changelog")
}

// requireStreamIndexScan checks that the read query, from an early and from a middle position,
// is a range scan of the stream index with the row comparison in its index condition: no sort,
// no filter.
func requireStreamIndexScan(t *testing.T, db *sql.DB) {
	t.Helper()
	for _, offset := range []int{10, 2500} {
		var at time.Time
		var id int64
		require.NoError(t, db.QueryRowContext(t.Context(), `SELECT changed_at, id FROM datastore_changelog
			WHERE table_name = 'table_1' ORDER BY changed_at, id OFFSET $1 LIMIT 1`, offset).Scan(&at, &id))
		plan := pgtest.Explain(t, db, `EXPLAIN (COSTS OFF) SELECT id, record_id, operation,
			old_values, new_values, changed_at FROM datastore_changelog WHERE table_name = $1
			AND (changed_at, id) > ($2, $3) ORDER BY changed_at, id LIMIT 100`, "table_1", at, id)
		assert.Regexp(t, `^Limit
  ->  Index Scan using datastore_changelog_stream_idx on datastore_changelog
        Index Cond: \(\(\(table_name\)::text = 'table_1'::text\) AND \(ROW\(changed_at, id\) > ROW\(.+\)\)\)$`,
			plan)
	}
}

// txidColumnState returns the type and default of the changelog's txid column.
func txidColumnState(t *testing.T, db *sql.DB) string {
	t.Helper()
	return pgtest.Scalar[string](t, db, `SELECT format_type(a.atttypid, NULL) || ' ' || pg_get_expr(d.adbin, d.adrelid)
		FROM pg_attribute a JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attrelid = 'datastore_changelog'::regclass AND a.attname = 'txid'`)
}

func TestLiveFreshInstall(t *testing.T) {
	db, dsn := pgtest.NewDatabase(t, "")
	for range 2 {
		require.NoError(t, errOf(Install(t.Context(), db, Options{})))
	}
	assert.Equal(t, "text", recordIDType(t, db))
	assert.Equal(t, map[string]bool{"datastore_changelog_pkey": true, "datastore_changelog_stream_idx": true,
		"datastore_changelog_txid_unit_idx": true, "idx_changelog_unprocessed": true, "idx_changelog_table_record": true},
		changelogIndexState(t, db))
	assert.Equal(t, "xid8 pg_current_xact_id()", txidColumnState(t, db))

	pgtest.Exec(t, db, `CREATE TABLE orders (id UUID PRIMARY KEY DEFAULT gen_random_uuid(), item TEXT);
		CREATE TABLE counters (id BIGSERIAL PRIMARY KEY, item TEXT);
		CREATE SCHEMA s;
		CREATE TABLE s.notes (id TEXT PRIMARY KEY DEFAULT md5(random()::text), item TEXT);
		CREATE TABLE no_id (key INT, item TEXT);`)
	listener := liveListen(t, dsn)
	for _, table := range []string{"orders", "counters", "s.notes"} {
		for range 2 {
			require.NoError(t, errOf(Capture(t.Context(), db, table, Options{})))
		}
		assert.Equal(t, 1, triggerCount(t, db, table))
		checkCapture(t, db, listener, table)
	}
	assert.Equal(t, 1, pgtest.Scalar[int](t, db, "SELECT count(*) FROM pg_trigger WHERE tgname = 'notes_changes'"))

	err := errOf(Capture(t.Context(), db, "missing", Options{}))
	assert.ErrorContains(t, err, `pgchangestream: capture changes of missing: ERROR: table "missing" does not exist`)
	err = errOf(Capture(t.Context(), db, "no_id", Options{}))
	assert.ErrorContains(t, err, `pgchangestream: capture changes of no_id: ERROR: table no_id has no column "id"`)
}

func TestLiveExistingSchema(t *testing.T) {
	db, dsn := pgtest.NewDatabase(t, "")
	pgtest.Exec(t, db, pgtest.ExistingSchema)
	fillChangelog(t, db, 20000)

	// Concurrent installs build the missing index once and all succeed.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = errOf(Install(t.Context(), db, Options{})) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, errOf(Install(t.Context(), db, Options{})))

	assert.Equal(t, "uuid", recordIDType(t, db))
	assert.Equal(t, map[string]bool{"datastore_changelog_pkey": true, "datastore_changelog_stream_idx": true,
		"datastore_changelog_txid_unit_idx": true, "idx_changelog_unprocessed": true, "idx_changelog_table_record": true,
		"idx_changelog_resume": true}, changelogIndexState(t, db))
	assert.Equal(t, "xid8 pg_current_xact_id()", txidColumnState(t, db))
	assert.Equal(t, 20000, pgtest.Scalar[int](t, db, "SELECT count(*) FROM datastore_changelog WHERE txid IS NULL"),
		"rows written before the upgrade keep a NULL txid: the table is not rewritten")
	assert.Contains(t, pgtest.Scalar[string](t, db, "SELECT prosrc FROM pg_proc WHERE proname = 'log_table_changes'"),
		"ELSIF TG_OP = 'UPDATE' THEN", "the existing function is replaced")

	// The existing trigger calls the new function.
	listener := liveListen(t, dsn)
	require.NoError(t, errOf(Capture(t.Context(), db, "health_events", Options{})))
	assert.Equal(t, 1, triggerCount(t, db, "health_events"))
	checkCapture(t, db, listener, "health_events")

	// A UUID record_id cannot take integer ids: refuse rather than break writes to the table.
	pgtest.Exec(t, db, "CREATE TABLE counters (id BIGSERIAL PRIMARY KEY, item TEXT)")
	err := errOf(Capture(t.Context(), db, "counters", Options{}))
	assert.ErrorContains(t, err, "ERROR: column counters.id is bigint, which datastore_changelog.record_id (uuid) cannot store")
	assert.Equal(t, 0, triggerCount(t, db, "counters"))

	requireStreamIndexScan(t, db)
}

func TestLiveReadQueryUsesStreamIndex(t *testing.T) {
	db, _ := pgtest.NewDatabase(t, "")
	require.NoError(t, errOf(Install(t.Context(), db, Options{})))
	fillChangelog(t, db, 20000)
	requireStreamIndexScan(t, db)
}

func TestLiveRebuildsInvalidIndex(t *testing.T) {
	db, _ := pgtest.NewDatabase(t, "")
	require.NoError(t, errOf(Install(t.Context(), db, Options{})))
	fillChangelog(t, db, 100)
	// A unique build over duplicate values fails and leaves an invalid index behind, as an
	// interrupted concurrent build does.
	pgtest.Exec(t, db, "DROP INDEX datastore_changelog_stream_idx")
	_, err := db.ExecContext(t.Context(),
		"CREATE UNIQUE INDEX CONCURRENTLY datastore_changelog_stream_idx ON datastore_changelog (table_name)")
	require.Error(t, err)
	require.False(t, changelogIndexState(t, db)["datastore_changelog_stream_idx"])

	require.NoError(t, errOf(Install(t.Context(), db, Options{})))
	assert.True(t, changelogIndexState(t, db)["datastore_changelog_stream_idx"])
	assert.Equal(t, "CREATE INDEX datastore_changelog_stream_idx ON public.datastore_changelog USING btree (table_name, changed_at, id)",
		pgtest.Scalar[string](t, db, "SELECT pg_get_indexdef('datastore_changelog_stream_idx'::regclass)"))
}
