package schema

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
)

func TestCaptureRejectsBadKeyPaths(t *testing.T) {
	for _, ok := range []string{"a", "document.healthevent.nodename", "A_1.b2", "1.2.3.4.5.6.7.8", "_"} {
		_, err := captureSQL("orders", Options{Key: ok})
		require.NoError(t, err, ok)
	}
	for _, tc := range []struct{ path, want string }{
		{"a..b", "part 2 is empty"},
		{".a", "part 1 is empty"},
		{"a.", "part 2 is empty"},
		{".", "part 1 is empty"},
		{"a.b-c", `"b-c" holds a character other than`},
		{"a'b", `"a'b" holds a character other than`},
		{"a b", "holds a character other than"},
		{"nodé", "holds a character other than"},
		{"a\x00b", "holds a character other than"},
		{"1.2.3.4.5.6.7.8.9", "has 9 parts, more than 8"},
	} {
		_, err := captureSQL("orders", Options{Key: tc.path})
		require.ErrorIs(t, err, ErrInvalidConfig, tc.path)
		require.ErrorContains(t, err, "pgchangestream: invalid config: schema.Options.Key: ", tc.path)
		require.ErrorContains(t, err, tc.want, tc.path)
	}
	_, err := installSQL(Options{Key: "a..b"})
	require.NoError(t, err, "Install ignores the key")
}

func TestTriggerArgs(t *testing.T) {
	for _, tc := range []struct {
		quiet bool
		key   string
		want  string
	}{
		{false, "", "'notify'"},
		{true, "", "'no_notify'"},
		{false, "a.b", "'notify', 'key=a.b'"},
		{true, "document.healthevent.nodename", "'no_notify', 'key=document.healthevent.nodename'"},
	} {
		assert.Equal(t, tc.want, triggerArgs(tc.quiet, tc.key))
	}
}

func TestCaptureDryRunKey(t *testing.T) {
	for _, tc := range []struct {
		table    string
		opts     Options
		args     string
		explicit string
	}{
		{"orders", Options{}, `('notify')`, "NULL"},
		{"health_events", Options{}, `('notify', 'key=document.healthevent.nodename')`, "NULL"},
		{"s.health_events", Options{WithoutNotify: true}, `('no_notify', 'key=document.healthevent.nodename')`, "NULL"},
		{"health_events", Options{Key: "document.id"}, `('notify', 'key=document.id')`, "'document.id'"},
		{"orders", Options{Key: "customer"}, `('notify', 'key=customer')`, "'customer'"},
	} {
		stmts, err := captureSQL(tc.table, tc.opts)
		require.NoError(t, err)
		assert.Contains(t, stmts[0], `FOR EACH ROW EXECUTE FUNCTION "log_table_changes"`+tc.args+`;`, tc.table)
		assert.Contains(t, stmts[0], "explicit_key text := "+tc.explicit+";", tc.table)
	}
}

func TestSharedNames(t *testing.T) {
	assert.Equal(t, "audit.changes_unit", changelog.UnitFunction("audit.changes"))
	assert.Equal(t, `COALESCE(unit, "audit"."changes_unit"(record_id::text))`, changelog.UnitExpression("audit.changes"))
	assert.Equal(t, "audit.changes_members", changelog.MemberTable("audit.changes"))
	assert.Equal(t, "audit.changes_member_seq", changelog.MemberSequence("audit.changes"))
	assert.Equal(t, "audit.changes_ranges", changelog.RangeTable("audit.changes"))
	indexes, err := changelogIndexes("audit.changes")
	require.NoError(t, err)
	assert.Equal(t, "changes_txid_unit_idx", indexes[1].name)
	_, err = changelogIndexes(strings.Repeat("c", 50))
	require.ErrorContains(t, err, `its index name "`+strings.Repeat("c", 50)+`_txid_unit_idx" would exceed 63 bytes`)
}

// unitKeys returns keys of every kind a row may hold: empty, short, numeric, unicode, uuids and
// long strings.
func unitKeys(t *testing.T) []string {
	keys := []string{"", "a", "A", " ", "node-1", "héllo", "日本語のノード", "🚀🌍", "\t\n", "'; DROP TABLE x; --", `\x00`}
	for i := range 1500 {
		keys = append(keys, fmt.Sprint(i), fmt.Sprintf("gpu-node-%04d.cluster.local", i))
	}
	for range 1000 {
		b := make([]byte, 16)
		_, err := rand.Read(b)
		require.NoError(t, err)
		keys = append(keys, fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:]))
	}
	for i := range 20 {
		keys = append(keys, strings.Repeat("long key ü ", 100*(i+1)))
	}
	return keys
}

func TestLiveUnitFunctionMatchesUnitOf(t *testing.T) {
	db, _ := pgtest.NewDatabase(t, "")
	require.NoError(t, errOf(Install(t.Context(), db, Options{})))
	keys := unitKeys(t)
	rows, err := db.QueryContext(t.Context(), `SELECT k, datastore_changelog_unit(k) FROM unnest($1::text[]) k`, keys)
	require.NoError(t, err)
	defer rows.Close()
	units := map[int]bool{}
	n := 0
	for rows.Next() {
		var key string
		var unit int
		require.NoError(t, rows.Scan(&key, &unit))
		require.Equal(t, changelog.UnitOf(key), unit, "key %q", key)
		units[unit] = true
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, len(keys), n)
	require.Greater(t, len(units), 900, "the units spread over the 1024")
	assert.Equal(t, "i true s", pgtest.Scalar[string](t, db, `SELECT provolatile::text || ' ' || proisstrict || ' ' || proparallel::text
		FROM pg_proc WHERE oid = 'datastore_changelog_unit(text)'::regprocedure`))
	var null sql.NullInt64
	require.NoError(t, db.QueryRow(`SELECT datastore_changelog_unit(NULL)`).Scan(&null))
	require.False(t, null.Valid)
}

func TestLiveSharedObjects(t *testing.T) {
	db, _ := pgtest.NewDatabase(t, "")
	for range 2 {
		require.NoError(t, errOf(Install(t.Context(), db, Options{})))
	}
	require.Equal(t, pgtest.WantSharedState("record_id"), pgtest.SharedState(t, db))
	indexes := changelogIndexState(t, db)
	require.NotContains(t, indexes, "datastore_changelog_txid_idx", "a new changelog gets the unit index instead")

	member := pgtest.Scalar[int64](t, db, `INSERT INTO datastore_changelog_members (client_name, member, name, lease_until)
		VALUES ('c', nextval('datastore_changelog_member_seq'), 'm', now()) RETURNING member`)
	pgtest.Exec(t, db, `INSERT INTO datastore_changelog_ranges (client_name, range_no, owner, resume_token) VALUES ('c', 63, $1, '{}')`, member)
	_, err := db.Exec(`INSERT INTO datastore_changelog_ranges (client_name, range_no, resume_token) VALUES ('c', 64, '{}')`)
	require.ErrorContains(t, err, "violates check constraint")
}

// TestLiveUpgradedChangelogKeepsTxidIndex: a changelog upgraded by an earlier release has
// the txid column and the plain txid index; Install adds the unit column and builds the
// unit index beside it, dropping nothing.
func TestLiveUpgradedChangelogKeepsTxidIndex(t *testing.T) {
	db, _ := pgtest.NewDatabase(t, "")
	pgtest.Exec(t, db, pgtest.ExistingSchema)
	pgtest.Exec(t, db, `ALTER TABLE datastore_changelog ADD COLUMN txid xid8 DEFAULT pg_current_xact_id();
		CREATE INDEX datastore_changelog_txid_idx ON datastore_changelog (table_name, txid, id)`)
	fillChangelog(t, db, 5000)
	for range 2 {
		require.NoError(t, errOf(Install(t.Context(), db, Options{})))
	}
	indexes := changelogIndexState(t, db)
	assert.True(t, indexes["datastore_changelog_txid_idx"], "kept")
	assert.True(t, indexes["datastore_changelog_txid_unit_idx"], "built")
	assert.Equal(t, pgtest.WantSharedState("(record_id)::text"), pgtest.SharedState(t, db))
	assert.Equal(t, 5000, pgtest.Scalar[int](t, db, `SELECT count(*) FROM datastore_changelog WHERE unit IS NULL`))
}

func TestLiveCaptureKey(t *testing.T) {
	db, dsn := pgtest.NewDatabase(t, "")
	require.NoError(t, errOf(Install(t.Context(), db, Options{})))
	pgtest.Exec(t, db, `CREATE TABLE health_events (id UUID PRIMARY KEY DEFAULT gen_random_uuid(), document JSONB,
			created_at TIMESTAMPTZ DEFAULT now());
		CREATE TABLE docs (id BIGSERIAL PRIMARY KEY, document JSONB);
		CREATE TABLE plain (id BIGSERIAL PRIMARY KEY, item TEXT);
		CREATE TABLE quiet (id BIGSERIAL PRIMARY KEY, item TEXT);
		CREATE TABLE both_args (id BIGSERIAL PRIMARY KEY, document JSONB);
		CREATE TRIGGER quiet_changes AFTER INSERT OR UPDATE OR DELETE ON quiet
			FOR EACH ROW EXECUTE FUNCTION log_table_changes('no_notify');
		CREATE TRIGGER both_args_changes AFTER INSERT OR UPDATE OR DELETE ON both_args
			FOR EACH ROW EXECUTE FUNCTION log_table_changes('key=document.k', 'no_notify');`)
	require.NoError(t, errOf(Capture(t.Context(), db, "health_events", Options{})))
	for range 2 {
		require.NoError(t, errOf(Capture(t.Context(), db, "docs", Options{Key: "document.k"})))
	}
	require.NoError(t, errOf(Capture(t.Context(), db, "plain", Options{})))

	// The default key of health_events, on insert, update (the new row's key) and delete (the
	// old row's).
	for i := range 50 {
		node := fmt.Sprintf("node-%d", i)
		pgtest.Exec(t, db, `INSERT INTO health_events (document) VALUES (jsonb_build_object('healthevent', jsonb_build_object('nodename', $1::text)))`, node)
		require.Equal(t, pgtest.Keyed(changelog.UnitOf(node)), pgtest.LastUnit(t, db, "health_events"), node)
	}
	id := pgtest.Scalar[string](t, db, `INSERT INTO health_events (document) VALUES ('{"healthevent": {"nodename": "a"}}') RETURNING id::text`)
	pgtest.Exec(t, db, `UPDATE health_events SET document = '{"healthevent": {"nodename": "b"}}' WHERE id = $1`, id)
	require.Equal(t, pgtest.Keyed(changelog.UnitOf("b")), pgtest.LastUnit(t, db, "health_events"))
	pgtest.Exec(t, db, `DELETE FROM health_events WHERE id = $1`, id)
	require.Equal(t, pgtest.Keyed(changelog.UnitOf("b")), pgtest.LastUnit(t, db, "health_events"))
	// A row without the key path falls back to its record id.
	id = pgtest.Scalar[string](t, db, `INSERT INTO health_events (document) VALUES ('{"other": 1}') RETURNING id::text`)
	require.Equal(t, pgtest.UnitRow{Expr: changelog.UnitOf(id)}, pgtest.LastUnit(t, db, "health_events"))
	pgtest.Exec(t, db, `INSERT INTO health_events (document) VALUES (NULL)`)
	require.False(t, pgtest.LastUnit(t, db, "health_events").Unit.Valid)

	// An explicit key; a number at the path counts as its text.
	pgtest.Exec(t, db, `INSERT INTO docs (document) VALUES ('{"k": 42}')`)
	require.Equal(t, pgtest.Keyed(changelog.UnitOf("42")), pgtest.LastUnit(t, db, "docs"))
	pgtest.Exec(t, db, `INSERT INTO docs (document) VALUES ('{"k": "x"}')`)
	require.Equal(t, pgtest.Keyed(changelog.UnitOf("x")), pgtest.LastUnit(t, db, "docs"))

	// No key: the unit stays NULL, the expression is the record id's unit.
	id = pgtest.Scalar[string](t, db, `INSERT INTO plain (item) VALUES ('a') RETURNING id::text`)
	require.Equal(t, pgtest.UnitRow{Expr: changelog.UnitOf(id)}, pgtest.LastUnit(t, db, "plain"))

	// Triggers created with 'no_notify' alone and with both arguments in the other order keep
	// working: their rows are written and not notified; the notification of the next row of a
	// notifying table is the first one received after LISTEN.
	listener := liveListen(t, dsn)
	id = pgtest.Scalar[string](t, db, `INSERT INTO quiet (item) VALUES ('a') RETURNING id::text`)
	require.Equal(t, pgtest.UnitRow{Expr: changelog.UnitOf(id)}, pgtest.LastUnit(t, db, "quiet"))
	pgtest.Exec(t, db, `INSERT INTO both_args (document) VALUES ('{"k": "y"}')`)
	require.Equal(t, pgtest.Keyed(changelog.UnitOf("y")), pgtest.LastUnit(t, db, "both_args"))
	plainID := pgtest.Scalar[int64](t, db, `INSERT INTO plain (item) VALUES ('b') RETURNING id`)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Contains(t, n.Payload, `"table" : "plain"`, "no notification of the quiet tables, record %d", plainID)

	// The existing triggers' arguments are read back: kept when they agree or no key is given,
	// reported when they do not.
	require.NoError(t, errOf(Capture(t.Context(), db, "quiet", Options{WithoutNotify: true})))
	require.NoError(t, errOf(Capture(t.Context(), db, "both_args", Options{WithoutNotify: true, Key: "document.k"})))
	require.NoError(t, errOf(Capture(t.Context(), db, "docs", Options{})), "no key given: kept")
	require.NoError(t, errOf(Capture(t.Context(), db, "plain", Options{})))
	err = errOf(Capture(t.Context(), db, "quiet", Options{}))
	require.ErrorContains(t, err, `trigger quiet_changes on quiet exists and does not notify: drop it to capture changes with NOTIFY`)
	err = errOf(Capture(t.Context(), db, "docs", Options{Key: "document.other"}))
	require.ErrorContains(t, err, `trigger docs_changes on docs exists with key document.k, not document.other: drop it to change the key`)
	err = errOf(Capture(t.Context(), db, "plain", Options{Key: "item"}))
	require.ErrorContains(t, err, `trigger plain_changes on plain exists with key (the record id), not item`)
	err = errOf(Capture(t.Context(), db, "quiet", Options{WithoutNotify: true, Key: "item"}))
	require.ErrorContains(t, err, `trigger quiet_changes on quiet exists with key (the record id), not item`)
	for _, table := range []string{"health_events", "docs", "plain", "quiet", "both_args"} {
		assert.Equal(t, 1, triggerCount(t, db, table))
	}
}

// TestLiveUnitIndexCond: a read of one (txid, id) range of a table restricted to a span of
// units is a scan of the unit index with the unit condition among its index conditions, so
// index tuples of other units are skipped before the heap is visited.
func TestLiveUnitIndexCond(t *testing.T) {
	db, _ := pgtest.NewDatabase(t, "")
	require.NoError(t, errOf(Install(t.Context(), db, Options{})))
	fillChangelog(t, db, 20000)
	var lo, hi string
	var loID, hiID int64
	require.NoError(t, db.QueryRow(`SELECT txid::text, id FROM datastore_changelog WHERE table_name = 'table_1'
		ORDER BY txid, id OFFSET 100 LIMIT 1`).Scan(&lo, &loID))
	require.NoError(t, db.QueryRow(`SELECT txid::text, id FROM datastore_changelog WHERE table_name = 'table_1'
		ORDER BY txid, id OFFSET 1100 LIMIT 1`).Scan(&hi, &hiID))
	plan := pgtest.Explain(t, db, `EXPLAIN (COSTS OFF) SELECT id FROM datastore_changelog
		WHERE table_name = $1 AND (txid, id) > ($2::xid8, $3) AND (txid, id) <= ($4::xid8, $5)
		AND `+changelog.UnitExpression(changelog.DefaultChangelogTable)+` BETWEEN 256 AND 511 ORDER BY txid, id`,
		"table_1", lo, loID, hi, hiID)
	assert.Regexp(t, `(Index (Only )?Scan using|Bitmap Index Scan on) datastore_changelog_txid_unit_idx`, plan)
	assert.Regexp(t, `Index Cond: .*ROW\(txid, id\) > .*COALESCE\(unit, .*>= 256\).*<= 511\)`, plan)
	assert.NotContains(t, plan, "Filter:")
}

// TestLiveCaptureKeyWithoutUnitColumn: on a changelog without the unit column (not yet
// upgraded, or before PostgreSQL 13) the default key of health_events is left out, and a key
// given is refused before any trigger is created.
func TestLiveCaptureKeyWithoutUnitColumn(t *testing.T) {
	db, _ := pgtest.NewDatabase(t, "")
	pgtest.Exec(t, db, pgtest.ExistingSchema)
	pgtest.Exec(t, db, `CREATE SCHEMA s; CREATE TABLE s.health_events (id UUID PRIMARY KEY DEFAULT gen_random_uuid(), document JSONB);
		CREATE TABLE docs (id UUID PRIMARY KEY DEFAULT gen_random_uuid(), document JSONB)`)
	require.NoError(t, errOf(Capture(t.Context(), db, "s.health_events", Options{})))
	assert.Equal(t, []string{"notify"}, pgtest.TriggerArgs(t, db, "health_events"), "the default key is left out")
	err := errOf(Capture(t.Context(), db, "docs", Options{Key: "document.k"}))
	require.ErrorContains(t, err, `changelog table datastore_changelog has no column "unit" for the key document.k`)
	assert.Equal(t, 0, triggerCount(t, db, "docs"))
}
