package pgchangestream

import (
	"context"
	"database/sql"
	"net/url"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/stretchr/testify/require"
)

// withRole creates a login role with no privileges (dropped at the end of the test) and returns
// its quoted name and a pool on this database as that role, closed at the end of the test.
func (e *liveEnv) withRole(name string) (string, *sql.DB) {
	e.t.Helper()
	var dbName string
	require.NoError(e.t, e.db.QueryRow(`SELECT current_database()`).Scan(&dbName))
	role := name + "_" + dbName
	_, err := e.db.Exec(`CREATE ROLE ` + changelog.Quote(role) + ` LOGIN`)
	require.NoError(e.t, err)
	e.t.Cleanup(func() {
		_, _ = e.db.Exec(`DROP OWNED BY ` + changelog.Quote(role))
		_, _ = e.db.Exec(`DROP ROLE ` + changelog.Quote(role))
	})
	u, err := url.Parse(e.dsn)
	require.NoError(e.t, err)
	u.User = url.User(role)
	db, err := sql.Open("pgx", u.String())
	require.NoError(e.t, err)
	e.t.Cleanup(func() { db.Close() })
	return changelog.Quote(role), db
}

func TestLiveHealthPermissionDenied(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	role, db := e.withRole("reader")
	_, err := e.db.Exec(`GRANT SELECT, INSERT, UPDATE ON resume_tokens TO ` + role)
	require.NoError(t, err)
	cfg := e.config(ModePolling)
	cfg.DB, cfg.StartFromBeginning = db, true
	w := e.start(cfg)
	require.Eventually(t, func() bool { return w.Stats().ReadErrors > 0 }, liveWait, 10*time.Millisecond)
	time.Sleep(2 * time.Second)
	err = w.Health()
	require.ErrorContains(t, err, "read changelog: ")
	require.ErrorContains(t, err, "permission denied for table datastore_changelog")
	require.Regexp(t, `\(failing for [23]s\)$`, err.Error())
	require.ErrorContains(t, w.Stats().LastError, "permission denied")

	_, err = e.db.Exec(`GRANT SELECT, UPDATE ON datastore_changelog TO ` + role)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return w.Health() == nil }, liveWait, 10*time.Millisecond,
		"the failure clears once granted")
	ids := e.insert(1)
	require.Equal(t, ids, receiveWithin(t, w, 1, liveWait))
}

func TestLiveHealthNamesAMistypedTable(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{ChangelogTable: "datastore_changelgo"}, `find newest position in datastore_changelgo: `},
		{Config{TokenTable: "resume_tokenz"}, `read token table resume_tokenz: `},
		{Config{ChangelogTable: "datastore_changelgo", StartFromBeginning: true}, `read changelog: `},
	} {
		cfg := e.config(ModePolling)
		cfg.ChangelogTable, cfg.TokenTable, cfg.StartFromBeginning = tc.cfg.ChangelogTable, tc.cfg.TokenTable, tc.cfg.StartFromBeginning
		w := e.start(cfg)
		require.Eventually(t, func() bool { return w.Health() != nil }, liveWait, 10*time.Millisecond)
		require.ErrorContains(t, w.Health(), tc.want)
		require.ErrorContains(t, w.Health(), `does not exist`)
		require.NoError(t, w.Close(context.Background()))
	}
}

// TestLiveHealthFailingSaves proves that background saves failing on the token table's grants
// are a Health failure, and Stats().LastError, until the grant comes back.
func TestLiveHealthFailingSaves(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	role, db := e.withRole("saver")
	_, err := e.db.Exec(`GRANT SELECT, UPDATE ON datastore_changelog TO ` + role + `;
		GRANT SELECT, INSERT, UPDATE ON resume_tokens TO ` + role)
	require.NoError(t, err)
	cfg := e.config(ModePolling)
	cfg.DB, cfg.CheckpointInterval = db, 50*time.Millisecond
	w := e.start(cfg)
	waitStartSaved(t, w)
	_, err = e.db.Exec(`REVOKE INSERT, UPDATE ON resume_tokens FROM ` + role)
	require.NoError(t, err)
	ids := e.insert(2)
	require.Equal(t, ids, receiveWithin(t, w, 2, liveWait))
	// With a batched CheckpointInterval, MarkProcessed acknowledges in memory and returns, once,
	// a background save failure: one may already have failed on the revoked grant (a save of the
	// newer snapshot the reads moved the cursor to).
	if err := w.MarkProcessed(context.Background(), tok(ids[1])); err != nil {
		require.ErrorContains(t, err, "permission denied for table resume_tokens")
	}
	require.Eventually(t, func() bool { return w.Health() != nil }, liveWait, 10*time.Millisecond)
	require.ErrorContains(t, w.Health(), "save checkpoint")
	require.ErrorContains(t, w.Health(), "to token table resume_tokens: ")
	require.ErrorContains(t, w.Health(), "permission denied for table resume_tokens")
	require.ErrorContains(t, w.Stats().LastError, "permission denied for table resume_tokens")

	_, err = e.db.Exec(`GRANT INSERT, UPDATE ON resume_tokens TO ` + role)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return w.Health() == nil }, liveWait, 10*time.Millisecond,
		"the failure clears with the next save")
	require.Equal(t, e.position(ids[1]), legacyView(e.savedToken("c")))
}
