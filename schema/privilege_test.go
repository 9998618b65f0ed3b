package schema

import (
	"database/sql/driver"
	"strings"
	"testing"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/stretchr/testify/require"
)

// TestRestrictionsRejectBadInputBeforeAnyQuery: an empty list, an empty or too long role, a
// qualified or malformed table name and an empty client name are refused with ErrInvalidConfig,
// and nothing is sent to the database.
func TestRestrictionsRejectBadInputBeforeAnyQuery(t *testing.T) {
	db, mock := mockDB(t)
	long := strings.Repeat("r", changelog.MaxIdentifierLen)
	for _, tc := range []struct {
		name string
		err  func() error
		want string
	}{
		{"no tables", func() error { return errOf(RestrictReads(t.Context(), db, "r", nil, Options{})) }, "no table_name given"},
		{"no clients", func() error { return errOf(RestrictTokens(t.Context(), db, "r", []string{}, Options{})) }, "no client_name given"},
		{"empty role", func() error { return errOf(RestrictReads(t.Context(), db, "", []string{"a"}, Options{})) }, `"" is not a role name`},
		{"long role", func() error { return errOf(RestrictTokens(t.Context(), db, long, []string{"a"}, Options{})) }, "would exceed 63 bytes"},
		{"qualified table", func() error { return errOf(RestrictReads(t.Context(), db, "r", []string{"s.items"}, Options{})) }, "contains a dot"},
		{"bad table", func() error { return errOf(RestrictReads(t.Context(), db, "r", []string{"it's"}, Options{})) }, "not a valid identifier"},
		{"empty client", func() error { return errOf(RestrictTokens(t.Context(), db, "r", []string{"a", ""}, Options{})) }, `"" is not a client name`},
		{"bad changelog", func() error {
			return errOf(RestrictReads(t.Context(), db, "r", []string{"a"}, Options{ChangelogTable: "a;b"}))
		}, "schema.Options.ChangelogTable"},
		{"unrestrict empty role", func() error { return errOf(RemoveRestrictions(t.Context(), db, "", Options{})) }, "not a role name"},
	} {
		err := tc.err()
		require.ErrorIs(t, err, ErrInvalidConfig, tc.name)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	require.NoError(t, mock.ExpectationsWereMet())
}

// TestRevokeWriterGrantsRefusesBeforeTheUpgrade: while the trigger function still runs as the
// writer (or is missing), revoking its grants would break writes: no statement is returned, with
// DryRun or without.
func TestRevokeWriterGrantsRefusesBeforeTheUpgrade(t *testing.T) {
	db, mock := mockDB(t)
	args := []driver.Value{`"datastore_changelog"`, `"log_table_changes"()`, "log_table_changes"}
	cols := []string{"oid", "prosecdef", "pinned", "reads_args"}
	mock.ExpectQuery(revokeFunctionsSQL).WithArgs(args...).
		WillReturnRows(mock.NewRows(cols).AddRow("log_table_changes()", false, false, false))
	mock.ExpectQuery(revokeFunctionsSQL).WithArgs(args...).WillReturnRows(mock.NewRows(cols))
	for i, want := range []string{"is not SECURITY DEFINER", "run schema.Install first"} {
		res, err := RevokeWriterGrants(t.Context(), db, Options{DryRun: i == 0})
		require.ErrorContains(t, err, want)
		require.Nil(t, res.Statements)
	}
	require.NoError(t, mock.ExpectationsWereMet())
}

// TestRemoveRestrictionsDryRunNeedsNoDatabase: the drops are built without the server, so a dry
// run lists them with a nil db.
func TestRemoveRestrictionsDryRunNeedsNoDatabase(t *testing.T) {
	res, err := RemoveRestrictions(t.Context(), nil, "tenant", Options{ChangelogTable: "app.log", DryRun: true})
	require.NoError(t, err)
	require.Equal(t, []string{
		`DROP POLICY IF EXISTS "pgchangestream_role_tenant" ON "app"."log"`,
		`DROP POLICY IF EXISTS "pgchangestream_read_tenant" ON "app"."log_parked"`,
		`DROP POLICY IF EXISTS "pgchangestream_role_tenant" ON "resume_tokens"`,
		`DROP POLICY IF EXISTS "pgchangestream_role_tenant" ON "app"."log_parked"`,
		`DROP POLICY IF EXISTS "pgchangestream_role_tenant" ON "app"."log_acks"`,
		`DROP POLICY IF EXISTS "pgchangestream_role_tenant" ON "app"."log_members"`,
		`DROP POLICY IF EXISTS "pgchangestream_role_tenant" ON "app"."log_ranges"`,
	}, res.Statements)
}
