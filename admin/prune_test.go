package admin

import (
	"context"
	"database/sql/driver"
	"strconv"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/stretchr/testify/require"
)

// expectNoSharedTables expects the look for the shared tables of a changelog without them.
func expectNoSharedTables(mock sqlmock.Sqlmock) {
	mock.ExpectQuery(`SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL`).
		WithArgs(`"datastore_changelog_ranges"`, `"datastore_changelog_members"`).
		WillReturnRows(sqlmock.NewRows([]string{"exists"}).AddRow(false))
}

const wantListTokens = `SELECT client_name, resume_token::text, last_updated FROM "resume_tokens" ORDER BY client_name`

func tokenRows(kv ...string) *sqlmock.Rows {
	rows := sqlmock.NewRows([]string{"client_name", "resume_token", "last_updated"})
	for i := 0; i < len(kv); i += 2 {
		rows.AddRow(kv[i], kv[i+1], t0)
	}
	return rows
}

// holderRows is the answer of a holder count: n rows, an hour after t0.
func holderRows(n int64) *sqlmock.Rows {
	return sqlmock.NewRows([]string{"count", "min", "now"}).AddRow(n, nil, t0.Add(time.Hour))
}

func TestPruneDeletesInBatchesBelowEveryToken(t *testing.T) {
	db, mock := mockDB(t)
	expectTokensVisible(mock, false)
	mock.ExpectQuery(wantListTokens).WillReturnRows(tokenRows(
		"a", `{"timestamp":"2026-01-02T03:04:05Z","eventID":9}`,
		"b", `{"timestamp":"2026-01-02T03:04:05Z","eventID":9,"snapshot":"10:20:"}`,
		"old", `{"eventID":1}`))
	expectNoSharedTables(mock)
	del := `WITH doomed AS (SELECT c.id FROM "datastore_changelog" c WHERE c.changed_at < now() - make_interval(secs => $1::float8)
	AND c.table_name = $2
	AND (c.changed_at, c.id) <= ($3::timestamptz, $4::bigint)
	AND (c.txid IS NULL OR pg_visible_in_snapshot(c.txid, $5::pg_snapshot)) ORDER BY c.id LIMIT 2)
	DELETE FROM "datastore_changelog" WHERE id IN (SELECT id FROM doomed)`
	args := []driver.Value{float64(60), "items", t0, int64(9), "10:20:"}
	mock.ExpectExec(del).WithArgs(args...).WillReturnResult(sqlmock.NewResult(0, 2))
	mock.ExpectExec(del).WithArgs(args...).WillReturnResult(sqlmock.NewResult(0, 1))
	holds := `SELECT count(*), min(c.changed_at), now() FROM "datastore_changelog" c WHERE c.changed_at < now() - make_interval(secs => $1::float8)
	AND c.table_name = $2
	AND `
	mock.ExpectQuery(holds+`(c.changed_at, c.id) > ($3::timestamptz, $4::bigint) AND NOT (c.changed_at, c.id) <= ($5::timestamptz, $6::bigint)`).
		WithArgs(float64(60), "items", t0, int64(9), t0, int64(9)).WillReturnRows(holderRows(0))
	mock.ExpectQuery(holds+`c.txid >= $3::xid8 AND NOT (c.txid IS NULL OR pg_visible_in_snapshot(c.txid, $4::pg_snapshot))`).
		WithArgs(float64(60), "items", "10", "10:20:").WillReturnRows(holderRows(4))
	var progress []int64
	res, err := Prune(context.Background(), db, PruneOptions{OlderThan: 60e9, Table: "items", BatchSize: 2,
		IgnoreClients: []string{"old"}, Progress: func(n int64) { progress = append(progress, n) }})
	require.NoError(t, err)
	require.Equal(t, PruneResult{Deleted: 3, Batches: 2, Clients: []string{"a", "b"},
		Holders: []PruneHolder{{Client: "b", Rows: 4, SavedAt: t0, Age: time.Hour}}}, res,
		"b's token keeps 4 rows; a's none")
	require.Equal(t, []int64{2, 3}, progress)
	require.NoError(t, mock.ExpectationsWereMet())
}

func TestPruneDeletesNothingBelowAnUnresolvedToken(t *testing.T) {
	db, mock := mockDB(t)
	expectTokensVisible(mock, false)
	mock.ExpectQuery(wantListTokens).WillReturnRows(tokenRows(
		"a", `{"timestamp":"2026-01-02T03:04:05Z","eventID":9}`, "gone", `{"eventID":4}`))
	expectNoSharedTables(mock)
	mock.ExpectQuery(`SELECT changed_at FROM "datastore_changelog" WHERE id = $1`).WithArgs(int64(4)).
		WillReturnRows(sqlmock.NewRows([]string{"changed_at"}))
	res, err := Prune(context.Background(), db, PruneOptions{})
	require.NoError(t, err)
	require.Equal(t, PruneResult{Clients: []string{"a"}, Unresolved: []string{"gone"}}, res)
	require.NoError(t, mock.ExpectationsWereMet(), "no DELETE")

	db, mock = mockDB(t)
	expectTokensVisible(mock, false)
	mock.ExpectQuery(wantListTokens).WillReturnRows(tokenRows())
	expectNoSharedTables(mock)
	res, err = Prune(context.Background(), db, PruneOptions{})
	require.NoError(t, err)
	require.Zero(t, res, "no client: nothing is known to be passed")
	require.NoError(t, mock.ExpectationsWereMet())

	db, mock = mockDB(t)
	expectTokensVisible(mock, false)
	mock.ExpectQuery(wantListTokens).WillReturnRows(tokenRows("bad", `{"eventID":"x"}`))
	expectNoSharedTables(mock)
	_, err = Prune(context.Background(), db, PruneOptions{})
	require.ErrorContains(t, err, "client bad: ")
}

func TestPruneDryRunCounts(t *testing.T) {
	db, mock := mockDB(t)
	expectTokensVisible(mock, false)
	mock.ExpectQuery(wantListTokens).WillReturnRows(tokenRows("a", `{"timestamp":"2026-01-02T03:04:05Z","eventID":9}`))
	expectNoSharedTables(mock)
	mock.ExpectQuery(`SELECT count(*) FROM "datastore_changelog" c WHERE c.changed_at < now() - make_interval(secs => $1::float8)
	AND (c.changed_at, c.id) <= ($2::timestamptz, $3::bigint)`).WithArgs(float64(0), t0, int64(9)).
		WillReturnRows(sqlmock.NewRows([]string{"count"}).AddRow(int64(12)))
	mock.ExpectQuery(`SELECT count(*), min(c.changed_at), now() FROM "datastore_changelog" c WHERE c.changed_at < now() - make_interval(secs => $1::float8)
	AND (c.changed_at, c.id) > ($2::timestamptz, $3::bigint) AND NOT (c.changed_at, c.id) <= ($4::timestamptz, $5::bigint)`).
		WithArgs(float64(0), t0, int64(9), t0, int64(9)).WillReturnRows(holderRows(0))
	res, err := Prune(context.Background(), db, PruneOptions{DryRun: true})
	require.NoError(t, err)
	require.Equal(t, int64(12), res.Deleted)
	require.Zero(t, res.Batches)
	require.NoError(t, mock.ExpectationsWereMet())
}

// A token counts only for the table it records: with Table set, tokens of other tables are left
// out; without it, each holds back only its own table's rows, and rows of a table no token
// counts for are kept.
func TestPruneCountsATokenForItsTableOnly(t *testing.T) {
	const legacy = `{"timestamp":"2026-01-02T03:04:05Z","eventID":9`
	listed := func() *sqlmock.Rows {
		return tokenRows("items1", legacy+`,"table":"items"}`, "items2", legacy+`,"table":"items"}`,
			"other", legacy+`,"table":"other"}`)
	}
	count := `SELECT count(*) FROM "datastore_changelog" c WHERE c.changed_at < now() - make_interval(secs => $1::float8)
	AND `
	held := `SELECT count(*), min(c.changed_at), now() FROM "datastore_changelog" c WHERE c.changed_at < now() - make_interval(secs => $1::float8)
	AND c.table_name = $2
	AND (c.changed_at, c.id) > ($3::timestamptz, $4::bigint) AND NOT (c.changed_at, c.id) <= ($5::timestamptz, $6::bigint)`

	db, mock := mockDB(t)
	expectTokensVisible(mock, false)
	mock.ExpectQuery(wantListTokens).WillReturnRows(listed())
	expectNoSharedTables(mock)
	mock.ExpectQuery(count+`c.table_name = $2
	AND (c.changed_at, c.id) <= ($3::timestamptz, $4::bigint)
	AND (c.changed_at, c.id) <= ($5::timestamptz, $6::bigint)`).WithArgs(float64(0), "items", t0, int64(9), t0, int64(9)).
		WillReturnRows(sqlmock.NewRows([]string{"count"}).AddRow(int64(5)))
	for range 2 {
		mock.ExpectQuery(held).WithArgs(float64(0), "items", t0, int64(9), t0, int64(9)).WillReturnRows(holderRows(0))
	}
	res, err := Prune(context.Background(), db, PruneOptions{DryRun: true, Table: "items"})
	require.NoError(t, err)
	require.Equal(t, PruneResult{Deleted: 5, Clients: []string{"items1", "items2"}}, res, "the token of other is left out")
	require.NoError(t, mock.ExpectationsWereMet())

	db, mock = mockDB(t)
	expectTokensVisible(mock, false)
	mock.ExpectQuery(wantListTokens).WillReturnRows(listed())
	expectNoSharedTables(mock)
	tableToken := func(n int) string {
		return `(c.table_name <> $` + strconv.Itoa(n) + ` OR (c.changed_at, c.id) <= ($` + strconv.Itoa(n+1) +
			`::timestamptz, $` + strconv.Itoa(n+2) + `::bigint))`
	}
	mock.ExpectQuery(count+tableToken(2)+`
	AND `+tableToken(5)+`
	AND `+tableToken(8)+`
	AND c.table_name IN ($11, $12)`).
		WithArgs(float64(0), "items", t0, int64(9), "items", t0, int64(9), "other", t0, int64(9), "items", "other").
		WillReturnRows(sqlmock.NewRows([]string{"count"}).AddRow(int64(7)))
	mock.ExpectQuery(held).WithArgs(float64(0), "items", t0, int64(9), t0, int64(9)).WillReturnRows(holderRows(0))
	mock.ExpectQuery(held).WithArgs(float64(0), "items", t0, int64(9), t0, int64(9)).WillReturnRows(holderRows(2))
	mock.ExpectQuery(held).WithArgs(float64(0), "other", t0, int64(9), t0, int64(9)).WillReturnRows(holderRows(3))
	res, err = Prune(context.Background(), db, PruneOptions{DryRun: true})
	require.NoError(t, err)
	require.Equal(t, PruneResult{Deleted: 7, Clients: []string{"items1", "items2", "other"}, Holders: []PruneHolder{
		{Client: "other", Table: "other", Rows: 3, SavedAt: t0, Age: time.Hour},
		{Client: "items2", Table: "items", Rows: 2, SavedAt: t0, Age: time.Hour},
	}}, res)
	require.NoError(t, mock.ExpectationsWereMet())
}

// expectTokensVisible expects Prune's check of the token table's policies: restricted, whether a
// restrictive policy hides other clients' tokens from this role.
func expectTokensVisible(mock sqlmock.Sqlmock, restricted bool) {
	mock.ExpectQuery(restrictedTokensSQL).WithArgs(`"resume_tokens"`).
		WillReturnRows(sqlmock.NewRows([]string{"restricted"}).AddRow(restricted))
}

// TestPruneRefusesARoleThatSeesSomeTokensOnly: a role restricted to some clients' tokens would
// prune rows the hidden clients have not consumed; Prune refuses before reading any token.
func TestPruneRefusesARoleThatSeesSomeTokensOnly(t *testing.T) {
	db, mock := mockDB(t)
	expectTokensVisible(mock, true)
	_, err := Prune(t.Context(), db, PruneOptions{})
	require.ErrorContains(t, err, "hides other clients' tokens from this role")
	require.NoError(t, mock.ExpectationsWereMet())
}
