package pgchangestream

import (
	"context"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// TestReadsWithoutStatisticsUseIndexPlans proves that while the changelog has no statistics
// each read runs in a read-only transaction that turns every other plan off first, under a
// statement text of its own, that the watcher looks for statistics again at most once per
// statsCheckInterval, and that reads are plain statements again once they exist.
func TestReadsWithoutStatisticsUseIndexPlans(t *testing.T) {
	ctx := context.Background()
	ts := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
	w, mock := newMockWatcher(t, Config{})
	mock.ExpectQuery(wantDetect).WithArgs(`"datastore_changelog"`, `"datastore_changelog_incarnation"`).
		WillReturnRows(sqlmock.NewRows([]string{"skip_free", "incarnation", "stats"}).AddRow(false, false, false))
	mock.ExpectQuery(wantLoad).WithArgs("c").
		WillReturnRows(sqlmock.NewRows([]string{"resume_token"}).AddRow(string(position.EncodeToken(position.Make(ts, 1), "t"))))
	require.NoError(t, w.load(ctx))

	expectIndexPlanRead := func(after int64) {
		mock.ExpectBegin()
		mock.ExpectExec(indexPlansSQL).WillReturnResult(sqlmock.NewResult(0, 0))
		mock.ExpectQuery(indexPlansTag+wantRead).WithArgs("t", ts, after).WillReturnRows(sqlmock.NewRows(changelogCols).
			AddRow(after+1, "r", "INSERT", nil, []byte(`{"a":1}`), ts))
		mock.ExpectRollback()
	}
	expectIndexPlanRead(1)
	n, err := w.readBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	receive(t, w, 1)
	expectIndexPlanRead(2) // looked for less than statsCheckInterval ago: not again
	_, err = w.readBatch(ctx)
	require.NoError(t, err)
	receive(t, w, 1)

	w.statsChecked = time.Now().Add(-statsCheckInterval)
	mock.ExpectQuery(`SELECT ` + changelog.StatsExistSQL("$1")).WithArgs(`"datastore_changelog"`).
		WillReturnRows(sqlmock.NewRows([]string{"exists"}).AddRow(true))
	mock.ExpectQuery(wantRead).WithArgs("t", ts, int64(3)).WillReturnRows(sqlmock.NewRows(changelogCols))
	_, err = w.readBatch(ctx)
	require.NoError(t, err)
	w.statsChecked = time.Now().Add(-statsCheckInterval)
	mock.ExpectQuery(wantRead).WithArgs("t", ts, int64(3)).WillReturnRows(sqlmock.NewRows(changelogCols))
	_, err = w.readBatch(ctx)
	require.NoError(t, err, "once statistics exist they are not looked for again")
	require.NoError(t, mock.ExpectationsWereMet())
}
