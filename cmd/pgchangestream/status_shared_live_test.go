package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sharedScene writes a shared client "s" as its members leave it: member 7 ("m7", its lease a
// minute ahead) owns ranges 0 to 31, the others are free; every range is saved after row 3 but
// range 5, after row 1. It has no token-table row; "plain" is an unshared client at row 3.
func sharedScene(t *testing.T, db *sql.DB) (positions map[int]string) {
	t.Helper()
	execSQL(t, db, `INSERT INTO items (name) VALUES ('a')`, `INSERT INTO items (name) VALUES ('b')`,
		`INSERT INTO items (name) VALUES ('c')`)
	positions = map[int]string{}
	for id := 1; id <= 3; id++ {
		var at time.Time
		require.NoError(t, db.QueryRow(`SELECT changed_at FROM datastore_changelog WHERE id = $1`, id).Scan(&at))
		positions[id] = fmt.Sprintf(`{"timestamp": %q, "eventID": %d, "table": "items"}`, at.UTC().Format(time.RFC3339Nano), id)
	}
	execSQL(t, db, `INSERT INTO datastore_changelog_members (client_name, member, name, lease_until)
		VALUES ('s', 7, 'm7', now() + interval '1 minute')`,
		`INSERT INTO datastore_changelog_ranges (client_name, range_no, owner, resume_token)
		SELECT 's', g, CASE WHEN g < 32 THEN 7 END, CASE WHEN g = 5 THEN '`+positions[1]+`' ELSE '`+positions[3]+`' END::jsonb
		FROM generate_series(0, 63) AS g`,
		`INSERT INTO resume_tokens (client_name, resume_token) VALUES ('plain', '`+positions[3]+`')`)
	return positions
}

// TestStatusSharedClient proves that status lists a shared client that has no token-table row,
// with the backlog and lag of its range the furthest behind, its members and every range's
// owner and position, and leaves an unshared client's output as it was.
func TestStatusSharedClient(t *testing.T) {
	t.Parallel()
	db, dsn := newItemsDB(t)
	positions := sharedScene(t, db)

	code, stdout, stderr := runCmd(t, "status", "--dsn", dsn, "--format", "json")
	require.Equal(t, exitOK, code, stderr)
	var rows []clientStatus
	require.NoError(t, json.Unmarshal([]byte(stdout), &rows), stdout)
	require.Len(t, rows, 2, stdout)
	plain, s := rows[0], rows[1]
	require.Equal(t, "plain", plain.Client)
	require.Nil(t, plain.Shared)
	assert.NotContains(t, strings.SplitN(stdout, `"client": "s"`, 2)[0], `"shared"`, "no shared field for an unshared client")
	require.Equal(t, "s", s.Client)
	require.JSONEq(t, positions[1], s.Token, "the range the furthest behind")
	require.Equal(t, int64(1), *s.PositionID)
	require.Equal(t, int64(2), *s.Backlog, "rows 2 and 3, which range 5 has not certified")
	require.NotNil(t, s.Shared, stdout)
	require.Len(t, s.Shared.Members, 1)
	m := s.Shared.Members[0]
	assert.Equal(t, int64(7), m.Member)
	assert.Equal(t, "m7", m.Name)
	assert.Equal(t, 32, m.Ranges)
	assert.InDelta(t, 60, m.LeaseLeftSeconds, 5)
	require.Len(t, s.Shared.Ranges, 64)
	for _, r := range s.Shared.Ranges {
		want := int64(3)
		if r.Range == 5 {
			want = 1
		}
		require.Equal(t, want, *r.PositionID, "range %d", r.Range)
		require.NotNil(t, r.AgeSeconds, "range %d", r.Range)
		require.Equal(t, tokenWithTime, r.TokenFormat)
		if r.Range < 32 {
			require.Equal(t, int64(7), *r.Owner, "range %d", r.Range)
			require.Equal(t, "m7", *r.OwnerName)
		} else {
			require.Nil(t, r.Owner, "range %d is free", r.Range)
		}
	}

	code, stdout, stderr = runCmd(t, "status", "--dsn", dsn)
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, "shared client s: 1 members")
	assert.Regexp(t, `(?m)^7 +m7 +\S+ +32$`, stdout, "the member, its lease left and its ranges")
	assert.Regexp(t, `(?m)^5 +7 \(m7\) +1 `, stdout, "range 5: its owner and position")
	assert.Regexp(t, `(?m)^40 +free +3 `, stdout, "range 40 is free")
}

// TestTokenListSharedClient proves that token list lists a shared client without a token-table
// row, with its ranges' owners and tokens as stored.
func TestTokenListSharedClient(t *testing.T) {
	t.Parallel()
	db, dsn := newItemsDB(t)
	positions := sharedScene(t, db)

	code, stdout, stderr := runCmd(t, "token", "list", "--dsn", dsn, "--format", "json")
	require.Equal(t, exitOK, code, stderr)
	var listed []listedToken
	require.NoError(t, json.Unmarshal([]byte(stdout), &listed), stdout)
	require.Len(t, listed, 2, stdout)
	require.Equal(t, "plain", listed[0].Client)
	require.Nil(t, listed[0].Shared)
	require.NotNil(t, listed[0].SavedAt)
	s := listed[1]
	require.Equal(t, "s", s.Client)
	require.Equal(t, "null", string(s.Token), "no token-table row")
	require.Nil(t, s.SavedAt)
	require.NotNil(t, s.Shared)
	require.Len(t, s.Shared.Ranges, 64)
	require.JSONEq(t, positions[1], string(s.Shared.Ranges[5].Token))
	require.Equal(t, 32, s.Shared.Members[0].Ranges)

	code, stdout, stderr = runCmd(t, "token", "list", "--dsn", dsn)
	require.Equal(t, exitOK, code, stderr)
	assert.Regexp(t, `(?m)^plain +\S+ +\{`, stdout)
	assert.NotRegexp(t, `(?m)^s +`, stdout, "no token-table row to list")
	assert.Contains(t, stdout, "shared client s: 1 members")
	assert.Regexp(t, `(?m)^5 +7 \(m7\) +\S+ +\{.*"eventID": 1`, stdout)
	assert.Regexp(t, `(?m)^63 +free +\S+ +\{.*"eventID": 3`, stdout)
}
