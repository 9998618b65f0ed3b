package pgchangestream

import (
	"context"
	"testing"

	"github.com/pgchangestream/pgchangestream/admin"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/stretchr/testify/require"
)

// saveRanges writes the rows of client's ranges as its members would have saved them: every
// range at token, but those of behind at their own.
func (e *liveEnv) saveRanges(client, token string, behind map[int]string) {
	e.t.Helper()
	pgtest.Exec(e.t, e.db, `INSERT INTO datastore_changelog_ranges (client_name, range_no, resume_token)
	SELECT $1, g, $2::jsonb FROM generate_series(0, 63) AS g`, client, token)
	for r, tok := range behind {
		pgtest.Exec(e.t, e.db, `UPDATE datastore_changelog_ranges SET resume_token = $3::jsonb WHERE client_name = $1 AND range_no = $2`,
			client, r, tok)
	}
}

// TestLivePruneKeepsWhatSharedRangesHold proves that admin.Prune and the SQL retention function keep
// every row a range of a shared client has not certified, and delete the rows all its ranges
// certified, whatever the client's token-table row says (none, behind every range, or ahead of
// some): the ranges hold a shared client's positions.
func TestLivePruneKeepsWhatSharedRangesHold(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		tokenRow string // "", "behind", "ahead"
	}{{"no token row", ""}, {"token row behind", "behind"}, {"token row ahead", "ahead"}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newLive(t)
			items := e.insert(10)
			e.consumeTable("donor", liveTable, 10, 3, items[9]) // a real snapshot token certifying every row
			var ahead string
			require.NoError(t, e.db.QueryRow(`SELECT resume_token::text FROM resume_tokens WHERE client_name = 'donor'`).Scan(&ahead))
			e.saveRanges("s", ahead, map[int]string{
				7:  e.position(items[3]).Token(liveTable),
				40: e.position(items[6]).Token(liveTable),
			})
			switch tc.tokenRow {
			case "behind":
				e.saveRawToken("s", Position{}.Token(liveTable))
			case "ahead":
				e.saveRawToken("s", ahead)
			}
			all := `SELECT id FROM datastore_changelog ORDER BY id`
			kept := items[4:]

			tx, err := e.db.Begin()
			require.NoError(t, err)
			var n int64
			require.NoError(t, tx.QueryRow(`SELECT datastore_changelog_prune(interval '0', 3, NULL, '{donor}')`).Scan(&n))
			require.Equal(t, kept, e.queryIDs(tx, all), "the function keeps the rows range 7 has not certified, deletes the others")
			require.Equal(t, int64(4), n)
			require.NoError(t, tx.Rollback())

			res, err := admin.Prune(ctx, e.db, admin.PruneOptions{IgnoreClients: []string{"donor"}, BatchSize: 3})
			require.NoError(t, err)
			require.Equal(t, kept, e.queryIDs(e.db, all), "admin.Prune keeps the rows range 7 has not certified, deletes the others")
			require.Equal(t, int64(4), res.Deleted)
			require.Equal(t, []string{"s"}, res.Clients)
			require.Len(t, res.Holders, 1, "one holder per shared client")
			require.Equal(t, "s", res.Holders[0].Client)
			require.Equal(t, int64(len(kept)), res.Holders[0].Rows, "the rows of its range the furthest behind")

			// Once every range passed every row, they all go.
			pgtest.Exec(t, e.db, `UPDATE datastore_changelog_ranges SET resume_token = $1::jsonb WHERE client_name = 's'`, ahead)
			res, err = admin.Prune(ctx, e.db, admin.PruneOptions{IgnoreClients: []string{"donor"}})
			require.NoError(t, err)
			require.Empty(t, e.queryIDs(e.db, all))
			require.Equal(t, int64(len(kept)), res.Deleted)
		})
	}
}

// TestLivePruneRefusesAnUnreadableRangeToken proves that a range token that cannot be read
// stops admin.Prune and the SQL retention function, naming the client and the range, and deletes
// nothing.
func TestLivePruneRefusesAnUnreadableRangeToken(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	items := e.insert(3)
	e.saveRanges("s", e.position(items[2]).Token(liveTable), map[int]string{5: `{"eventID": "x", "timestamp": "2025-01-02T03:04:05Z"}`})
	all := `SELECT id FROM datastore_changelog ORDER BY id`
	_, err := e.db.Exec(`SELECT datastore_changelog_prune()`)
	require.ErrorContains(t, err, "client s range 5")
	_, err = admin.Prune(context.Background(), e.db, admin.PruneOptions{})
	require.ErrorIs(t, err, ErrInvalidSavedToken)
	require.ErrorContains(t, err, "client s range 5")
	require.Equal(t, items, e.queryIDs(e.db, all))
}
