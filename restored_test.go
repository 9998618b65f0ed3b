package pgchangestream

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLiveRestoredDatabaseRefused proves the restored-database edge of skip-free reads: after a
// logical restore the server's transaction counter is below the stored transaction ids. When a
// stored row's transaction id, or the saved token's snapshot, is ahead of the counter, Start
// delivers nothing: Events closes and Err returns an error wrapping ErrRestoredDatabase that says
// which id is ahead and where the fix is described.
func TestLiveRestoredDatabaseRefused(t *testing.T) {
	runModes(t, liveModes, newLive, func(t *testing.T, e *liveEnv, mode Mode) {
		ids := e.insert(3)
		for _, tc := range []struct{ client, setup string }{
			{"stored-txid", fmt.Sprintf(`UPDATE datastore_changelog SET txid = '9999999999' WHERE id = %d`, ids[1])},
			{"token-snapshot", fmt.Sprintf(`INSERT INTO resume_tokens (client_name, resume_token) VALUES ('token-snapshot',
				jsonb_build_object('timestamp', (SELECT changed_at FROM datastore_changelog WHERE id = %d),
					'eventID', %d, 'snapshot', '9999999990:9999999999:'))`, ids[0], ids[0])},
		} {
			_, err := e.db.Exec(tc.setup)
			require.NoError(t, err, tc.client)
			cfg := e.fromBeginning(mode)
			cfg.ClientName = tc.client
			w := e.start(cfg)
			requireClosed(t, w)
			err = w.Err()
			require.ErrorIs(t, err, ErrRestoredDatabase, tc.client)
			require.Greater(t, len(err.Error()), len(ErrRestoredDatabase.Error()), "%s: the error says which id is ahead: %v", tc.client, err)
			require.ErrorContains(t, err, `"Restoring a database"`, "%s: the error names the fix", tc.client)
			require.Zero(t, w.Stats().Delivered, tc.client)
			_, err = e.db.Exec(`UPDATE datastore_changelog SET txid = NULL WHERE txid = '9999999999'`)
			require.NoError(t, err)
		}
	})
}
