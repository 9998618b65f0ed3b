package pgchangestream

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/marker"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// The exact statements, as PostgreSQL receives them.
const (
	wantRead = `SELECT id, record_id::text, operation, old_values::text, new_values::text, changed_at FROM "datastore_changelog"
	WHERE table_name = $1 AND (changed_at, id) > ($2, $3)
	ORDER BY changed_at, id LIMIT 100`
	wantMark = `SELECT id FROM "datastore_changelog" WHERE table_name = $1 AND (changed_at, id) > ($2, $3) AND (changed_at, id) <= ($4, $5)
		ORDER BY changed_at, id`
	wantMarkIDs   = `UPDATE "datastore_changelog" SET processed = TRUE WHERE id = ANY($1::int8[]) AND processed = FALSE`
	wantSaveToken = `INSERT INTO "resume_tokens" (client_name, resume_token, last_updated) VALUES ($1, $2::jsonb, now())
	ON CONFLICT (client_name) DO UPDATE SET resume_token = EXCLUDED.resume_token, last_updated = EXCLUDED.last_updated`
	wantDetect = `SELECT current_setting('server_version_num')::int >= 130000 AND EXISTS (
		SELECT FROM pg_attribute a JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attrelid = to_regclass($1) AND a.attname = 'txid' AND NOT a.attisdropped
			AND format_type(a.atttypid, NULL) = 'xid8' AND pg_get_expr(d.adbin, d.adrelid) = 'pg_current_xact_id()'),
		to_regclass($2) IS NOT NULL, EXISTS (SELECT FROM pg_catalog.pg_stats s
		JOIN pg_catalog.pg_namespace n ON n.nspname = s.schemaname
		JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = s.tablename
		WHERE c.oid = to_regclass($1) AND s.attname = 'table_name')`
	wantLoad   = `SELECT resume_token::text FROM "resume_tokens" WHERE client_name = $1`
	wantNewest = `SELECT changed_at, id FROM "datastore_changelog" WHERE table_name = $1 ORDER BY changed_at DESC, id DESC LIMIT 1`
	wantByID   = `SELECT id, record_id::text, operation, old_values::text, new_values::text, changed_at FROM (SELECT * FROM "datastore_changelog" WHERE id = $2 OFFSET 0) c WHERE table_name = $1`
)

var changelogCols = []string{"id", "record_id", "operation", "old_values", "new_values", "changed_at"}

// expectLegacyChangelog expects the load's look for the txid column, and answers that the
// changelog has none.
func expectLegacyChangelog(mock sqlmock.Sqlmock) {
	mock.ExpectQuery(wantDetect).WithArgs(`"datastore_changelog"`, `"datastore_changelog_incarnation"`).
		WillReturnRows(sqlmock.NewRows([]string{"skip_free", "incarnation", "stats"}).AddRow(false, false, true))
}

// expectMark expects a marking pass: the selection q with args, answered with ids, and the
// statement that flags them.
func expectMark(mock sqlmock.Sqlmock, q string, args []any, ids ...int64) {
	rows := sqlmock.NewRows([]string{"id"})
	for _, id := range ids {
		rows.AddRow(id)
	}
	values := make([]driver.Value, len(args))
	for i, a := range args {
		values[i] = a
	}
	mock.ExpectQuery(q).WithArgs(values...).WillReturnRows(rows)
	mock.ExpectExec(wantMarkIDs).WithArgs(changelog.Array(ids)).WillReturnResult(sqlmock.NewResult(0, int64(len(ids))))
}

// expectCatchUp expects the first page of the catch-up after loading loaded, with saved as the
// saved position, which finds rows ids (changed_at ts), and their marking.
func expectCatchUp(w *Watcher, mock sqlmock.Sqlmock, loaded, saved Position, ts time.Time, ids ...int64) {
	q, args := marker.NewStatements(w.cfg.ChangelogTable).CatchUpStatement(w.cfg.TableName, loaded, saved, Position{})
	rows := sqlmock.NewRows([]string{"id", "changed_at"})
	for _, id := range ids {
		rows.AddRow(id, ts)
	}
	values := make([]driver.Value, len(args))
	for i, a := range args {
		values[i] = a
	}
	mock.ExpectQuery(q).WithArgs(values...).WillReturnRows(rows)
	if len(ids) > 0 {
		mock.ExpectExec(wantMarkIDs).WithArgs(changelog.Array(ids)).WillReturnResult(sqlmock.NewResult(0, int64(len(ids))))
	}
}

func newMockWatcher(t *testing.T, cfg Config) (*Watcher, sqlmock.Sqlmock) {
	t.Helper()
	db, mock := mockDB(t)
	cfg = testConfig(cfg)
	cfg.DB = db
	w, err := New(cfg)
	require.NoError(t, err)
	return w, mock
}

func TestQueriesAreTheRowComparisonForm(t *testing.T) {
	w, _ := newMockWatcher(t, Config{})
	require.Equal(t, wantRead, w.q.Read)
	mq := marker.NewStatements(w.cfg.ChangelogTable)
	require.Equal(t, wantMark, mq.Legacy)
	require.Equal(t, wantMarkIDs, mq.MarkIDs)
	require.Equal(t, wantLoad, w.q.LoadToken)
	require.Equal(t, wantNewest, w.q.Newest)
	require.Equal(t, wantByID, w.q.ByID)

}

func TestLoadSavedTokenFormats(t *testing.T) {
	ts := time.Date(2025, 5, 6, 7, 8, 9, 123456000, time.UTC)
	t.Run("timestamp and id", func(t *testing.T) {
		w, mock := newMockWatcher(t, Config{})
		expectLegacyChangelog(mock)
		mock.ExpectQuery(wantLoad).WithArgs("c").
			WillReturnRows(sqlmock.NewRows([]string{"resume_token"}).AddRow(`{"timestamp": "2025-05-06T07:08:09.123456Z", "eventID": 452}`))
		require.NoError(t, w.load(context.Background()))
		require.Equal(t, position.Make(ts, 452), w.Stats().Cursor)
		mock.ExpectQuery(wantRead).WithArgs("t", ts, int64(452)).WillReturnRows(sqlmock.NewRows(changelogCols))
		n, err := w.readBatch(context.Background())
		require.NoError(t, err)
		require.Zero(t, n)
		require.NoError(t, mock.ExpectationsWereMet())
	})
	t.Run("id only", func(t *testing.T) {
		w, mock := newMockWatcher(t, Config{})
		expectLegacyChangelog(mock)
		mock.ExpectQuery(wantLoad).WithArgs("c").
			WillReturnRows(sqlmock.NewRows([]string{"resume_token"}).AddRow(`{"eventID": 452}`))
		mock.ExpectQuery(`SELECT changed_at FROM "datastore_changelog" WHERE id = $1`).WithArgs(int64(452)).
			WillReturnRows(sqlmock.NewRows([]string{"changed_at"}).AddRow(ts))
		require.NoError(t, w.load(context.Background()))
		require.Equal(t, position.Make(ts, 452), w.Stats().Cursor, "an id-only token resumes after its row")
		require.NoError(t, mock.ExpectationsWereMet())
	})
	t.Run("malformed", func(t *testing.T) {
		w, mock := newMockWatcher(t, Config{})
		expectLegacyChangelog(mock)
		mock.ExpectQuery(wantLoad).WithArgs("c").
			WillReturnRows(sqlmock.NewRows([]string{"resume_token"}).AddRow(`{"eventID": "x"}`))
		err := w.load(context.Background())
		require.ErrorContains(t, err, "load saved token")
		_, ok := w.checkpointLocked()
		require.False(t, ok, "nothing can be saved before the token is loaded")
	})
	t.Run("no token", func(t *testing.T) {
		w, mock := newMockWatcher(t, Config{})
		expectLegacyChangelog(mock)
		mock.ExpectQuery(wantLoad).WithArgs("c").WillReturnRows(sqlmock.NewRows([]string{"resume_token"}))
		mock.ExpectQuery(wantNewest).WithArgs("t").
			WillReturnRows(sqlmock.NewRows([]string{"changed_at", "id"}).AddRow(ts, int64(9)))
		mock.ExpectExec(wantSaveToken).WithArgs("c", string(position.EncodeToken(position.Make(ts, 9), "t"))).
			WillReturnResult(sqlmock.NewResult(0, 1))
		require.NoError(t, w.load(context.Background()))
		require.Equal(t, position.Make(ts, 9), w.Stats().Checkpoint)
		require.NoError(t, mock.ExpectationsWereMet())
	})
}

// A save writes the token alone; the processed flag of the rows it newly certified is set
// after it (here at once: the watcher is not started, so no marker goroutine runs).
func TestSaveThenMark(t *testing.T) {
	ts := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
	w, mock := newMockWatcher(t, Config{ProcessedFlag: true})
	expectLegacyChangelog(mock)
	mock.ExpectQuery(wantLoad).WithArgs("c").
		WillReturnRows(sqlmock.NewRows([]string{"resume_token"}).AddRow(string(position.EncodeToken(position.Make(ts, 1), "t"))))
	require.NoError(t, w.load(context.Background()))
	mock.ExpectQuery(wantRead).WithArgs("t", ts, int64(1)).WillReturnRows(sqlmock.NewRows(changelogCols).
		AddRow(int64(2), "r2", "INSERT", nil, []byte(`{"a":1}`), ts).
		AddRow(int64(3), "r3", "DELETE", []byte(`{"a":1}`), nil, ts))
	n, err := w.readBatch(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, n)

	want := position.Make(ts, 3).Predecessor()
	mock.ExpectExec(wantSaveToken).WithArgs("c", string(position.EncodeToken(want, "t"))).WillReturnResult(sqlmock.NewResult(0, 1))
	expectCatchUp(w, mock, position.Make(ts, 1), want, ts, 1) // the loaded token's row, saved but never marked
	expectMark(mock, wantMark, []any{"t", ts, int64(1), want.ChangedAt, want.ID}, 2)
	require.NoError(t, w.MarkProcessed(context.Background(), tok(2)))

	mock.ExpectExec(wantSaveToken).WithArgs("c", sqlmock.AnyArg()).WillReturnError(errors.New("disk full"))
	err = w.MarkProcessed(context.Background(), tok(3))
	require.ErrorContains(t, err, "disk full")

	mock.ExpectExec(wantSaveToken).WithArgs("c", sqlmock.AnyArg()).WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectQuery(wantMark).WithArgs("t", want.ChangedAt, want.ID, ts, int64(3)).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(3)))
	mock.ExpectExec(wantMarkIDs).WithArgs("{3}").WillReturnError(errors.New("deadlock"))
	require.NoError(t, w.MarkProcessed(context.Background(), nil), "the flag may lag: its failure is not the save's")
	expectMark(mock, wantMark, []any{"t", want.ChangedAt, want.ID, ts, int64(3)}, 3)
	require.NoError(t, w.markPass(context.Background()), "marked from where marking stopped")
	require.NoError(t, mock.ExpectationsWereMet())
}

func TestRecoverLateRowQueriesByID(t *testing.T) {
	ts := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
	w, mock := newMockWatcher(t, Config{})
	w.loaded, w.cursor = true, position.Make(ts, 10)
	w.onNotification(`{"id": 7, "table": "t", "operation": "UPDATE"}`)
	mock.ExpectQuery(wantRead).WithArgs("t", ts, int64(10)).WillReturnRows(sqlmock.NewRows(changelogCols))
	mock.ExpectQuery(wantByID).WithArgs("t", int64(7)).WillReturnRows(sqlmock.NewRows(changelogCols).
		AddRow(int64(7), "r7", "UPDATE", []byte(`{"a":1}`), []byte(`{"a":2}`), ts.Add(-time.Second)))
	full, err := w.readOnce(context.Background())
	require.NoError(t, err)
	require.False(t, full)
	ev := <-w.Events()
	require.Equal(t, "7", string(ev.ResumeToken))
	require.Equal(t, map[string]any{"updatedFields": map[string]any{"a": 2.0}}, ev.Event["updateDescription"])
	require.NoError(t, mock.ExpectationsWereMet())
}

func TestFailedReadKeepsHints(t *testing.T) {
	ts := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
	w, mock := newMockWatcher(t, Config{})
	w.loaded, w.cursor = true, position.Make(ts, 10)
	w.onNotification(`{"id": 7, "table": "t", "operation": "INSERT"}`)
	mock.ExpectQuery(wantRead).WillReturnError(errors.New("connection reset"))
	_, err := w.readOnce(context.Background())
	require.ErrorContains(t, err, "connection reset")
	require.Equal(t, []int64{7}, w.hints.Take(), "the hint waits for the next read")
}

// TestProcessedFlagDefaults proves which constructors set the legacy processed flag: New's
// defaults save the token alone, the drop-in constructor and Config.ProcessedFlag also mark.
func TestProcessedFlagDefaults(t *testing.T) {
	ts := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
	for _, tc := range []struct {
		name string
		new  func(*sql.DB) *Watcher
		mark bool
	}{
		{"New defaults", func(db *sql.DB) *Watcher { return mustNew(t, testConfig(Config{DB: db})) }, false},
		{"DisableProcessedFlag", func(db *sql.DB) *Watcher {
			return mustNew(t, testConfig(Config{DB: db, DisableProcessedFlag: true}))
		}, false},
		{"ProcessedFlag", func(db *sql.DB) *Watcher { return mustNew(t, testConfig(Config{DB: db, ProcessedFlag: true})) }, true},
		{"NewPostgreSQLChangeStreamWatcher", func(db *sql.DB) *Watcher {
			return NewPostgreSQLChangeStreamWatcher(db, "c", "t", "", ModePolling)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, mock := mockDB(t)
			w := tc.new(db)
			expectLegacyChangelog(mock)
			mock.ExpectQuery(wantLoad).WithArgs("c").
				WillReturnRows(sqlmock.NewRows([]string{"resume_token"}).AddRow(string(position.EncodeToken(position.Make(ts, 1), "t"))))
			require.NoError(t, w.load(context.Background()))
			mock.ExpectQuery(wantRead).WithArgs("t", ts, int64(1)).WillReturnRows(sqlmock.NewRows(changelogCols).
				AddRow(int64(2), "r2", "INSERT", nil, []byte(`{"a":1}`), ts))
			_, err := w.readBatch(context.Background())
			require.NoError(t, err)
			want := position.Make(ts, 2)
			mock.ExpectExec(wantSaveToken).WithArgs("c", string(position.EncodeToken(want, "t"))).WillReturnResult(sqlmock.NewResult(0, 1))
			if tc.mark {
				expectCatchUp(w, mock, position.Make(ts, 1), want, ts)
				expectMark(mock, wantMark, []any{"t", ts, int64(1), want.ChangedAt, want.ID}, 2)
			}
			require.NoError(t, w.MarkProcessed(context.Background(), tok(2)))
			require.NoError(t, w.markPass(context.Background()), "no statement beyond those expected")
			require.NoError(t, mock.ExpectationsWereMet())
			require.Equal(t, tc.mark, w.cfg.marksProcessed())
		})
	}
}

func mustNew(t *testing.T, cfg Config) *Watcher {
	t.Helper()
	w, err := New(cfg)
	require.NoError(t, err)
	return w
}

func TestGetUnprocessedEventCount(t *testing.T) {
	w, mock := newMockWatcher(t, Config{ProcessedFlag: true})
	mock.ExpectQuery(`SELECT count(*) FROM "datastore_changelog" WHERE table_name = $1 AND id > $2 AND processed = FALSE`).
		WithArgs("t", int64(41)).WillReturnRows(sqlmock.NewRows([]string{"count"}).AddRow(int64(5)))
	n, err := w.GetUnprocessedEventCount(context.Background(), "41")
	require.NoError(t, err)
	require.Equal(t, int64(5), n)
	_, err = w.GetUnprocessedEventCount(context.Background(), "x")
	require.ErrorIs(t, err, ErrInvalidToken)
	require.NoError(t, mock.ExpectationsWereMet())
}
