package pgchangestream

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/stretchr/testify/require"
)

// syncBuffer is a log sink safe for the watcher's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestCheckTableName(t *testing.T) {
	for _, tc := range []struct {
		name, table string
		found       bool
		err         error
		want        string // "" means no warning
	}{
		{"found", "items", true, nil, ""},
		{"not found", "itemz", false, nil, "no changelog row and no table with a trigger has Config.TableName"},
		{"schema prefix", "public.items", false, nil, "has a schema prefix"},
		{"schema prefix that matches", "odd.name", true, nil, ""},
		{"query fails", "items", false, errors.New("permission denied"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, mock := mockDB(t)
			var logs syncBuffer
			w, err := New(Config{DB: db, ClientName: "c", TableName: tc.table, Mode: ModePolling,
				ChangelogTable: "audit.changes", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			require.NoError(t, err)
			q := mock.ExpectQuery(changelog.TableCheckSQL("audit.changes")).WithArgs(tc.table)
			if tc.err != nil {
				q.WillReturnError(tc.err)
			} else {
				q.WillReturnRows(sqlmock.NewRows([]string{"exists"}).AddRow(tc.found))
			}
			w.checkTableName(t.Context())
			require.NoError(t, mock.ExpectationsWereMet())
			if tc.want == "" {
				require.NotContains(t, logs.String(), "level=WARN")
				return
			}
			require.Contains(t, logs.String(), "level=WARN")
			require.Contains(t, logs.String(), tc.want)
			require.Contains(t, logs.String(), "table="+tc.table)
		})
	}
	require.Contains(t, changelog.TableCheckSQL("audit.changes"), `FROM "audit"."changes" WHERE table_name = $1`)
}

// TestLiveStartWarnsAboutTableName runs the check at Start against a real changelog.
func TestLiveStartWarnsAboutTableName(t *testing.T) {
	e := newLive(t)
	for table, warning := range map[string]string{
		"public." + liveTable: `msg="Config.TableName has a schema prefix, but the changelog records bare table names: no event will match" client=public.items table=public.items use=items`,
		"nothing":             "no changelog row and no table with a trigger has Config.TableName",
		liveTable:             "",
	} {
		var logs syncBuffer
		cfg := e.config(ModePolling)
		cfg.TableName, cfg.Logger = table, slog.New(slog.NewTextHandler(&logs, nil))
		cfg.ClientName = table // a client of its own: a token of another table is warned about
		w := e.start(cfg)
		require.Eventually(t, func() bool { empty, _ := w.LagState(); return !empty.IsZero() },
			liveWait, 10*time.Millisecond, "the first read, which follows the check")
		require.NoError(t, w.Close(context.Background()))
		if warning == "" {
			require.NotContains(t, logs.String(), "level=WARN", table)
			continue
		}
		require.Contains(t, logs.String(), warning, table)
	}
}
