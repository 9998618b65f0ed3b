package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParkedListRetryDrop(t *testing.T) {
	t.Parallel()
	db, dsn := newItemsDB(t)
	execSQL(t, db, `INSERT INTO datastore_changelog_parked
		(client_name, event_key, table_name, changelog_id, event, error, attempts, blocking)
		VALUES ('c', 'items/1', 'items', 7, '{"operationType": "insert"}', 'boom', 5, TRUE),
		       ('d', 'items/2', 'items', 8, '{"operationType": "update"}', 'bang', 3, FALSE)`)
	base := []string{"--dsn", dsn}

	code, stdout, stderr := runCmd(t, append([]string{"parked", "list", "--client", "c", "--format", "json"}, base...)...)
	require.Equal(t, exitOK, code, stderr)
	var listed []listedParked
	require.NoError(t, json.Unmarshal([]byte(stdout), &listed))
	require.Len(t, listed, 1)
	assert.Equal(t, []any{"c", "items/1", int64(7), "boom", 5, true, false},
		[]any{listed[0].Client, listed[0].Key, listed[0].ChangelogID, listed[0].Error, listed[0].Attempts, listed[0].Blocking, listed[0].Retry})
	assert.JSONEq(t, `{"operationType": "insert"}`, string(listed[0].Event))
	id := listed[0].ID

	code, stdout, stderr = runCmd(t, append([]string{"parked", "list"}, base...)...)
	require.Equal(t, exitOK, code, stderr)
	assert.Len(t, strings.Split(strings.TrimSpace(stdout), "\n"), 3, "a header and both clients' events:\n%s", stdout)

	code, _, stderr = runCmd(t, append([]string{"parked", "retry", "d", strconv.FormatInt(id, 10)}, base...)...)
	assert.Equal(t, exitFailure, code, "another client's event")
	assert.Contains(t, stderr, "no parked event")
	code, stdout, stderr = runCmd(t, append([]string{"parked", "retry", "c", strconv.FormatInt(id, 10)}, base...)...)
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, "will run again")
	var retry bool
	require.NoError(t, db.QueryRow(`SELECT retry_requested FROM datastore_changelog_parked WHERE id = $1`, id).Scan(&retry))
	assert.True(t, retry)

	code, _, stderr = runCmd(t, append([]string{"parked", "drop", "c", strconv.FormatInt(id, 10)}, base...)...)
	assert.Equal(t, exitUsage, code, "drop needs --yes or --dry-run")
	assert.Contains(t, stderr, "deletes the parked event")
	code, stdout, stderr = runCmd(t, append([]string{"parked", "drop", "c", strconv.FormatInt(id, 10), "--dry-run"}, base...)...)
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, "would drop parked event")
	code, stdout, stderr = runCmd(t, append([]string{"parked", "drop", "c", strconv.FormatInt(id, 10), "--yes"}, base...)...)
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, "dropped")
	var left int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM datastore_changelog_parked`).Scan(&left))
	assert.Equal(t, 1, left, "only the dropped event is gone")

	code, _, stderr = runCmd(t, append([]string{"parked", "retry", "c", "x"}, base...)...)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "not a parked event id")
}
