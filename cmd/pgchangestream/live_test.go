package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/pgtest"
)

func TestSchemaInstallAndCapture(t *testing.T) {
	t.Parallel()
	db, dsn := pgtest.NewDatabase(t, "")
	code, stdout, stderr := runCmd(t, "schema", "install", "--dsn", dsn)
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, "schema installed")
	execSQL(t, db, `CREATE TABLE things (id bigserial PRIMARY KEY, v text)`)
	code, stdout, stderr = runCmd(t, "schema", "capture", "--dsn", dsn, "things")
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, "capturing changes of things")

	execSQL(t, db, `INSERT INTO things (v) VALUES ('x')`)
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM datastore_changelog WHERE table_name = 'things'`).Scan(&n))
	assert.Equal(t, 1, n)

	code, _, stderr = runCmd(t, "schema", "capture", "--dsn", dsn, "missing")
	assert.Equal(t, exitFailure, code)
	assert.Contains(t, stderr, "pgchangestream: schema capture: ")
	assert.Contains(t, stderr, "does not exist")
}

func TestTailJSON(t *testing.T) {
	t.Parallel()
	db, dsn := newItemsDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"tail", "--dsn", dsn, "--table", "items", "--client", "t1", "--from-beginning"}, &out, &errb)
	}()
	execSQL(t, db,
		`INSERT INTO items (name, qty) VALUES ('a', 1), ('b', 2)`,
		`UPDATE items SET qty = 5 WHERE name = 'a'`,
		`DELETE FROM items WHERE name = 'b'`)
	require.Eventually(t, func() bool { return len(out.lines()) >= 4 }, 20*time.Second, 10*time.Millisecond,
		"stdout %q stderr %q", out.String(), errb.String())
	cancel()
	select {
	case code := <-done:
		require.Equal(t, exitOK, code, errb.String())
	case <-time.After(20 * time.Second):
		t.Fatal("tail did not exit after its context was cancelled")
	}

	lines := out.lines()
	require.Len(t, lines, 4)
	var ops []string
	var lastToken string
	for _, line := range lines {
		var ev map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &ev), line)
		token, ok := ev["token"].(string)
		require.True(t, ok, "token in %s", line)
		require.Equal(t, map[string]any{"_data": token}, ev["_id"])
		require.Equal(t, map[string]any{"coll": "items"}, ev["ns"])
		ops = append(ops, ev["operationType"].(string))
		lastToken = token
	}
	assert.Equal(t, []string{"insert", "insert", "update", "delete"}, ops)
	update := map[string]any{}
	require.NoError(t, json.Unmarshal([]byte(lines[2]), &update))
	assert.Equal(t, map[string]any{"updatedFields": map[string]any{"qty": float64(5)}}, update["updateDescription"])

	var saved string
	require.NoError(t, db.QueryRow(`SELECT resume_token->>'eventID' FROM resume_tokens WHERE client_name = 't1'`).Scan(&saved))
	assert.Equal(t, lastToken, saved, "the acknowledged position is saved")
}

func TestTailPrettyNoAck(t *testing.T) {
	t.Parallel()
	db, dsn := newItemsDB(t)
	execSQL(t, db, `INSERT INTO items (name, qty) VALUES ('a', 1)`, `UPDATE items SET qty = 2`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"tail", "--dsn", dsn, "--table", "items", "--client", "t2", "--from-beginning",
			"--no-ack", "--format", "pretty", "--mode", "polling"}, &out, &errb)
	}()
	require.Eventually(t, func() bool { return len(out.lines()) >= 2 }, 20*time.Second, 10*time.Millisecond,
		"stdout %q stderr %q", out.String(), errb.String())
	cancel()
	require.Equal(t, exitOK, <-done, errb.String())
	lines := out.lines()
	require.Len(t, lines, 2)
	assert.Regexp(t, `^1 insert items 1 \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z name="a" qty=1$`, lines[0])
	assert.Regexp(t, `^2 update items 1 \S+ qty=2$`, lines[1])

	var saved int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM resume_tokens`).Scan(&saved))
	assert.Zero(t, saved, "--no-ack saves nothing, not even the start position")
}

func TestTailMissingChangelog(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.NewDatabase(t, "")
	code, stdout, stderr := runCmd(t, "tail", "--dsn", dsn, "--table", "items")
	assert.Equal(t, exitFailure, code)
	assert.Empty(t, stdout)
	assert.Equal(t, "pgchangestream: tail: changelog table datastore_changelog does not exist "+
		"(create it with 'pgchangestream schema install')\n", stderr)
}

func TestStatus(t *testing.T) {
	t.Parallel()
	db, dsn := newItemsDB(t)
	execSQL(t, db, `INSERT INTO items (name) VALUES ('a'), ('b'), ('c')`,
		`CREATE TABLE other (id int PRIMARY KEY)`)
	var ts time.Time
	require.NoError(t, db.QueryRow(`SELECT changed_at FROM datastore_changelog WHERE id = 2`).Scan(&ts))
	execSQL(t, db, `INSERT INTO datastore_changelog (table_name, record_id, operation) VALUES ('other', '1', 'INSERT')`)
	_, err := db.Exec(`INSERT INTO resume_tokens (client_name, resume_token) VALUES ($1, $2), ('b-old', '{"eventID": 1}'),
		('c-gone', '{"eventID": 99}'), ('d-bad', '"garbage"')`,
		"a-new", `{"timestamp": "`+ts.UTC().Format(time.RFC3339Nano)+`", "eventID": 2}`)
	require.NoError(t, err)

	code, stdout, stderr := runCmd(t, "status", "--dsn", dsn)
	require.Equal(t, exitOK, code, stderr)
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	require.Len(t, lines, 5, stdout)
	assert.Regexp(t, `^CLIENT +POSITION +POSITION TIME +TOKEN +SAVED +AGE +LAG +BACKLOG$`, lines[0])
	// All tables: rows 3 and 4 come after row 2; rows 2, 3, 4 after row 1; c-gone replays all.
	assert.Regexp(t, `^a-new +2 +`+regexp.QuoteMeta(ts.UTC().Format(eventTimeFormat))+` +id\+time +\S+ +\S+ +\S+ +2$`, lines[1])
	assert.Regexp(t, `^b-old +1 +\S+ +id-only +\S+ +\S+ +\S+ +3$`, lines[2])
	assert.Regexp(t, `^c-gone +99 +- +row-gone +\S+ +- +\S+ +4$`, lines[3])
	assert.Regexp(t, `^d-bad +- +- +invalid \(.*\) +\S+ +- +- +-$`, lines[4])

	code, stdout, stderr = runCmd(t, "status", "--dsn", dsn, "--format", "json", "--table", "items",
		"--client-table", "b-old=other")
	require.Equal(t, exitOK, code, stderr)
	var rows []clientStatus
	require.NoError(t, json.Unmarshal([]byte(stdout), &rows), stdout)
	require.Len(t, rows, 4)
	a := rows[0]
	assert.Equal(t, "a-new", a.Client)
	assert.Equal(t, tokenWithTime, a.TokenFormat)
	require.NotNil(t, a.PositionID)
	assert.Equal(t, int64(2), *a.PositionID)
	require.NotNil(t, a.PositionTime)
	assert.True(t, ts.Equal(*a.PositionTime))
	require.NotNil(t, a.AgeSeconds)
	assert.GreaterOrEqual(t, *a.AgeSeconds, 0.0)
	require.NotNil(t, a.Backlog)
	assert.Equal(t, int64(1), *a.Backlog, "only the items row after row 2")
	require.NotNil(t, a.BacklogTable)
	assert.Equal(t, "items", *a.BacklogTable)
	assert.NotNil(t, a.SavedAt)
	var oldest time.Time
	require.NoError(t, db.QueryRow(`SELECT changed_at FROM datastore_changelog WHERE id = 3`).Scan(&oldest))
	var dbNow time.Time
	require.NoError(t, db.QueryRow(`SELECT now()`).Scan(&dbNow))
	require.NotNil(t, a.LagSeconds)
	assert.InDelta(t, dbNow.Sub(oldest).Seconds(), *a.LagSeconds, 1, "the age of the oldest row not passed")
	assert.Nil(t, a.Table, "the token records no table")
	assert.False(t, a.Stale)
	assert.Equal(t, tokenIDOnly, rows[1].TokenFormat)
	assert.Equal(t, int64(1), *rows[1].Backlog, "b-old's own table: the one row of other")
	assert.Equal(t, "other", *rows[1].BacklogTable)
	assert.Equal(t, tokenRowGone, rows[2].TokenFormat)
	assert.Equal(t, tokenInvalid, rows[3].TokenFormat)
	assert.NotEmpty(t, rows[3].Error)

	// A token not saved for --stale-after is flagged; a token's own table counts its backlog.
	execSQL(t, db, `UPDATE resume_tokens SET last_updated = now() - interval '2 days' WHERE client_name = 'b-old'`,
		`UPDATE resume_tokens SET resume_token = resume_token || '{"table": "other"}' WHERE client_name = 'a-new'`)
	code, stdout, stderr = runCmd(t, "status", "--dsn", dsn)
	require.Equal(t, exitOK, code, stderr)
	lines = strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	assert.Regexp(t, `^a-new .* 1 \(other\)$`, lines[1], "the row of other after row 2")
	assert.Regexp(t, `^b-old +1 +\S+ +id-only +\S+ \(stale\) `, lines[2])
	assert.NotContains(t, lines[1], "stale")
	code, stdout, stderr = runCmd(t, "status", "--dsn", dsn, "--stale-after", "72h", "--format", "json")
	require.Equal(t, exitOK, code, stderr)
	rows = nil
	require.NoError(t, json.Unmarshal([]byte(stdout), &rows), stdout)
	require.NotNil(t, rows[0].Table)
	assert.Equal(t, "other", *rows[0].Table)
	assert.False(t, rows[1].Stale, "2 days is not 72h")
}

// summaryLine is the last line of the demo's output.
var summaryLine = regexp.MustCompile(`^demo: written=(\d+) delivered=(\d+) replayed=(\d+) lost=(\d+)$`)

// crashLine is the line of one crash.
var crashLine = regexp.MustCompile(`(?m)^demo: +\d+\.\ds crash \d+/\d+: (\d+) rows written; ` +
	`consumer killed with (\d+) unacknowledged; saved position id=(\d+); restarting in \S+$`)

// checkedLine is the line that says what the demo checked, when nothing was lost.
var checkedLine = regexp.MustCompile(`(?m)^demo: checked: every committed row \((\d+)\) was delivered at least ` +
	`once across (\d+) consumer crashes, with the writers committing through every crash; (\d+) delivered again ` +
	`after crashes \(at-least-once\); 0 lost$`)

// atoi parses a number matched by a regexp.
func atoi(t *testing.T, s string) int {
	t.Helper()
	v, err := strconv.Atoi(s)
	require.NoError(t, err)
	return v
}

// runDemoTest runs the demo on a fresh database, with crashes consumer crashes, and checks its
// summary: nothing lost, and the counts consistent. It returns the output and the number of
// replays.
func runDemoTest(t *testing.T, crashes int, args ...string) (stdout string, replayed int) {
	t.Helper()
	db, dsn := pgtest.NewDatabase(t, "")
	// The user's own orders table: the demo must not touch it.
	execSQL(t, db, `CREATE TABLE orders (id int PRIMARY KEY, total numeric)`, `INSERT INTO orders VALUES (1, 9.5)`)
	code, stdout, stderr := runCmd(t, append([]string{"demo", "--dsn", dsn, "--progress", "200ms",
		"--crashes", strconv.Itoa(crashes)}, args...)...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	var orders, tokens int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM orders`).Scan(&orders))
	assert.Equal(t, 1, orders, "the user's orders table is left alone")
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM resume_tokens`).Scan(&tokens))
	assert.Zero(t, tokens, "the demo removes its token; stderr:\n%s", stderr)
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	m := summaryLine.FindStringSubmatch(lines[len(lines)-1])
	require.NotNil(t, m, "last line %q", lines[len(lines)-1])
	written, delivered, replayed, lost := atoi(t, m[1]), atoi(t, m[2]), atoi(t, m[3]), atoi(t, m[4])
	assert.Positive(t, written)
	assert.Zero(t, lost)
	assert.Equal(t, delivered-written, replayed, "every row delivered once, plus the replays")
	checked := checkedLine.FindStringSubmatch(stdout)
	require.NotNil(t, checked, stdout)
	assert.Equal(t, []int{written, crashes, replayed}, []int{atoi(t, checked[1]), atoi(t, checked[2]), atoi(t, checked[3])})
	return stdout, replayed
}

// checkCrashes checks the crash lines: n crashes, while rows kept being written, and every
// delivery a crash left unacknowledged delivered again. It returns the number of those
// deliveries.
func checkCrashes(t *testing.T, stdout string, n, replayed int) (unacked int) {
	t.Helper()
	crashes := crashLine.FindAllStringSubmatch(stdout, -1)
	require.Len(t, crashes, n, stdout)
	written := 0
	for _, m := range crashes {
		assert.GreaterOrEqual(t, atoi(t, m[1]), written, "rows only accumulate: %s", m[0])
		written = atoi(t, m[1])
		unacked += atoi(t, m[2])
	}
	assert.GreaterOrEqual(t, replayed, unacked, "deliveries left unacknowledged are delivered again")
	return unacked
}

// TestDemoCrashes: with one writer, a restarted consumer resuming from its saved position must
// see every row: nothing may be lost.
func TestDemoCrashes(t *testing.T) {
	t.Parallel()
	stdout, replayed := runDemoTest(t, 2, "--writers", "1", "--duration", "2s", "--rate", "200", "--seed", "7")
	checkCrashes(t, stdout, 2, replayed)
}

// TestDemoCrashesOutlastTheDuration: every crash asked for happens while the writers write,
// even when the restarts take longer than the duration (each restart pauses for up to
// maxDowntime and waits for a first read), as they do on a slow machine.
func TestDemoCrashesOutlastTheDuration(t *testing.T) {
	t.Parallel()
	stdout, replayed := runDemoTest(t, 3, "--writers", "2", "--duration", "100ms", "--rate", "200", "--seed", "5")
	checkCrashes(t, stdout, 3, replayed)
}

// TestDemoConcurrentWritersCrashes: concurrent writers commit out of insert order and keep
// committing through every crash, while no consumer runs too; nothing may be lost, and the
// deliveries a crash left unacknowledged are replayed.
func TestDemoConcurrentWritersCrashes(t *testing.T) {
	t.Parallel()
	stdout, replayed := runDemoTest(t, 4, "--writers", "4", "--duration", "3s", "--rate", "400", "--seed", "11")
	unacked := checkCrashes(t, stdout, 4, replayed)
	// The consumer acknowledges every demoAckEvery events: four crashes all landing right after
	// an acknowledgement are unlikely (about 1 in 20^4).
	assert.Positive(t, unacked, stdout)
}
