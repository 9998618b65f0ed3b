package main

import (
	"database/sql"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// savedTokens returns the number of rows of the token table.
func savedTokens(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM resume_tokens`).Scan(&n))
	return n
}

// tokenTable returns the table client's saved token records.
func tokenTable(t *testing.T, db *sql.DB, client string) string {
	t.Helper()
	var table sql.NullString
	require.NoError(t, db.QueryRow(`SELECT resume_token->>'table' FROM resume_tokens WHERE client_name = $1`, client).Scan(&table))
	return table.String
}

// tailLines runs tail to its end and returns its output lines.
func tailLines(t *testing.T, args ...string) []string {
	t.Helper()
	code, stdout, stderr := runCmd(t, append([]string{"tail", "--mode", "polling", "--format", "pretty"}, args...)...)
	require.Equal(t, exitOK, code, stderr)
	if stdout == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
}

func TestTailEphemeralCountAndEnd(t *testing.T) {
	t.Parallel()
	db, dsn := newItemsDB(t)
	execSQL(t, db, `INSERT INTO items (name) VALUES ('a')`, `INSERT INTO items (name) VALUES ('b')`,
		`INSERT INTO items (name) VALUES ('c')`) // three transactions: three changed_at
	base := []string{"--dsn", dsn, "--table", "items"}

	assert.Len(t, tailLines(t, append(base, "--from", "beginning", "--exit-at-end")...), 3)
	assert.Empty(t, tailLines(t, append(base, "--exit-at-end")...), "newest: nothing to show")
	lines := tailLines(t, append(base, "--from-beginning", "-n", "2")...)
	require.Len(t, lines, 2)
	assert.True(t, strings.HasPrefix(lines[1], "2 insert"), lines[1])
	var second string
	require.NoError(t, db.QueryRow(`SELECT to_char(changed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
		FROM datastore_changelog WHERE id = 2`).Scan(&second))
	lines = tailLines(t, append(base, "--from", second, "--exit-at-end")...)
	require.Len(t, lines, 2, "from a time: the rows at or after it")
	assert.True(t, strings.HasPrefix(lines[0], "2 insert"), lines[0])
	assert.Zero(t, savedTokens(t, db), "tail without --client saves nothing")

	lines = tailLines(t, append(base, "--client", "named", "--from", "beginning", "--count", "2")...)
	require.Len(t, lines, 2)
	lines = tailLines(t, append(base, "--client", "named", "--exit-at-end")...)
	require.Len(t, lines, 1, "a named client resumes after what it acknowledged")
	assert.True(t, strings.HasPrefix(lines[0], "3 insert"), lines[0])
}

func TestTokenCommands(t *testing.T) {
	t.Parallel()
	db, dsn := newItemsDB(t)
	execSQL(t, db, `INSERT INTO items (name) VALUES ('a'), ('b'), ('c')`)
	require.Len(t, tailLines(t, "--dsn", dsn, "--table", "items", "--client", "c1", "--from", "beginning", "-n", "3"), 3)

	code, stdout, stderr := runCmd(t, "token", "list", "--dsn", dsn, "--format", "json")
	require.Equal(t, exitOK, code, stderr)
	var tokens []map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &tokens), stdout)
	require.Len(t, tokens, 1)
	assert.Equal(t, "c1", tokens[0]["client"])
	require.IsType(t, map[string]any{}, tokens[0]["token"], "the token is a JSON object")
	assert.Equal(t, float64(3), tokens[0]["token"].(map[string]any)["eventID"])
	assert.Contains(t, tokens[0], "saved_at", "named as in status")
	code, stdout, _ = runCmd(t, "token", "list", "--dsn", dsn)
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `(?m)^CLIENT +SAVED +TOKEN\nc1 +\S+ +\{"table": "items", "eventID": 3, "snapshot": "[0-9:,]+", "timestamp": `, stdout)

	code, stdout, stderr = runCmd(t, "token", "reset", "c1", "--to", "1", "--dsn", dsn, "--dry-run")
	require.Equal(t, exitOK, code, stderr)
	assert.Regexp(t, `^would reset client c1 to after row 1 \(changed_at \S+\); new token \{"timestamp":"\S+","eventID":1,"table":"items"\} \(token now \{.*\}\)\n$`, stdout)
	code, stdout, stderr = runCmd(t, "token", "reset", "c1", "--to", "2026-12-01T10:32:46Z", "--dsn", dsn, "--dry-run")
	require.Equal(t, exitOK, code, stderr)
	assert.Regexp(t, `^would reset client c1 to after every row written before 2026-12-01T10:32:46Z; new token `+
		`\{"timestamp":"2026-12-01T10:32:45.999999Z","eventID":9223372036854775807,"table":"items"\} \(token now`, stdout)
	assert.NotContains(t, stdout, "(2026-12-01T10:32:45.999999Z, 9223372036854775807)")
	code, stdout, stderr = runCmd(t, "token", "reset", "c1", "--to", "beginning", "--dsn", dsn, "--dry-run")
	require.Equal(t, exitOK, code, stderr)
	assert.Regexp(t, `^would reset client c1 to the beginning \(before every row\); new token `+
		`\{"timestamp":"0001-01-01T00:00:00Z","eventID":0,"table":"items"\} \(token now`, stdout)
	assert.Len(t, tailLines(t, "--dsn", dsn, "--table", "items", "--client", "c1", "--exit-at-end"), 0, "a dry run changes nothing")

	code, stdout, stderr = runCmd(t, "token", "reset", "c1", "--to", "1", "--dsn", dsn, "--yes")
	require.Equal(t, exitOK, code, stderr)
	assert.Regexp(t, `^reset client c1 to after row 1 \(changed_at \S+\); new token \{.*\} \(token was \{.*\}\)\n$`, stdout)
	assert.Len(t, tailLines(t, "--dsn", dsn, "--table", "items", "--client", "c1", "--exit-at-end", "--no-ack"), 2)

	code, _, stderr = runCmd(t, "token", "reset", "c1", "--to", "99", "--dsn", dsn, "--yes")
	assert.Equal(t, exitFailure, code)
	assert.Equal(t, "pgchangestream: token reset: changelog row 99 does not exist\n", stderr, "one prefix")

	// A mistyped client would leave a token that holds back prune: reset needs --table for it.
	code, _, stderr = runCmd(t, "token", "reset", "c2", "--to", "beginning", "--dsn", dsn, "--yes")
	assert.Equal(t, exitFailure, code)
	assert.Equal(t, "pgchangestream: token reset: client c2 has no saved token (is the name right?): "+
		"pass --table, the table its watcher reads, to create one\n", stderr)
	assert.Equal(t, 1, savedTokens(t, db), "nothing created")
	code, _, stderr = runCmd(t, "token", "reset", "c2", "--to", "beginning", "--table", "items", "--dsn", dsn, "--yes")
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, "items", tokenTable(t, db, "c2"))
	code, _, stderr = runCmd(t, "token", "reset", "c1", "--to", "2", "--dsn", dsn, "--yes")
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, "items", tokenTable(t, db, "c1"), "a reset keeps the table of the token")
	code, _, stderr = runCmd(t, "token", "delete", "c2", "--dsn", dsn, "--yes")
	require.Equal(t, exitOK, code, stderr)

	code, stdout, stderr = runCmd(t, "token", "delete", "c1", "--dsn", dsn, "--yes")
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, "deleted the token of client c1")
	assert.Zero(t, savedTokens(t, db))
	code, _, stderr = runCmd(t, "token", "delete", "c1", "--dsn", dsn, "--yes")
	assert.Equal(t, exitFailure, code)
	assert.Equal(t, "pgchangestream: token delete: client c1 has no saved token\n", stderr)
}

func TestPruneCommand(t *testing.T) {
	t.Parallel()
	db, dsn := newItemsDB(t)
	execSQL(t, db, `INSERT INTO items (name) VALUES ('a'), ('b'), ('c'), ('d')`)
	base := []string{"--dsn", dsn, "--table", "items", "--from", "beginning"}
	require.Len(t, tailLines(t, append(base, "--client", "fast", "-n", "3")...), 3)
	require.Len(t, tailLines(t, append(base, "--client", "slow", "-n", "1")...), 1)

	// A token of a table without rows holds back nothing.
	code, _, stderr := runCmd(t, "token", "reset", "typo", "--to", "beginning", "--table", "nosuch", "--dsn", dsn, "--yes")
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, "nosuch", tokenTable(t, db, "typo"))

	var stdout string
	code, stdout, stderr = runCmd(t, "prune", "--dsn", dsn, "--dry-run", "--older-than", "0s")
	require.Equal(t, exitOK, code, stderr)
	assert.Regexp(t, `^would delete 1 changelog rows older than 0s, passed by clients: fast, slow, typo
held back by client slow \(table items\): 3 rows; token saved \d+(ms|s) ago
held back by client fast \(table items\): 1 rows; token saved \d+(ms|s) ago
$`, stdout)

	code, stdout, stderr = runCmd(t, "prune", "--dsn", dsn, "--older-than", "0s", "--ignore-client", "slow", "--format", "json")
	require.Equal(t, exitOK, code, stderr)
	var summary pruneSummary
	require.NoError(t, json.Unmarshal([]byte(stdout), &summary), stdout)
	require.Len(t, summary.HeldBy, 1, stdout)
	fast := summary.HeldBy[0]
	assert.Equal(t, pruneHolder{Client: "fast", Table: fast.Table, Rows: 1, SavedAt: fast.SavedAt, AgeSeconds: fast.AgeSeconds}, fast)
	require.NotNil(t, fast.Table)
	assert.Equal(t, "items", *fast.Table)
	assert.Less(t, fast.AgeSeconds, 60.0)
	summary.HeldBy = nil
	assert.Equal(t, pruneSummary{Deleted: 3, Batches: 1, Clients: []string{"fast", "typo"}, Unresolved: []string{}}, summary)
	var left int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM datastore_changelog`).Scan(&left))
	assert.Equal(t, 1, left)

	code, stdout, stderr = runCmd(t, "prune", "--dsn", dsn)
	require.Equal(t, exitOK, code, stderr)
	assert.Equal(t, "deleted 0 changelog rows older than 1h0m0s, passed by clients: fast, slow, typo\n", stdout,
		"no row is old enough: none held back")

	// A token not saved for --stale-after is flagged.
	execSQL(t, db, `UPDATE resume_tokens SET last_updated = now() - interval '3 days' WHERE client_name = 'slow'`)
	code, stdout, stderr = runCmd(t, "prune", "--dsn", dsn, "--dry-run", "--older-than", "0s", "--ignore-client", "fast")
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, "\nheld back by client slow (table items): 1 rows; token saved 72h0m0s ago; stale: "+
		"is its watcher still running? ('token delete' it, or pass --ignore-client)\n")
	code, stdout, stderr = runCmd(t, "prune", "--dsn", dsn, "--dry-run", "--older-than", "0s", "--ignore-client", "fast",
		"--stale-after", "100h")
	require.Equal(t, exitOK, code, stderr)
	assert.NotContains(t, stdout, "stale")
}
