package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/schema"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestStatusUsesTheLibrarysBacklog checks status against what the library's watchers do, for
// new, idle and behind clients and every token format: the backlog is the rows a restart would
// deliver, the lag the age of the oldest of them.
func TestStatusUsesTheLibrarysBacklog(t *testing.T) {
	t.Parallel()
	db, dsn := newItemsDB(t)
	execSQL(t, db, `CREATE TABLE notes (id serial PRIMARY KEY, body text)`)
	_, err := schema.Capture(context.Background(), db, "notes", schema.Options{})
	require.NoError(t, err)
	// A client of a table without rows: its token is before every row.
	require.Empty(t, tailLines(t, "--dsn", dsn, "--table", "notes", "--client", "new", "--exit-at-end"))

	execSQL(t, db, `INSERT INTO items (name) VALUES ('a'), ('b'), ('c')`)
	var s string // sees rows 1 to 3, not 4 and 5
	require.NoError(t, db.QueryRow(`SELECT pg_current_snapshot()::text`).Scan(&s))
	execSQL(t, db, `INSERT INTO items (name) VALUES ('d')`, `INSERT INTO items (name) VALUES ('e')`)
	var e string // sees rows 1 to 5
	require.NoError(t, db.QueryRow(`SELECT pg_current_snapshot()::text`).Scan(&e))
	// Rows 1-3 are 30 minutes old, row 4 20 and row 5 10, so each lag names its row.
	execSQL(t, db, `UPDATE datastore_changelog SET changed_at = now() - CASE WHEN id <= 3 THEN interval '30 min'
		WHEN id = 4 THEN interval '20 min' ELSE interval '10 min' END`)
	ts := map[int]string{}
	for id := 1; id <= 5; id++ {
		var at time.Time
		require.NoError(t, db.QueryRow(`SELECT changed_at FROM datastore_changelog WHERE id = $1`, id).Scan(&at))
		ts[id] = at.UTC().Format(time.RFC3339Nano)
	}
	require.Empty(t, tailLines(t, "--dsn", dsn, "--table", "items", "--client", "idle", "--exit-at-end"))
	require.Len(t, tailLines(t, "--dsn", dsn, "--table", "items", "--client", "behind", "--from", "beginning", "-n", "2"), 2)
	crafted := map[string]string{
		"legacy":     `{"timestamp": "` + ts[2] + `", "eventID": 2, "table": "items"}`,
		"id-only":    `{"eventID": 2}`,
		"snapshot":   `{"timestamp": "` + ts[3] + `", "eventID": 3, "snapshot": "` + s + `", "table": "items"}`,
		"start":      `{"timestamp": "0001-01-01T00:00:00Z", "eventID": 0, "snapshot": "` + s + `", "table": "items"}`,
		"switchover": `{"timestamp": "` + ts[5] + `", "eventID": 5, "switchover": "` + s + `", "table": "items"}`,
		"delta": `{"timestamp": "` + ts[4] + `", "eventID": 4, "snapshot": "` + s + `", "deltaEnd": "` + e +
			`", "deltaAfterID": 4, "table": "items"}`,
	}
	for client, token := range crafted {
		execSQL(t, db, `INSERT INTO resume_tokens (client_name, resume_token) VALUES ('`+client+`', '`+token+`')`)
	}

	code, stdout, stderr := runCmd(t, "status", "--dsn", dsn, "--format", "json", "--table", "items")
	require.Equal(t, exitOK, code, stderr)
	var rows []clientStatus
	require.NoError(t, json.Unmarshal([]byte(stdout), &rows), stdout)
	got := map[string]clientStatus{}
	for _, r := range rows {
		got[r.Client] = r
	}
	want := []struct {
		client, format string
		backlog        int64
		lag            time.Duration // 0: none
	}{
		{"new", tokenSnapshot, 0, 0},
		{"idle", tokenSnapshot, 0, 0},
		{"behind", tokenDelta, 3, 30 * time.Minute}, // from the beginning, rows with a txid are read in deltas
		{"legacy", tokenWithTime, 3, 30 * time.Minute},
		{"id-only", tokenIDOnly, 3, 30 * time.Minute},
		{"snapshot", tokenSnapshot, 2, 20 * time.Minute},
		{"start", tokenSnapshot, 2, 20 * time.Minute},
		{"switchover", tokenSwitchover, 2, 20 * time.Minute}, // rows 4 and 5 are not in its snapshot
		{"delta", tokenDelta, 1, 10 * time.Minute},
	}
	require.Len(t, rows, len(want), stdout)
	for _, w := range want {
		r := got[w.client]
		require.NotNil(t, r.Backlog, w.client)
		assert.Equal(t, w.backlog, *r.Backlog, "backlog of %s", w.client)
		require.NotNil(t, r.LagSeconds, w.client)
		assert.InDelta(t, w.lag.Seconds(), *r.LagSeconds, 5, "lag of %s", w.client)
		assert.Equal(t, w.format, r.TokenFormat, w.client)
		if r.AgeSeconds != nil {
			assert.GreaterOrEqual(t, *r.AgeSeconds, 0.0, "age of %s", w.client)
		}
	}
	for _, client := range []string{"new", "start"} { // before every row: no position time, no age
		assert.Nil(t, got[client].PositionTime, client)
		assert.Nil(t, got[client].AgeSeconds, client)
	}
	require.NotNil(t, got["legacy"].AgeSeconds)
	assert.InDelta(t, 30*60, *got["legacy"].AgeSeconds, 5)

	code, stdout, stderr = runCmd(t, "status", "--dsn", dsn)
	require.Equal(t, exitOK, code, stderr)
	for _, line := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(line, "new ") {
			assert.Regexp(t, `^new +0 +- +snapshot +\S+ +- +0s +0 \(notes\)$`, line)
		}
	}
	assert.NotContains(t, stdout, "-2562047h")
}
