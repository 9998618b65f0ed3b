package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGrantsCommands: revoke-writers prints the REVOKE of a writer's old grant (refusing, unless
// --ignore-replaceable, while the writer could replace the trigger function), restrict-reads
// and restrict-tokens (and their --print) enable the policies, unrestrict drops them.
func TestGrantsCommands(t *testing.T) {
	t.Parallel()
	db, dsn := newItemsDB(t)
	var name string
	require.NoError(t, db.QueryRow(`SELECT 'w_' || current_database()`).Scan(&name))
	role := `"` + name + `"`
	execSQL(t, db, `CREATE ROLE `+role, `GRANT INSERT ON datastore_changelog TO `+role)
	t.Cleanup(func() { execSQL(t, db, `DROP OWNED BY `+role, `DROP ROLE `+role) })

	code, stdout, stderr := runCmd(t, "grants", "revoke-writers", "--dsn", dsn)
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, `REVOKE INSERT ON TABLE "public"."datastore_changelog" FROM `+role+";\n", stdout)
	var owner string
	require.NoError(t, db.QueryRow(`SELECT quote_ident(current_user)`).Scan(&owner))
	execSQL(t, db, `GRANT `+owner+` TO `+role)
	code, _, stderr = runCmd(t, "grants", "revoke-writers", "--dsn", dsn)
	require.NotEqual(t, exitOK, code, "a writer with the owner's privileges can replace the trigger function")
	assert.Contains(t, stderr, "so it can replace the function")
	assert.Contains(t, stderr, "--ignore-replaceable")
	code, stdout, stderr = runCmd(t, "grants", "revoke-writers", "--dsn", dsn, "--ignore-replaceable")
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, `REVOKE INSERT ON TABLE "public"."datastore_changelog" FROM `+role+";\n", stdout)
	execSQL(t, db, `REVOKE `+owner+` FROM `+role)

	code, stdout, stderr = runCmd(t, "grants", "restrict-tokens", "--dsn", dsn, "--print", name, "a", `it's "b"`)
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, `CREATE POLICY pgchangestream_role_`+name+` ON "resume_tokens" AS RESTRICTIVE FOR ALL TO `+
		name+` USING (client_name = ANY (E'{a,"it''s \\"b\\""}'::text[]));`)
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM pg_policies`).Scan(&n))
	assert.Zero(t, n, "--print changes nothing")
	code, _, stderr = runCmd(t, "grants", "restrict-reads", "--dsn", dsn, name, "it's")
	require.Equal(t, exitUsage, code, "a table name is an identifier")
	assert.Contains(t, stderr, "not a valid identifier")

	policies := func() string {
		var s string
		require.NoError(t, db.QueryRow(`SELECT string_agg(tablename || ':' || policyname, ',' ORDER BY tablename, policyname)
			FROM pg_policies`).Scan(&s))
		return s
	}
	for _, args := range [][]string{{"restrict-reads", name, "items"}, {"restrict-tokens", name, "a", "o'b"}} {
		code, stdout, stderr = runCmd(t, append([]string{"grants", args[0], "--dsn", dsn}, args[1:]...)...)
		require.Equal(t, exitOK, code, stderr)
		assert.True(t, strings.HasPrefix(stdout, "role "+name+" restricted to "), stdout)
	}
	p := "pgchangestream_role_" + name
	open := "datastore_changelog:pgchangestream_open,datastore_changelog_acks:pgchangestream_open," +
		"datastore_changelog_members:pgchangestream_open,datastore_changelog_parked:pgchangestream_open," +
		"datastore_changelog_ranges:pgchangestream_open,resume_tokens:pgchangestream_open"
	assert.Equal(t, "datastore_changelog:pgchangestream_open,datastore_changelog:"+p+
		",datastore_changelog_acks:pgchangestream_open,datastore_changelog_acks:"+p+
		",datastore_changelog_members:pgchangestream_open,datastore_changelog_members:"+p+
		",datastore_changelog_parked:pgchangestream_open,datastore_changelog_parked:pgchangestream_read_"+name+
		",datastore_changelog_parked:"+p+
		",datastore_changelog_ranges:pgchangestream_open,datastore_changelog_ranges:"+p+
		",resume_tokens:pgchangestream_open,resume_tokens:"+p, policies())
	code, _, stderr = runCmd(t, "grants", "unrestrict", "--dsn", dsn, name)
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, open, policies())
}
