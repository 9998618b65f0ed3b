package pgtest

import (
	"database/sql"
	"strings"
	"testing"
)

// Exec runs one or more statements, failing the test on an error.
func Exec(t testing.TB, db *sql.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(t.Context(), query, args...); err != nil {
		t.Fatalf("exec %s: %v", query, err)
	}
}

// Scalar returns the single value of query, failing the test on an error.
func Scalar[T any](t testing.TB, db *sql.DB, query string, args ...any) T {
	t.Helper()
	var v T
	if err := db.QueryRowContext(t.Context(), query, args...).Scan(&v); err != nil {
		t.Fatalf("query %s: %v", query, err)
	}
	return v
}

// Explain runs an EXPLAIN statement and returns its plan text, failing the test on an error.
func Explain(t testing.TB, db *sql.DB, query string, args ...any) string {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), query, args...)
	if err != nil {
		t.Fatalf("explain %s: %v", query, err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatalf("explain %s: %v", query, err)
		}
		lines = append(lines, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("explain %s: %v", query, err)
	}
	return strings.Join(lines, "\n")
}

// ExistingSchema is the schema the library replaces, as an existing installation has it: a
// UUID record_id, the old trigger function, the partial resume index, and one captured table.
const ExistingSchema = `
CREATE TABLE datastore_changelog (
    id BIGSERIAL PRIMARY KEY,
    table_name VARCHAR(100) NOT NULL,
    record_id UUID NOT NULL,
    operation VARCHAR(20) NOT NULL,
    old_values JSONB,
    new_values JSONB,
    changed_at TIMESTAMPTZ DEFAULT NOW(),
    processed BOOLEAN DEFAULT FALSE);
CREATE INDEX idx_changelog_unprocessed ON datastore_changelog (changed_at) WHERE processed = FALSE;
CREATE INDEX idx_changelog_table_record ON datastore_changelog (table_name, record_id);
CREATE INDEX idx_changelog_resume ON datastore_changelog (table_name, changed_at, id) WHERE processed = FALSE;
CREATE TABLE resume_tokens (
    client_name VARCHAR(255) PRIMARY KEY,
    resume_token JSONB NOT NULL,
    last_updated TIMESTAMPTZ DEFAULT NOW());
CREATE FUNCTION log_table_changes() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE new_id BIGINT;
BEGIN
    INSERT INTO datastore_changelog (table_name, record_id, operation, old_values, new_values)
    VALUES (TG_TABLE_NAME, COALESCE(NEW.id, OLD.id), TG_OP,
            CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END,
            CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END)
    RETURNING id INTO new_id;
    PERFORM pg_notify('nvsentinel_changes',
        json_build_object('id', new_id, 'table', TG_TABLE_NAME, 'operation', TG_OP)::text);
    RETURN COALESCE(NEW, OLD);
END $$;
CREATE TABLE health_events (id UUID PRIMARY KEY DEFAULT gen_random_uuid(), item TEXT);
CREATE TRIGGER health_events_changes AFTER INSERT OR UPDATE OR DELETE ON health_events
    FOR EACH ROW EXECUTE FUNCTION log_table_changes();`
