package pgtest

import (
	"database/sql"
	"testing"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// The state of the default changelog (datastore_changelog) that tests of the schema and of the
// watcher both check.

// TriggerArgs returns the arguments of table's capture trigger.
func TriggerArgs(t testing.TB, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), `SELECT unnest(array_remove(string_to_array(encode(tgargs, 'escape'), E'\\000'), ''))
		FROM pg_trigger WHERE tgname = $1`, changelog.TriggerName(table))
	if err != nil {
		t.Fatalf("read the arguments of trigger %s: %v", changelog.TriggerName(table), err)
	}
	defer rows.Close()
	var args []string
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			t.Fatalf("read the arguments of trigger %s: %v", changelog.TriggerName(table), err)
		}
		args = append(args, a)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read the arguments of trigger %s: %v", changelog.TriggerName(table), err)
	}
	return args
}

// UnitRow is a changelog row's unit column and its unit expression.
type UnitRow struct {
	Unit sql.NullInt64
	Expr int
}

// Keyed is the UnitRow of a row whose key has the given unit.
func Keyed(unit int) UnitRow { return UnitRow{sql.NullInt64{Int64: int64(unit), Valid: true}, unit} }

// LastUnit returns the unit of table's newest changelog row.
func LastUnit(t testing.TB, db *sql.DB, table string) UnitRow {
	t.Helper()
	var r UnitRow
	if err := db.QueryRowContext(t.Context(), `SELECT unit, `+changelog.UnitExpression(changelog.DefaultChangelogTable)+
		` FROM datastore_changelog WHERE table_name = $1 ORDER BY id DESC LIMIT 1`, table).Scan(&r.Unit, &r.Expr); err != nil {
		t.Fatalf("read the unit of %s's last changelog row: %v", table, err)
	}
	return r
}

// SharedState describes the unit column, the unit index and the coordination tables.
func SharedState(t testing.TB, db *sql.DB) []string {
	t.Helper()
	return []string{
		Scalar[string](t, db, `SELECT format_type(atttypid, atttypmod) || ' not null ' || attnotnull || ' default ' || atthasdef
			FROM pg_attribute WHERE attrelid = 'datastore_changelog'::regclass AND attname = 'unit'`),
		Scalar[string](t, db, `SELECT pg_get_indexdef(indexrelid) || ' valid ' || indisvalid FROM pg_index
			WHERE indexrelid = 'datastore_changelog_txid_unit_idx'::regclass`),
		Scalar[string](t, db, `SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod) || ' ' || attnotnull, ', ' ORDER BY attnum)
			FROM pg_attribute WHERE attrelid = 'datastore_changelog_members'::regclass AND attnum > 0`),
		Scalar[string](t, db, `SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod) || ' ' || attnotnull, ', ' ORDER BY attnum)
			FROM pg_attribute WHERE attrelid = 'datastore_changelog_ranges'::regclass AND attnum > 0`),
		Scalar[string](t, db, `SELECT pg_get_constraintdef(oid) FROM pg_constraint
			WHERE conrelid = 'datastore_changelog_ranges'::regclass ORDER BY contype LIMIT 1`),
		Scalar[string](t, db, `SELECT 'sequence ' || to_regclass('datastore_changelog_member_seq')::text`),
	}
}

// WantSharedState is SharedState after schema.Install, with recordKey the record id as the
// index definition shows its text.
func WantSharedState(recordKey string) []string {
	return []string{
		"smallint not null false default false",
		`CREATE INDEX datastore_changelog_txid_unit_idx ON public.datastore_changelog USING btree (table_name, txid, id, ` +
			`COALESCE(unit, datastore_changelog_unit(` + recordKey + `))) valid true`,
		"client_name character varying(255) true, member bigint true, name text true, lease_until timestamp with time zone true, " +
			"joined_at timestamp with time zone true, valid_since timestamp with time zone true",
		"client_name character varying(255) true, range_no smallint true, owner bigint false, resume_token jsonb true, " +
			"last_updated timestamp with time zone true",
		"CHECK (((range_no >= 0) AND (range_no < 64)))",
		"sequence datastore_changelog_member_seq",
	}
}
