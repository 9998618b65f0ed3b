package pgchangestream

import (
	"context"
	"database/sql"
	"testing"

	"github.com/pgchangestream/pgchangestream/internal/pgtest"
)

// The legacy schema: the changelog an existing installation has, never upgraded by
// schema.Install (no transaction-id column). The watcher reads it in (changed_at, id) order, with
// late-row recovery through NOTIFY; the tests of that legacy behaviour and of the switch-over to
// the upgraded schema start from copies of legacyTemplate.

// existingSchema is the schema this library replaces, as an existing installation has it.
const existingSchema = pgtest.ExistingSchema

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
