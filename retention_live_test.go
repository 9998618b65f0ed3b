package pgchangestream

import (
	"context"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/admin"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/schema"
	"github.com/stretchr/testify/require"
)

// captureQuiet creates the captured table "quiet", which the test never writes.
func (e *liveEnv) captureQuiet() {
	e.t.Helper()
	_, err := e.db.Exec(`CREATE TABLE quiet (id uuid PRIMARY KEY DEFAULT gen_random_uuid())`)
	require.NoError(e.t, err)
	require.NoError(e.t, errOf(schema.Capture(context.Background(), e.db, "quiet", schema.Options{})))
}

// uncertified counts the rows of table that client's saved token does not certify.
func (e *liveEnv) uncertified(client, table string) int64 {
	e.t.Helper()
	var raw string
	require.NoError(e.t, e.db.QueryRow(`SELECT resume_token::text FROM resume_tokens WHERE client_name = $1`, client).Scan(&raw))
	p, err := position.DecodeToken([]byte(raw))
	require.NoError(e.t, err)
	args := changelog.Params{table}
	var n int64
	require.NoError(e.t, e.db.QueryRow(`SELECT count(*) FROM datastore_changelog c WHERE c.table_name = $1 AND NOT `+
		changelog.CertifiedBy(p, args.Add), args...).Scan(&n))
	return n
}

// A watcher caught up on a table without writes saves the newer snapshot its reads moved on
// to, so its token certifies what other transactions wrote meanwhile, and admin.Prune deletes the
// rows that the client of their table acknowledged.
func TestLiveQuietClientDoesNotHoldPruneBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLive(t)
	e.captureQuiet()
	cfg := e.config(ModePolling)
	cfg.ClientName, cfg.TableName = "quiet-client", "quiet"
	cfg.IdleCheckpointInterval, cfg.CheckpointRefreshInterval = 10*time.Millisecond, 100*time.Millisecond
	quiet := e.start(cfg)
	waitStartSaved(t, quiet)

	ids := e.insertBulk(200)
	e.consume("items-client", ids, len(ids))
	require.Zero(t, e.uncertified("items-client", liveTable))
	waitFor(t, func() bool { return e.uncertified("quiet-client", liveTable) == 0 },
		"the quiet client saves its newer snapshot, which sees the 200 rows")

	res, err := admin.Prune(ctx, e.db, admin.PruneOptions{Table: liveTable})
	require.NoError(t, err)
	require.Equal(t, int64(200), res.Deleted, "%+v", res)
	require.Empty(t, e.idsInOrder())
	require.NoError(t, quiet.Close(ctx))
}

// admin.Prune counts a token for the table it records only, and names the clients that hold rows
// back with the age of their tokens.
func TestLivePruneReasonsPerTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLive(t)
	e.captureQuiet()
	ids := e.insert(6)
	e.consume("items-client", ids, 4)
	// A client of the table quiet, at the beginning: it holds back no row of items.
	require.NoError(t, resetTo(ctx, e.db, "quiet-client", Position{}, "quiet"))
	// A token that records no table (an older watcher's) holds back every table.
	_, err := e.db.Exec(`INSERT INTO resume_tokens (client_name, resume_token, last_updated)
		VALUES ('old-client', $1, now() - interval '3 days')`, string(position.EncodeToken(e.position(ids[1]), "")))
	require.NoError(t, err)

	res, err := admin.Prune(ctx, e.db, admin.PruneOptions{DryRun: true, Table: liveTable})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Deleted, "what both items-client and old-client passed")
	require.Equal(t, []string{"items-client", "old-client"}, res.Clients, "quiet-client is left out")
	require.Len(t, res.Holders, 2)
	old := res.Holders[0]
	require.Equal(t, "old-client", old.Client)
	require.Equal(t, int64(4), old.Rows)
	require.Empty(t, old.Table)
	require.InDelta(t, 72*time.Hour, old.Age, float64(time.Minute))
	require.Equal(t, admin.PruneHolder{Client: "items-client", Table: liveTable, Rows: 2, SavedAt: res.Holders[1].SavedAt,
		Age: res.Holders[1].Age}, res.Holders[1])

	res, err = admin.Prune(ctx, e.db, admin.PruneOptions{IgnoreClients: []string{"old-client"}})
	require.NoError(t, err)
	require.Equal(t, int64(4), res.Deleted, "every table: the quiet client holds back only its own")
	require.Equal(t, ids[4:], e.idsInOrder())
	require.Equal(t, []admin.PruneHolder{{Client: "items-client", Table: liveTable, Rows: 2, SavedAt: res.Holders[0].SavedAt,
		Age: res.Holders[0].Age}}, res.Holders)
	e.requireResumes("items-client", ids[4:])
}
