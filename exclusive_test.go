package pgchangestream

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLockHalves(t *testing.T) {
	c, o := lockHalves(-1)
	require.Equal(t, [2]int64{0xffffffff, 0xffffffff}, [2]int64{c, o}, "pg_locks shows both halves unsigned")
	c, o = lockHalves(0x0000000100000002)
	require.Equal(t, [2]int64{1, 2}, [2]int64{c, o})
}

func TestKeepalivesEndAVanishedSessionWithinTheBound(t *testing.T) {
	for _, d := range []time.Duration{MinLockSessionTimeout, 4500 * time.Millisecond, 5 * time.Second,
		DefaultLockSessionTimeout, 61 * time.Second, MaxLockSessionTimeout} {
		idle, interval := keepalives(d)
		total := time.Duration(idle+keepaliveProbes*interval) * time.Second
		require.LessOrEqual(t, total, d, "%v: idle %ds, interval %ds", d, idle, interval)
		require.Greater(t, total, d-2*time.Second*keepaliveProbes, "%v: the bound is used", d)
		require.Positive(t, idle)
		require.Positive(t, interval)
	}
	idle, interval := keepalives(DefaultLockSessionTimeout)
	require.Equal(t, [2]int{15, 5}, [2]int{idle, interval})
}
