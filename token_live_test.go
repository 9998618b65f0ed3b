package pgchangestream

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A corrupt saved token is refused where it is loaded: the watcher delivers nothing (it does not
// skip the committed rows after it), and Health and Stats().LastError name the client, the token
// and what is wrong with it, in both schema states.
func TestLiveCorruptTokenIsRefused(t *testing.T) {
	inEachSchemaState(t, func(t *testing.T, e *liveEnv) {
		e.insert(5)
		ts := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339Nano)
		for client, tc := range map[string]struct{ token, why string }{
			"zero-snapshot": {fmt.Sprintf(`{"timestamp": %q, "eventID": 0, "snapshot": "0:0:"}`, ts), "xmin 0 is below 3"},
			"negative-id":   {fmt.Sprintf(`{"timestamp": %q, "eventID": -3}`, ts), "eventID: -3 is negative"},
		} {
			_, err := e.db.Exec(`INSERT INTO resume_tokens (client_name, resume_token) VALUES ($1, $2::jsonb)`, client, tc.token)
			require.NoError(t, err)
			var stored string // the token as jsonb writes it back
			require.NoError(t, e.db.QueryRow(`SELECT resume_token::text FROM resume_tokens WHERE client_name = $1`, client).Scan(&stored))
			cfg := e.config(ModeHybrid)
			cfg.ClientName = client
			w := e.start(cfg)
			require.Eventually(t, func() bool { return w.Health() != nil }, liveWait, 10*time.Millisecond, "client %s", client)
			msg := w.Health().Error()
			for _, part := range []string{fmt.Sprintf("client %q", client), fmt.Sprintf("%q", stored), tc.why} {
				require.True(t, strings.Contains(msg, part), "Health %q lacks %q", msg, part)
			}
			require.ErrorContains(t, w.Stats().LastError, tc.why)
			requireNothingWithin(t, w, liveQuiet)
		}
	})
}
