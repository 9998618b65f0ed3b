package pgchangestream

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/admin"
	"github.com/stretchr/testify/require"
)

// consume starts a polling watcher of client from the beginning, receives the rows ids,
// acknowledges the first acked of them and closes it.
func (e *liveEnv) consume(client string, ids []int64, acked int) {
	e.t.Helper()
	cfg := e.fromBeginning(ModePolling)
	cfg.ClientName = client
	w, err := New(cfg)
	require.NoError(e.t, err)
	w.Start(context.Background())
	require.Equal(e.t, ids, receiveWithin(e.t, w, len(ids), liveWait))
	if acked > 0 {
		require.NoError(e.t, w.MarkProcessed(context.Background(), tok(ids[acked-1])))
	}
	require.NoError(e.t, w.Close(context.Background()))
}

// holdersOf returns the client and row count of each holder.
func holdersOf(res admin.PruneResult) [][2]any {
	var out [][2]any
	for _, h := range res.Holders {
		out = append(out, [2]any{h.Client, h.Rows})
	}
	return out
}

// requireResumes requires client's next watcher to deliver exactly want.
func (e *liveEnv) requireResumes(client string, want []int64) {
	e.t.Helper()
	cfg := e.config(ModePolling)
	cfg.ClientName = client
	w := e.start(cfg)
	require.Equal(e.t, want, receiveWithin(e.t, w, len(want), liveWait), "client %s", client)
	requireNothingWithin(e.t, w, liveQuiet)
	require.NoError(e.t, w.Close(context.Background()))
}

func TestLivePruneKeepsEveryRowAClientHasNotPassed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLive(t)
	ids := e.insert(8)
	e.consume("ahead", ids, 6)
	e.consume("behind", ids, 3)

	res, err := admin.Prune(ctx, e.db, admin.PruneOptions{DryRun: true})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Deleted)
	require.Equal(t, []string{"ahead", "behind"}, res.Clients)
	require.Equal(t, [][2]any{{"behind", int64(5)}, {"ahead", int64(2)}}, holdersOf(res), "the rows each has not passed")
	require.Equal(t, ids, e.idsInOrder(), "a dry run deletes nothing")

	res, err = admin.Prune(ctx, e.db, admin.PruneOptions{OlderThan: time.Hour})
	require.NoError(t, err)
	require.Zero(t, res.Deleted, "rows younger than OlderThan are kept")

	var progress []int64
	res, err = admin.Prune(ctx, e.db, admin.PruneOptions{BatchSize: 2, Progress: func(n int64) { progress = append(progress, n) }})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Deleted)
	require.Equal(t, []int64{2, 3}, progress)
	require.Equal(t, ids[3:], e.idsInOrder(), "only the rows both clients passed")
	e.requireResumes("ahead", ids[6:])
	e.requireResumes("behind", ids[3:])

	res, err = admin.Prune(ctx, e.db, admin.PruneOptions{IgnoreClients: []string{"behind"}})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Deleted, "an ignored client holds nothing back")
	e.requireResumes("ahead", ids[6:])

	// A token whose row is gone replays everything: it holds every row back.
	_, err = e.db.Exec(`INSERT INTO resume_tokens (client_name, resume_token) VALUES ('replaying', '{"eventID": 1}')`)
	require.NoError(t, err)
	res, err = admin.Prune(ctx, e.db, admin.PruneOptions{IgnoreClients: []string{"behind"}})
	require.NoError(t, err)
	require.Equal(t, admin.PruneResult{Clients: []string{"ahead"}, Unresolved: []string{"replaying"}}, res)
	require.Equal(t, ids[6:], e.idsInOrder())
}

func TestLiveTokenAdminRefusesWhileAWatcherRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLive(t)
	ids := e.insert(4)
	cfg := e.fromBeginning(ModePolling)
	cfg.Exclusive = true
	w := e.start(cfg)
	require.Equal(t, ids, receiveWithin(t, w, 4, takeoverWait))
	require.NoError(t, w.MarkProcessed(ctx, tok(ids[3])))

	pos, err := admin.ResetToken(ctx, e.db, "c", admin.ResetTarget{AfterID: ids[1], DryRun: true}, admin.Options{})
	require.NoError(t, err)
	require.Equal(t, e.position(ids[1]), pos)
	require.ErrorIs(t, resetTo(ctx, e.db, "c", pos, ""), ErrClientActive)
	_, err = admin.DeleteToken(ctx, e.db, "c", admin.Options{})
	require.ErrorIs(t, err, ErrClientActive)
	require.NoError(t, w.Close(ctx))

	require.NoError(t, resetTo(ctx, e.db, "c", pos, ""))
	e.requireResumes("c", ids[2:])

	at, err := admin.ResetToken(ctx, e.db, "c", admin.ResetTarget{Time: e.position(ids[3]).ChangedAt, DryRun: true}, admin.Options{})
	require.NoError(t, err)
	require.NoError(t, resetTo(ctx, e.db, "c", at, ""))
	e.requireResumes("c", ids[3:])

	newest, err := admin.ResetToken(ctx, e.db, "c", admin.ResetTarget{Newest: true, Table: liveTable, DryRun: true}, admin.Options{})
	require.NoError(t, err)
	require.Equal(t, e.position(ids[3]), newest)
	beginning, err := admin.ResetToken(ctx, e.db, "c", admin.ResetTarget{Beginning: true, DryRun: true}, admin.Options{})
	require.NoError(t, err)
	require.NoError(t, resetTo(ctx, e.db, "c", beginning, ""))
	e.requireResumes("c", ids)

	existed, err := admin.DeleteToken(ctx, e.db, "c", admin.Options{})
	require.NoError(t, err)
	require.True(t, existed)
	tokens, err := admin.ListTokens(ctx, e.db, admin.Options{})
	require.NoError(t, err)
	require.Empty(t, tokens)
}

// resetTo saves pos as client's token for table ("": the table of its current token), as
// admin.ResetToken does for a Position target.
func resetTo(ctx context.Context, db *sql.DB, client string, pos Position, table string) error {
	_, err := admin.ResetToken(ctx, db, client, admin.ResetTarget{Position: &pos, Table: table}, admin.Options{})
	return err
}
