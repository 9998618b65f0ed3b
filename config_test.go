package pgchangestream

import (
	"database/sql"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/stretchr/testify/require"
)

func mockDB(t *testing.T) (*sql.DB, sqlmock.Sqlmock) {
	t.Helper()
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db, mock
}

func TestNewFillsDefaults(t *testing.T) {
	db, _ := mockDB(t)
	w, err := New(Config{DB: db, ClientName: "c", TableName: "t", Logger: quietLogger})
	require.NoError(t, err)
	c := w.cfg
	require.Equal(t, ModeHybrid, c.Mode)
	require.Equal(t, "datastore_changelog", c.ChangelogTable)
	require.Equal(t, "resume_tokens", c.TokenTable)
	require.Equal(t, "nvsentinel_changes", c.NotifyChannel)
	require.Equal(t, 10*time.Millisecond, c.PollInterval)
	require.Equal(t, time.Second, c.FallbackPollInterval)
	require.Equal(t, 100, c.BatchSize)
	require.Equal(t, 100, cap(w.events))
	require.Equal(t, 4096, len(w.ring.buf))
	require.Equal(t, time.Second, c.IdleCheckpointInterval)
	require.Nil(t, w.listen, "hybrid without a connection string polls")
	require.Equal(t, c.PollInterval, w.pollWait())
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	db, _ := mockDB(t)
	base := Config{DB: db, ClientName: "c", TableName: "t"}
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"no db", func(c *Config) { c.DB = nil }, "Config.DB is required"},
		{"no client", func(c *Config) { c.ClientName = " " }, "Config.ClientName is required"},
		{"no table", func(c *Config) { c.TableName = "" }, "Config.TableName is required"},
		{"bad mode", func(c *Config) { c.Mode = "push" }, `Config.Mode "push"`},
		{"notify without conn", func(c *Config) { c.Mode = ModeNotify }, "Config.ConnString is required in notify mode"},
		{"bad conn string", func(c *Config) { c.ConnString = "postgres://[::1"; c.Mode = ModeNotify }, "Config.ConnString"},
		{"injected table", func(c *Config) { c.ChangelogTable = `x"; DROP TABLE y; --` }, "Config.ChangelogTable"},
		{"three-part table", func(c *Config) { c.TokenTable = "a.b.c" }, "Config.TokenTable"},
		{"long name", func(c *Config) { c.TokenTable = string(make([]byte, 64)) }, "Config.TokenTable"},
		{"dotted channel", func(c *Config) { c.NotifyChannel = "a.b" }, "Config.NotifyChannel"},
		{"negative poll", func(c *Config) { c.PollInterval = -time.Second }, "Config.PollInterval"},
		{"negative batch", func(c *Config) { c.BatchSize = -1 }, "Config.BatchSize"},
		{"negative pending", func(c *Config) { c.MaxPending = -1 }, "Config.MaxPending"},
		{"negative checkpoint interval", func(c *Config) { c.CheckpointInterval = -1 }, "Config.CheckpointInterval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.change(&cfg)
			w, err := New(cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.ErrorContains(t, err, tc.want)
			require.Nil(t, w)
		})
	}
}

func TestSchemaQualifiedNamesAreQuoted(t *testing.T) {
	db, _ := mockDB(t)
	w, err := New(Config{DB: db, ClientName: "c", TableName: "t", Mode: ModePolling,
		ChangelogTable: "audit.Changes", TokenTable: "tokens"})
	require.NoError(t, err)
	require.Contains(t, w.q.read, `FROM "audit"."Changes"`)
	require.Contains(t, w.q.saveLegacy, `INSERT INTO "tokens"`)
}

func TestLegacyConstructorReportsBadArguments(t *testing.T) {
	w := NewPostgreSQLChangeStreamWatcher(nil, "c", "t", "", ModePolling)
	w.Start(t.Context())
	_, open := <-w.Events()
	require.False(t, open, "Events closes at once")
	require.ErrorIs(t, w.Err(), ErrInvalidConfig)
	require.ErrorIs(t, w.MarkProcessed(t.Context(), tok(1)), ErrInvalidConfig)
	require.NoError(t, w.Close(t.Context()))
}

func TestLegacyConstructorDefaults(t *testing.T) {
	db, _ := mockDB(t)
	w := NewPostgreSQLChangeStreamWatcher(db, "c", "t", "", "bogus")
	require.NoError(t, w.cfgErr)
	require.Equal(t, ModePolling, w.cfg.Mode, "an unknown mode falls back to polling")
	require.Equal(t, 10*time.Millisecond, w.cfg.PollInterval)
	require.Equal(t, 100, cap(w.events))

	w = NewPostgreSQLChangeStreamWatcher(db, "c", "t", "postgres://u@localhost/db", ModeHybrid)
	require.NotNil(t, w.listen)
	require.Equal(t, "pgchangestream", w.listen.RuntimeParams["application_name"])
}

func TestCloseBeforeStart(t *testing.T) {
	db, _ := mockDB(t)
	w, err := New(Config{DB: db, ClientName: "c", TableName: "t"})
	require.NoError(t, err)
	require.NoError(t, w.Close(t.Context()))
	_, open := <-w.Events()
	require.False(t, open)
	w.Start(t.Context()) // ignored
	require.NoError(t, w.Close(t.Context()))
	require.NoError(t, w.Err())
}
