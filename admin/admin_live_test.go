package admin_test

import (
	"context"
	"database/sql"
	"os"
	"testing"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/admin"
	"github.com/pgchangestream/pgchangestream/internal/lock"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/pgchangestream/pgchangestream/schema"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { os.Exit(pgtest.RunMain(m)) }

// changelogIDs installs the schema, captures table items, inserts n rows into it and returns
// their changelog ids, ascending.
func changelogIDs(t *testing.T, db *sql.DB, n int) []int64 {
	t.Helper()
	ctx := context.Background()
	_, err := schema.Install(ctx, db, schema.Options{})
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE items (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), n int)`)
	require.NoError(t, err)
	_, err = schema.Capture(ctx, db, "items", schema.Options{})
	require.NoError(t, err)
	for i := range n {
		_, err := db.Exec(`INSERT INTO items (n) VALUES ($1)`, i)
		require.NoError(t, err)
	}
	rows, err := db.Query(`SELECT id FROM datastore_changelog ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	require.Len(t, ids, n)
	return ids
}

// One client's life through the admin calls on a real database: a reset after a row records
// the client's table, its backlog counts the rows after it, Prune deletes the rows it passed
// and names it as holding the others back, a reset refuses while the client's lock is held,
// and DeleteToken removes the token.
func TestLiveAdminTokenLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := pgtest.NewDatabase(t, "")
	ids := changelogIDs(t, db, 3)

	pos, err := admin.ResetToken(ctx, db, "c", admin.ResetTarget{AfterID: ids[1], Table: "items"}, admin.Options{})
	require.NoError(t, err)
	require.Equal(t, ids[1], pos.ID)
	tokens, err := admin.ListTokens(ctx, db, admin.Options{})
	require.NoError(t, err)
	require.Len(t, tokens, 1)
	require.Equal(t, "c", tokens[0].Client)
	require.JSONEq(t, pos.Token("items"), tokens[0].Token, "the token Position.Token gives is the one saved")

	b, err := admin.Backlog(ctx, db, tokens[0].Token, "items", admin.Options{})
	require.NoError(t, err)
	require.Equal(t, int64(1), b.Rows, "the row after the reset")
	require.Equal(t, "items", b.Table)

	res, err := admin.Prune(ctx, db, admin.PruneOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Deleted, "the rows up to the reset")
	require.Equal(t, []string{"c"}, res.Clients)
	require.Len(t, res.Holders, 1)
	require.Equal(t, admin.PruneHolder{Client: "c", Table: "items", Rows: 1, SavedAt: res.Holders[0].SavedAt, Age: res.Holders[0].Age},
		res.Holders[0])

	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	got, err := lock.TryLock(ctx, conn, lock.Key("resume_tokens", "c"))
	require.NoError(t, err)
	require.True(t, got)
	_, err = admin.ResetToken(ctx, db, "c", admin.ResetTarget{Beginning: true}, admin.Options{})
	require.ErrorIs(t, err, pgchangestream.ErrClientActive, "a watcher of the client holds its lock")
	_, err = admin.DeleteToken(ctx, db, "c", admin.Options{})
	require.ErrorIs(t, err, pgchangestream.ErrClientActive)
	dry, err := admin.ResetToken(ctx, db, "c", admin.ResetTarget{Beginning: true, DryRun: true}, admin.Options{})
	require.NoError(t, err, "a dry run takes no lock")
	require.Zero(t, dry)
	lock.Release(conn)

	existed, err := admin.DeleteToken(ctx, db, "c", admin.Options{})
	require.NoError(t, err)
	require.True(t, existed)
	tokens, err = admin.ListTokens(ctx, db, admin.Options{})
	require.NoError(t, err)
	require.Empty(t, tokens)
}
