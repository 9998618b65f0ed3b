package lock

import (
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestKeepalivesEndAVanishedSessionWithinTheBound(t *testing.T) {
	// The watcher's MinLockSessionTimeout, DefaultLockSessionTimeout and MaxLockSessionTimeout
	// among them.
	for _, d := range []time.Duration{4 * time.Second, 4500 * time.Millisecond, 5 * time.Second,
		30 * time.Second, 61 * time.Second, 24 * time.Hour} {
		idle, interval := keepalives(d)
		total := time.Duration(idle+keepaliveProbes*interval) * time.Second
		require.LessOrEqual(t, total, d, "%v: idle %ds, interval %ds", d, idle, interval)
		require.Greater(t, total, d-2*time.Second*keepaliveProbes, "%v: the bound is used", d)
		require.Positive(t, idle)
		require.Positive(t, interval)
	}
	idle, interval := keepalives(30 * time.Second)
	require.Equal(t, [2]int{15, 5}, [2]int{idle, interval})
}

func TestTextValueIsPostgreSQLsTextFormat(t *testing.T) {
	require.Equal(t, sql.NullString{}, textValue(nil))
	require.Equal(t, sql.NullString{String: "t", Valid: true}, textValue(true))
	require.Equal(t, sql.NullString{String: "f", Valid: true}, textValue(false))
	require.Equal(t, sql.NullString{String: "{1,2}", Valid: true}, textValue([]byte("{1,2}")))
	require.Equal(t, sql.NullString{String: "42", Valid: true}, textValue(int64(42)))
}
