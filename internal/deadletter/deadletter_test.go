package deadletter

import (
	"database/sql/driver"
	"errors"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// newMock returns the store of client "c" beside datastore_changelog on a sqlmock database
// that matches statements exactly.
func newMock(t *testing.T) (*Store, sqlmock.Sqlmock) {
	t.Helper()
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, mock.ExpectationsWereMet())
		_ = db.Close()
	})
	return New(db, changelog.DefaultChangelogTable, "c"), mock
}

const insertSQL = `INSERT INTO "datastore_changelog_parked"` +
	` (client_name, event_key, table_name, changelog_id, event, error, attempts, blocking)
		SELECT $1::text, $2::text, $3::text, $4::bigint, $5::text::jsonb, $6::text, $7::int, $8::boolean`

func TestStorableText(t *testing.T) {
	for s, want := range map[string]bool{"": true, "items/r1": true, "n\u00e9": true, "a\x00b": false, "\xff": false} {
		require.Equal(t, want, storableText(s), "%q", s)
	}
}

// A key the text column cannot hold is refused before any statement runs.
func TestParkRefusesAnUnstorableKey(t *testing.T) {
	s, _ := newMock(t)
	for _, key := range []string{"a\x00b", "a\xffb"} {
		_, err := s.Park(t.Context(), Event{Key: key, ChangelogID: 7})
		require.ErrorContains(t, err, `park event 7 of key `)
		require.ErrorContains(t, err, "the key holds a NUL byte or invalid UTF-8")
	}
}

// The handler's error text is stored with the bytes text cannot hold replaced, and the
// document as JSON.
func TestParkStoresTheEventAndAStorableError(t *testing.T) {
	s, mock := newMock(t)
	mock.ExpectQuery(insertSQL+` RETURNING id`).
		WithArgs("c", "k", "items", int64(452), `{"a":1}`, `bad\x00`+"\ufffd", 3, true).
		WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(9)))
	id, err := s.Park(t.Context(), Event{Client: "ignored", Key: "k", Table: "items", ChangelogID: 452,
		Event: map[string]any{"a": 1}, Error: "bad\x00\xff", Attempts: 3, Blocking: true})
	require.NoError(t, err)
	require.Equal(t, int64(9), id)
}

// A fence that selects no row inserts nothing: inserted is false, without an error.
func TestInsertFencedOffInsertsNothing(t *testing.T) {
	s, mock := newMock(t)
	fence := ` FROM tok WHERE tok.epoch = $9`
	mock.ExpectQuery(insertSQL+fence+` RETURNING id`).
		WithArgs("c", "k", "", int64(1), `null`, "", 0, false, int64(5)).
		WillReturnRows(sqlmock.NewRows([]string{"id"}))
	id, inserted, err := s.Insert(t.Context(), Event{Key: "k", ChangelogID: 1}, fence, int64(5))
	require.NoError(t, err)
	require.False(t, inserted)
	require.Zero(t, id)
}

// A missing table says how to create it; another failure names the table.
func TestFailuresNameTheTable(t *testing.T) {
	s, mock := newMock(t)
	mock.ExpectQuery(`SELECT DISTINCT event_key FROM "datastore_changelog_parked" WHERE client_name = $1 AND blocking ORDER BY event_key`).
		WithArgs("c").WillReturnError(&pgconn.PgError{Code: changelog.UndefinedTable, Message: "relation does not exist"})
	_, err := s.BlockedKeys(t.Context())
	require.ErrorContains(t, err, "pgchangestream: read blocked keys: dead-letter table datastore_changelog_parked is missing (run schema.Install)")

	denied := errors.New("permission denied for table datastore_changelog_parked")
	mock.ExpectExec(`UPDATE "datastore_changelog_parked" SET attempts = $3, error = $4, retry_requested = FALSE, parked_at = NOW() WHERE client_name = $1 AND id = $2`).
		WithArgs("c", int64(9), 4, "boom").WillReturnError(denied)
	err = s.Repark(t.Context(), 9, 4, "boom")
	require.ErrorIs(t, err, denied)
	require.ErrorContains(t, err, "pgchangestream: park event again in datastore_changelog_parked: ")
}

// Rows are read with their documents decoded; a document that does not decode fails the read.
func TestReadsDecodeTheDocuments(t *testing.T) {
	s, mock := newMock(t)
	cols := []string{"id", "client_name", "event_key", "table_name", "changelog_id", "event", "error", "attempts",
		"blocking", "retry_requested", "parked_at"}
	at := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	row := func(id int64, doc string) []driver.Value {
		return []driver.Value{id, "c", "k", "items", int64(452), []byte(doc), "boom", 2, true, false, at}
	}
	mock.ExpectQuery(`SELECT `+parkedColumns+` FROM "datastore_changelog_parked" WHERE client_name = $1 AND event_key = $2 ORDER BY id`).
		WithArgs("c", "k").WillReturnRows(sqlmock.NewRows(cols).AddRow(row(9, `{"a": {"b": 1}}`)...))
	evs, err := s.KeyEvents(t.Context(), "k")
	require.NoError(t, err)
	require.Equal(t, []Event{{ID: 9, Client: "c", Key: "k", Table: "items", ChangelogID: 452,
		Event: map[string]any{"a": map[string]any{"b": float64(1)}}, Error: "boom", Attempts: 2, Blocking: true, ParkedAt: at}}, evs)

	mock.ExpectQuery(`SELECT `+parkedColumns+` FROM "datastore_changelog_parked" WHERE client_name = $1 AND retry_requested ORDER BY id LIMIT $2`).
		WithArgs("c", 10).WillReturnRows(sqlmock.NewRows(cols).AddRow(row(9, `[1]`)...))
	_, err = s.Released(t.Context(), 10)
	require.ErrorContains(t, err, "read released events in datastore_changelog_parked: parked event 9: decode its document")
}

// List of client "" lists every client's events.
func TestListOfEveryClient(t *testing.T) {
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	require.NoError(t, err)
	defer db.Close()
	mock.ExpectQuery(`SELECT ` + parkedColumns + ` FROM "log_parked" WHERE $1 = '' OR client_name = $1 ORDER BY id`).
		WithArgs("").WillReturnRows(sqlmock.NewRows(nil))
	evs, err := New(db, "log", "").List(t.Context())
	require.NoError(t, err)
	require.Empty(t, evs)
	require.NoError(t, mock.ExpectationsWereMet())
}

// Request and Drop of an id the client has not parked return ErrNotParked; FinishIn reports
// whether a row went.
func TestAnIdNotParked(t *testing.T) {
	s, mock := newMock(t)
	request := `UPDATE "datastore_changelog_parked" SET retry_requested = TRUE WHERE client_name = $1 AND id = $2`
	drop := `DELETE FROM "datastore_changelog_parked" WHERE client_name = $1 AND id = $2`
	mock.ExpectExec(request).WithArgs("c", int64(9)).WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectExec(request).WithArgs("c", int64(8)).WillReturnResult(sqlmock.NewResult(0, 0))
	mock.ExpectExec(drop).WithArgs("c", int64(8)).WillReturnResult(sqlmock.NewResult(0, 0))
	mock.ExpectExec(drop).WithArgs("c", int64(9)).WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectExec(drop).WithArgs("c", int64(9)).WillReturnResult(sqlmock.NewResult(0, 0))
	require.NoError(t, s.Request(t.Context(), 9))
	err := s.Request(t.Context(), 8)
	require.ErrorIs(t, err, changelog.ErrNotParked)
	require.ErrorContains(t, err, `client "c" has no parked event 8`)
	require.ErrorIs(t, s.Drop(t.Context(), 8), changelog.ErrNotParked)
	found, err := s.FinishIn(t.Context(), s.db, 9)
	require.NoError(t, err)
	require.True(t, found)
	found, err = s.FinishIn(t.Context(), s.db, 9)
	require.NoError(t, err)
	require.False(t, found, "an operator dropped it")
}
