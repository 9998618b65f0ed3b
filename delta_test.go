package pgchangestream

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/pgchangestream/pgchangestream/internal/marker"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// The first page of a delta, exactly as PostgreSQL receives it: one index range scan per
// (txid, id) range, at most one row more than a batch.
const wantDeltaRead = `SELECT c.id, c.record_id::text, c.operation, c.old_values::text, c.new_values::text, c.changed_at, c.txid
	FROM unnest($2::xid8[], $3::int8[], $4::xid8[], $5::int8[]) AS r(lo, lo_id, hi, hi_id)
	CROSS JOIN LATERAL (SELECT * FROM "datastore_changelog" WHERE table_name = $1
		AND (txid, id) > (r.lo, r.lo_id) AND (txid, id) <= (r.hi, r.hi_id) AND pg_visible_in_snapshot(txid, $6::pg_snapshot) AND id > $7
		ORDER BY txid, id LIMIT 101) c
	ORDER BY c.txid, c.id LIMIT 101`

// The first page of a delta of one range, exactly: an index range scan in the result's order.
const wantDeltaRange = `SELECT id, record_id::text, operation, old_values::text, new_values::text, changed_at, txid FROM "datastore_changelog"
	WHERE table_name = $1 AND (txid, id) > ($2::xid8, $3) AND (txid, id) <= ($4::xid8, $5) AND pg_visible_in_snapshot(txid, $6::pg_snapshot) AND id > $7
	ORDER BY txid, id LIMIT 101`

var deltaCols = append(append([]string{}, changelogCols...), "txid")

// expectUpgradedLoad expects the load of an upgraded changelog: the look for the txid column,
// the current snapshot with the newest stored txid, and the token.
func expectUpgradedLoad(w *Watcher, mock sqlmock.Sqlmock, snapshot string, newest any, token *sqlmock.Rows) {
	mock.ExpectQuery(wantDetect).WithArgs(`"datastore_changelog"`, `"datastore_changelog_incarnation"`).
		WillReturnRows(sqlmock.NewRows([]string{"skip_free", "incarnation", "stats"}).AddRow(true, false, true))
	mock.ExpectQuery(w.q.DeltaStart).WithArgs("t").
		WillReturnRows(sqlmock.NewRows([]string{"snapshot", "newest_txid"}).AddRow(snapshot, newest))
	mock.ExpectQuery(wantLoad).WithArgs("c").WillReturnRows(token)
}

// mustDecodeToken decodes a saved token.
func mustDecodeToken(t *testing.T, raw string) Position {
	t.Helper()
	p, err := position.DecodeToken([]byte(raw))
	require.NoError(t, err)
	return p
}

func savedTokenRows(raw ...string) *sqlmock.Rows {
	rows := sqlmock.NewRows([]string{"resume_token"})
	for _, r := range raw {
		rows.AddRow(r)
	}
	return rows
}

func TestDeltaReadsFollowSnapshots(t *testing.T) {
	ctx := context.Background()
	ts := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
	w, mock := newMockWatcher(t, Config{BatchSize: 100, ProcessedFlag: true})

	// A new client starts at the current snapshot, after the newest row.
	expectUpgradedLoad(w, mock, "100:105:100,103", "104", savedTokenRows())
	mock.ExpectQuery(wantNewest).WithArgs("t").WillReturnRows(sqlmock.NewRows([]string{"changed_at", "id"}).AddRow(ts, int64(9)))
	mock.ExpectExec(wantSaveToken).WithArgs("c",
		`{"timestamp":"2025-05-06T07:08:09Z","eventID":9,"snapshot":"100:105:100,103","table":"t"}`).WillReturnResult(sqlmock.NewResult(0, 1))
	require.NoError(t, w.load(ctx))
	require.True(t, w.skipFree.Load())
	loaded := w.Stats().Checkpoint

	// Nothing finished and xmax did not move: no read at all.
	mock.ExpectQuery(w.q.Snapshot).WillReturnRows(sqlmock.NewRows([]string{"s"}).AddRow("100:105:100,103"))
	n, err := w.readBatch(ctx)
	require.NoError(t, err)
	require.Zero(t, n)

	// Transaction 103 finished and 105..109 began and ended, 107 still runs: one point range,
	// then the range from the old xmax to the new one.
	mock.ExpectQuery(w.q.Snapshot).WillReturnRows(sqlmock.NewRows([]string{"s"}).AddRow("100:110:100,107"))
	mock.ExpectQuery(wantDeltaRead).WithArgs("t",
		"{103,104}", "{-9223372036854775808,9223372036854775807}", "{103,109}", "{9223372036854775807,9223372036854775807}",
		"100:110:100,107", int64(position.MinID)).
		WillReturnRows(sqlmock.NewRows(deltaCols).
			AddRow(int64(12), "r", "UPDATE", []byte(`{"a":0}`), []byte(`{"a":2}`), ts, "103").
			AddRow(int64(8), "r", "UPDATE", []byte(`{"a":0}`), []byte(`{"a":1}`), ts, "106").
			AddRow(int64(13), "r13", "INSERT", nil, []byte(`{"a":3}`), ts, "106"))
	n, err = w.readBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	first, second, third := <-w.Events(), <-w.Events(), <-w.Events()
	require.Equal(t, "8", string(first.ResumeToken), "delta order is id, not (txid, id)")
	require.Equal(t, "12", string(second.ResumeToken))
	require.Equal(t, "13", string(third.ResumeToken))
	require.True(t, w.Stats().Cursor.AtDeltaStart(), "a read the delta does not follow ends it")
	require.Equal(t, "100:110:100,107", w.Stats().Cursor.Span.Base.String())

	// The ack certifies row 8: the saved token is inside the delta, before row 12 (at its
	// predecessor), and the processed flag is set through the ranges from the start position to it,
	// after the first pass caught up on the rows the start position certifies (row 4 was not set).
	const saved = `{"timestamp":"2025-05-06T07:08:09Z","eventID":11,"snapshot":"100:105:100,103","deltaEnd":"100:110:100,107","deltaAfterID":11,"table":"t"}`
	mock.ExpectExec(wantSaveToken).WithArgs("c", saved).WillReturnResult(sqlmock.NewResult(0, 1))
	expectCatchUp(w, mock, loaded, mustDecodeToken(t, saved), ts, 4)
	expectMark(mock, marker.NewStatements(w.cfg.ChangelogTable).Delta, []any{"t",
		"{103,104}", "{-9223372036854775808,9223372036854775807}", "{103,109}", "{9223372036854775807,9223372036854775807}",
		"100:105:100,103", "100:110:100,107", int64(11)}, 8)
	require.NoError(t, w.MarkProcessed(ctx, first.ResumeToken))

	// The ack of row 12 moves the token on inside the delta: the flag is set by id, after 11.
	mock.ExpectExec(wantSaveToken).WithArgs("c",
		`{"timestamp":"2025-05-06T07:08:09Z","eventID":12,"snapshot":"100:105:100,103","deltaEnd":"100:110:100,107","deltaAfterID":12,"table":"t"}`).
		WillReturnResult(sqlmock.NewResult(0, 1))
	expectMark(mock, marker.NewStatements(w.cfg.ChangelogTable).InDelta, []any{"t", int64(11), int64(12), "100:110:100,107"}, 12)
	require.NoError(t, w.MarkProcessed(ctx, second.ResumeToken))
	require.NoError(t, mock.ExpectationsWereMet())
}

// A delta larger than a batch: the first page (one more row than a batch) says so, the ids of
// the delta are listed once in id order, and its pages are read from the list by primary key,
// each prefetched while the one before is delivered. The list ends the delta.
func TestLargeDeltaIsListedThenReadByID(t *testing.T) {
	ctx := context.Background()
	ts := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
	w, mock := newMockWatcher(t, Config{BatchSize: 2})
	expectUpgradedLoad(w, mock, "100:105:", nil, savedTokenRows(`{"timestamp":"2025-05-06T07:08:09Z","eventID":5,"snapshot":"100:105:"}`))
	require.NoError(t, w.load(ctx))
	mock.ExpectQuery(w.q.Snapshot).WillReturnRows(sqlmock.NewRows([]string{"s"}).AddRow("100:108:"))
	rows := func(ids ...int64) *sqlmock.Rows {
		r := sqlmock.NewRows(deltaCols)
		for _, id := range ids {
			r.AddRow(id, "r", "INSERT", nil, []byte(`{}`), ts, "106")
		}
		return r
	}
	mock.ExpectQuery(w.q.DeltaRange).WithArgs("t", "104", int64(position.MaxID), "107", int64(position.MaxID), "100:108:", int64(position.MinID)).
		WillReturnRows(rows(9, 7, 8))
	mock.ExpectQuery(w.q.DeltaIDs).WithArgs("t", "{104}", "{9223372036854775807}", "{107}", "{9223372036854775807}", "100:108:", int64(position.MinID)).
		WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(6)).AddRow(int64(8)).AddRow(int64(9)).AddRow(int64(10)).AddRow(int64(11)))
	// A page with a gap is read by its ids, one of consecutive ids as a key range.
	mock.ExpectQuery(w.q.DeltaRows).WithArgs("{6,8}").WillReturnRows(rows(6, 8))
	mock.ExpectQuery(w.q.DeltaKeyRange).WithArgs(int64(9), int64(10)).WillReturnRows(rows(9, 10))
	mock.ExpectQuery(w.q.DeltaKeyRange).WithArgs(int64(11), int64(11)).WillReturnRows(rows(11))
	var got []string
	for range 3 {
		full, err := w.readOnce(ctx)
		require.NoError(t, err)
		for len(w.Events()) > 0 {
			got = append(got, string((<-w.Events()).ResumeToken))
		}
		require.True(t, full, "more follows at once: the list, then the next delta, whose rows may have notified while the list was read")
	}
	require.Equal(t, []string{"6", "8", "9", "10", "11"}, got)
	require.True(t, w.Stats().Cursor.AtDeltaStart(), "the list ended the delta")
	require.Equal(t, "100:108:", w.Stats().Cursor.Span.Base.String())
	require.Nil(t, w.pager.ids, "the list is dropped with its delta")
	require.NoError(t, mock.ExpectationsWereMet())
}

// A watcher that ends a delta whose end snapshot it loaded with the token (a restart, or a
// rewind after a server recovery) reads the next delta at once: rows committed since that
// snapshot notified before the watcher listened, and no NOTIFY will come for them. A delta whose
// end this read took waits for the next NOTIFY as usual.
func TestLoadedDeltaEndReadsTheNextDeltaAtOnce(t *testing.T) {
	ctx := context.Background()
	w, mock := newMockWatcher(t, Config{})
	expectUpgradedLoad(w, mock, "100:109:", nil, savedTokenRows(
		`{"timestamp":"2025-05-06T07:08:09Z","eventID":5,"snapshot":"100:105:","deltaEnd":"100:108:","deltaAfterID":5}`))
	require.NoError(t, w.load(ctx))
	mock.ExpectQuery(w.q.DeltaRange).WithArgs("t", "104", int64(position.MaxID), "107", int64(position.MaxID), "100:108:", int64(5)).
		WillReturnRows(sqlmock.NewRows(deltaCols))
	full, err := w.readOnce(ctx)
	require.NoError(t, err)
	require.True(t, full, "the loaded delta ended: the next one is read at once")

	mock.ExpectQuery(w.q.Snapshot).WillReturnRows(sqlmock.NewRows([]string{"s"}).AddRow("100:110:"))
	mock.ExpectQuery(w.q.DeltaRange).WithArgs("t", "107", int64(position.MaxID), "109", int64(position.MaxID), "100:110:", int64(position.MinID)).
		WillReturnRows(sqlmock.NewRows(deltaCols))
	full, err = w.readOnce(ctx)
	require.NoError(t, err)
	require.False(t, full, "a delta this read took the end of waits for the next NOTIFY")
	require.NoError(t, mock.ExpectationsWereMet())
}

// A token inside a delta resumes after its id, and one an earlier release saved in (txid, id)
// order resumes at the start of its delta.
func TestDeltaTokensResume(t *testing.T) {
	ctx := context.Background()
	ts := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
	for _, tc := range []struct {
		name, token string
		after       int64
	}{
		{"inside a delta", `{"timestamp":"2025-05-06T07:08:09Z","eventID":8,"snapshot":"100:105:","deltaEnd":"100:110:","deltaAfterID":8}`, 8},
		{"earlier release", `{"timestamp":"2025-05-06T07:08:09Z","eventID":8,"snapshot":"100:105:","deltaEnd":"100:110:","deltaXid":"106","deltaID":8}`, position.MinID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, mock := newMockWatcher(t, Config{})
			expectUpgradedLoad(w, mock, "100:112:", nil, savedTokenRows(tc.token))
			require.NoError(t, w.load(ctx))
			mock.ExpectQuery(w.q.DeltaRange).WithArgs("t", "104", int64(position.MaxID), "109", int64(position.MaxID), "100:110:", tc.after).
				WillReturnRows(sqlmock.NewRows(deltaCols).AddRow(int64(9), "r", "INSERT", nil, []byte(`{}`), ts, "107"))
			n, err := w.readBatch(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Equal(t, "9", string((<-w.Events()).ResumeToken))
			require.Equal(t, "100:110:", w.Stats().Cursor.Span.Base.String(), "the delta is done")
			require.NoError(t, mock.ExpectationsWereMet())
		})
	}
}

// A legacy token on an upgraded changelog switches over: the rows after it without a txid (or
// with a txid below the cut) in legacy order, then deltas from the current snapshot cut below the
// lowest txid of the rows after it above those of the rows before it (103 of 100:105:), so that
// those rows are read in id order.
func TestLegacyTokenSwitchesOver(t *testing.T) {
	ctx := context.Background()
	ts := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
	w, mock := newMockWatcher(t, Config{BatchSize: 2, ProcessedFlag: true})
	expectUpgradedLoad(w, mock, "100:105:", nil, savedTokenRows(`{"timestamp":"2025-05-06T07:08:09Z","eventID":5}`))
	mock.ExpectQuery(w.q.SwitchCut).WithArgs("t", ts, int64(5), ts, int64(5), "100:105:", true).
		WillReturnRows(sqlmock.NewRows([]string{"txid"}).AddRow("103"))
	mock.ExpectExec(wantSaveToken).WithArgs("c", `{"timestamp":"2025-05-06T07:08:09Z","eventID":5,"switchover":"103:103:","table":"t"}`).
		WillReturnResult(sqlmock.NewResult(0, 1))
	require.NoError(t, w.load(ctx), "the switch-over snapshot is saved at once, so a restart keeps it")
	loaded := w.Stats().Checkpoint

	// The legacy part: rows after the legacy position that the switch-over snapshot sees (or
	// without a txid).
	mock.ExpectQuery(w.q.SwitchRead).WithArgs("t", ts, int64(5), "103:103:").
		WillReturnRows(sqlmock.NewRows(changelogCols).AddRow(int64(6), "r6", "INSERT", nil, []byte(`{}`), ts))
	n, err := w.readBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "6", string((<-w.Events()).ResumeToken))
	cur := w.Stats().Cursor
	require.True(t, cur.AtDeltaStart(), "the legacy part ended: deltas start at its snapshot")
	require.Equal(t, "103:103:", cur.Span.Base.String())

	// The first save after the switch-over also marks the rest of the legacy part.
	const saved = `{"timestamp":"2025-05-06T07:08:09Z","eventID":6,"snapshot":"103:103:","table":"t"}`
	mock.ExpectExec(wantSaveToken).WithArgs("c", saved).WillReturnResult(sqlmock.NewResult(0, 1))
	expectCatchUp(w, mock, loaded, mustDecodeToken(t, saved), ts)
	expectMark(mock, marker.NewStatements(w.cfg.ChangelogTable).Switch, []any{"t", "{}", "{}", "{}", "{}",
		"103:103:", "103:103:", int64(6), ts, int64(5)}, 6)
	require.NoError(t, w.MarkProcessed(ctx, []byte("6")))

	// The first delta reads the rows of txids 103 and 104 in id order.
	mock.ExpectQuery(w.q.Snapshot).WillReturnRows(sqlmock.NewRows([]string{"s"}).AddRow("106:106:"))
	mock.ExpectQuery(w.q.DeltaRange).WithArgs("t", "102", int64(position.MaxID), "105", int64(position.MaxID), "106:106:", int64(position.MinID)).
		WillReturnRows(sqlmock.NewRows(deltaCols).
			AddRow(int64(8), "r", "UPDATE", nil, []byte(`{}`), ts, "103").
			AddRow(int64(7), "r", "UPDATE", nil, []byte(`{}`), ts.Add(time.Second), "104"))
	n, err = w.readBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, "7", string((<-w.Events()).ResumeToken))
	require.Equal(t, "8", string((<-w.Events()).ResumeToken))
	require.NoError(t, mock.ExpectationsWereMet())
}

func TestRestoredDatabaseIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		newest any
		token  *sqlmock.Rows
	}{
		{"stored txid", "200", savedTokenRows()},
		{"token snapshot", nil, savedTokenRows(`{"timestamp":"2025-05-06T07:08:09Z","eventID":5,"snapshot":"300:310:"}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, mock := newMockWatcher(t, Config{})
			mock.ExpectQuery(wantDetect).WillReturnRows(sqlmock.NewRows([]string{"skip_free", "incarnation", "stats"}).AddRow(true, false, true))
			mock.ExpectQuery(w.q.DeltaStart).WillReturnRows(sqlmock.NewRows([]string{"s", "n"}).AddRow("100:105:", tc.newest))
			if tc.newest == nil {
				mock.ExpectQuery(wantLoad).WillReturnRows(tc.token)
				// checked again after the read: the counter moved on, but not up to the token
				mock.ExpectQuery(w.q.Snapshot).WillReturnRows(sqlmock.NewRows([]string{"s"}).AddRow("100:108:"))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := w.loadWithRetry(ctx)
			require.ErrorIs(t, err, ErrRestoredDatabase)
			require.ErrorContains(t, err, "Restoring a database", "the error names the fix")
			require.NoError(t, ctx.Err(), "refused at once, not retried")
			require.NoError(t, mock.ExpectationsWereMet())
		})
	}
}

// TestTokenSavedDuringLoadIsNotARestore: the load takes its snapshot, then reads the token. A
// token saved in between (by another instance of the client) can hold a snapshot taken after
// the load's: that is no restored database. The load checks it against a snapshot taken after
// the read, and resumes after the token.
func TestTokenSavedDuringLoadIsNotARestore(t *testing.T) {
	for _, tc := range []struct {
		name, token string
	}{
		{"delta start", `{"timestamp":"2025-05-06T07:08:09Z","eventID":5,"snapshot":"100:110:"}`},
		{"inside a delta", `{"timestamp":"2025-05-06T07:08:09Z","eventID":5,"snapshot":"100:105:","deltaEnd":"100:110:","deltaAfterID":5}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, mock := newMockWatcher(t, Config{})
			expectUpgradedLoad(w, mock, "100:105:", "104", savedTokenRows(tc.token))
			mock.ExpectQuery(w.q.Snapshot).WillReturnRows(sqlmock.NewRows([]string{"s"}).AddRow("100:110:"))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, w.loadWithRetry(ctx))
			want := mustDecodeToken(t, tc.token)
			require.Zero(t, want.Compare(w.Stats().Checkpoint), "resumes after the token: %s", w.Stats().Checkpoint)
			require.NoError(t, mock.ExpectationsWereMet())
		})
	}
}

func TestDeltaReadErrorKeepsTheDelta(t *testing.T) {
	ctx := context.Background()
	w, mock := newMockWatcher(t, Config{})
	expectUpgradedLoad(w, mock, "100:105:", nil, savedTokenRows(`{"timestamp":"2025-05-06T07:08:09Z","eventID":5,"snapshot":"100:105:"}`))
	require.NoError(t, w.load(ctx))
	mock.ExpectQuery(w.q.Snapshot).WillReturnRows(sqlmock.NewRows([]string{"s"}).AddRow("100:107:"))
	mock.ExpectQuery(wantDeltaRange).WithArgs("t", "104", int64(position.MaxID), "106", int64(position.MaxID), "100:107:", int64(position.MinID)).
		WillReturnError(errors.New("connection reset"))
	_, err := w.readBatch(ctx)
	require.ErrorContains(t, err, "connection reset")
	require.Equal(t, "100:105:", w.Stats().Cursor.Span.Base.String(), "the cursor stays before the delta")
	require.NoError(t, mock.ExpectationsWereMet())
}

// NOTIFY ids noted before the load found an upgraded changelog are dropped: Close must not take
// them for late rows (a legacy position in the ring would save a legacy token).
func TestNotifyIDsBeforeLoadAreNotLateRows(t *testing.T) {
	ctx := context.Background()
	w, mock := newMockWatcher(t, Config{})
	w.onNotification(`{"id": 1, "table": "t", "operation": "INSERT"}`)
	expectUpgradedLoad(w, mock, "100:105:", nil, savedTokenRows(`{"timestamp":"2025-05-06T07:08:09Z","eventID":5,"snapshot":"100:105:"}`))
	require.NoError(t, w.load(ctx))
	w.onNotification(`{"id": 2, "table": "t", "operation": "INSERT"}`)
	require.NoError(t, w.holdUnhandledLateRows(ctx), "no row is fetched by id")
	require.Empty(t, w.hints.Take())
	require.Zero(t, w.Stats().Pending)
	require.NoError(t, mock.ExpectationsWereMet())
}
