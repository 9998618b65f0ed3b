package pgchangestream

import (
	"database/sql"
	"strings"
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
	require.Equal(t, 4096, w.ring.Cap())
	require.Equal(t, time.Second, c.IdleCheckpointInterval)
	require.Equal(t, time.Minute, c.CheckpointRefreshInterval)
	require.Equal(t, 30*time.Second, c.LockSessionTimeout)
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
		{"negative buffer", func(c *Config) { c.BufferSize = -5 }, "Config.BufferSize must be between 1 and 100000, got -5"},
		{"batch above the cap", func(c *Config) { c.BatchSize = MaxBatchSize + 1 }, "Config.BatchSize must be between 1 and 100000"},
		{"buffer above the cap", func(c *Config) { c.BufferSize = 1 << 40 }, "Config.BufferSize must be between 1 and 100000"},
		{"pending above the cap", func(c *Config) { c.MaxPending = MaxMaxPending + 1 }, "Config.MaxPending must be between 1 and 1048576"},
		{"poll below 1ms", func(c *Config) { c.PollInterval = time.Microsecond }, "Config.PollInterval must be at least 1ms, got 1µs"},
		{"fallback poll below 1ms", func(c *Config) { c.FallbackPollInterval = 1 }, "Config.FallbackPollInterval must be at least 1ms"},
		{"idle checkpoint below 1ms", func(c *Config) { c.IdleCheckpointInterval = 999 * time.Microsecond }, "Config.IdleCheckpointInterval"},
		{"negative refresh interval", func(c *Config) { c.CheckpointRefreshInterval = -time.Minute }, "Config.CheckpointRefreshInterval must be at least 1ms, got -1m0s"},
		{"lock session timeout below 4s", func(c *Config) { c.LockSessionTimeout = 3999 * time.Millisecond },
			"Config.LockSessionTimeout must be between 4s and 24h0m0s, got 3.999s"},
		{"lock session timeout above 24h", func(c *Config) { c.LockSessionTimeout = 25 * time.Hour }, "Config.LockSessionTimeout"},
		{"checkpoint interval below 1ms", func(c *Config) { c.CheckpointInterval = time.Nanosecond }, "Config.CheckpointInterval must be 0 or at least 1ms"},
		{"long client name", func(c *Config) { c.ClientName = strings.Repeat("é", MaxClientNameLen+1) }, "Config.ClientName: 256 characters, longer than the column's 255"},
		{"client name with NUL", func(c *Config) { c.ClientName = "a\x00b" }, "Config.ClientName: contains a NUL byte"},
		{"client name not UTF-8", func(c *Config) { c.ClientName = "a\xffb" }, "Config.ClientName: not valid UTF-8"},
		{"long table name", func(c *Config) { c.TableName = strings.Repeat("t", MaxTableNameLen+1) }, "Config.TableName: 101 characters"},
		{"processed flag both on and off", func(c *Config) { c.ProcessedFlag, c.DisableProcessedFlag = true, true },
			"Config.ProcessedFlag and Config.DisableProcessedFlag contradict each other"},
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
	require.Contains(t, w.q.Read, `FROM "audit"."Changes"`)
	require.Contains(t, w.q.SaveToken, `INSERT INTO "tokens"`)
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

func TestNewAcceptsTheLimits(t *testing.T) {
	db, _ := mockDB(t)
	w, err := New(Config{DB: db, ClientName: strings.Repeat("é", MaxClientNameLen), TableName: strings.Repeat("t", MaxTableNameLen),
		Mode: ModePolling, BatchSize: MaxBatchSize, BufferSize: MaxBufferSize, MaxPending: MaxMaxPending,
		PollInterval: MinInterval, FallbackPollInterval: MinInterval, IdleCheckpointInterval: MinInterval,
		CheckpointRefreshInterval: MinInterval, CheckpointInterval: MinInterval, LockSessionTimeout: MinLockSessionTimeout,
		Logger: quietLogger})
	require.NoError(t, err)
	require.Equal(t, MaxMaxPending, w.ring.Cap())
	require.Equal(t, MaxBufferSize, cap(w.events))
	require.Equal(t, MaxBatchSize+1, cap(w.batch), "a delta's first page reads one row more than a batch")
}

// FuzzNew checks that no configuration makes New panic, and that an accepted one stays within
// the limits it allocates by.
func FuzzNew(f *testing.F) {
	db, _, err := sqlmock.New()
	require.NoError(f, err)
	f.Cleanup(func() { db.Close() })
	f.Add("c", "t", "", "", "", "", "", "", 0, 0, 0, int64(0), int64(0), int64(0), int64(0), false)
	f.Add("c", "health_events", "hybrid", "postgres://u@localhost:5432/db", "audit.log", "tok", "ch", "document",
		100, 100, 4096, int64(time.Millisecond), int64(time.Second), int64(time.Second), int64(time.Second), true)
	f.Add("c", "t", "notify", "host=/tmp port=x", "a.b.c", "", "a.b", "", -1, 1<<40, 1<<21, int64(-1), int64(1), int64(0), int64(-5), false)
	f.Fuzz(func(t *testing.T, client, table, mode, conn, changelog, tokens, channel, field string,
		batch, buffer, pending int, poll, fallback, idle, checkpoint int64, withDB bool) {
		cfg := Config{ClientName: client, TableName: table, Mode: Mode(mode), ConnString: conn,
			ChangelogTable: changelog, TokenTable: tokens, NotifyChannel: channel, DocumentField: field,
			BatchSize: batch, BufferSize: buffer, MaxPending: pending,
			PollInterval: time.Duration(poll), FallbackPollInterval: time.Duration(fallback),
			IdleCheckpointInterval: time.Duration(idle), CheckpointInterval: time.Duration(checkpoint),
			Logger: quietLogger}
		if withDB {
			cfg.DB = db
		}
		w, err := New(cfg)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.Nil(t, w)
			return
		}
		require.LessOrEqual(t, w.ring.Cap(), MaxMaxPending)
		require.LessOrEqual(t, cap(w.events), MaxBufferSize)
		require.LessOrEqual(t, cap(w.batch)+cap(w.spare), 2*MaxBatchSize)
		require.GreaterOrEqual(t, w.cfg.PollInterval, MinInterval)
		require.NoError(t, w.Close(t.Context()))
	})
}

// WithDefaults fills what New fills and keeps what is set: the test kit's Mock.Config relies on
// it to hand out the configuration a watcher runs with.
func TestConfigWithDefaultsFillsWhatNewFills(t *testing.T) {
	c := Config{ClientName: "c", TableName: "t", BatchSize: 7}.WithDefaults()
	require.Equal(t, DefaultMode, c.Mode)
	require.Equal(t, DefaultChangelogTable, c.ChangelogTable)
	require.Equal(t, DefaultTokenTable, c.TokenTable)
	require.Equal(t, DefaultPollInterval, c.PollInterval)
	require.Equal(t, 7, c.BatchSize, "a set field is kept")
	require.NotNil(t, c.Logger)
	db, _ := mockDB(t)
	w, err := New(Config{DB: db, ClientName: "c", TableName: "t", BatchSize: 7})
	require.NoError(t, err)
	require.Equal(t, c.Mode, w.cfg.Mode)
	require.Equal(t, c.PollInterval, w.cfg.PollInterval)
	require.Equal(t, c.NotifyChannel, w.cfg.NotifyChannel)
}
