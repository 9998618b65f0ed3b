package pgchangestream

import (
	"context"
	"database/sql"
	"testing"

	"github.com/pgchangestream/pgchangestream/internal/pgtest"
)

// The legacy schema: the changelog an existing installation has, never upgraded by
// InstallSchema (no transaction-id column). The watcher reads it in (changed_at, id) order, with
// late-row recovery through NOTIFY; the tests of that legacy behaviour and of the switch-over to
// the upgraded schema start from copies of legacyTemplate.

// existingSchema is the schema this library replaces, as an existing installation has it: a
// UUID record_id, the old trigger function, the partial resume index, and one captured table.
const existingSchema = `
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

// legacyTemplate is a database with existingSchema and the table "items" captured by the existing
// trigger function.
const legacyTemplate = "pgchangestream_legacy"

func setupLegacyTemplate(ctx context.Context, db *sql.DB) error {
	_, err := db.ExecContext(ctx, existingSchema+`;
CREATE TABLE items (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    n int NOT NULL,
    doc jsonb NOT NULL DEFAULT '{}');
CREATE TRIGGER items_changes AFTER INSERT OR UPDATE OR DELETE ON items
    FOR EACH ROW EXECUTE FUNCTION log_table_changes();`)
	return err
}

// newLegacy gives the test a fresh database with the legacy schema on the shared server.
func newLegacy(t *testing.T) *liveEnv {
	t.Helper()
	return newEnvFrom(t, pgtest.Shared(t), legacyTemplate, setupLegacyTemplate)
}
