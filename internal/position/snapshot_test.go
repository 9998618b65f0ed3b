package position

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseSnapshot(t *testing.T) {
	s, err := ParseSnapshot("100:110:107,101,104")
	require.NoError(t, err)
	require.Equal(t, Snapshot{Xmin: 100, Xmax: 110, Xip: []uint64{101, 104, 107}}, s)
	require.Equal(t, "100:110:101,104,107", s.String())
	require.True(t, s.Running(104))
	require.True(t, s.Running(110), "xmax and above are running")
	require.False(t, s.Running(103))
	require.False(t, s.Running(99))

	s, err = ParseSnapshot("3:3:")
	require.NoError(t, err)
	require.True(t, s.Equal(EmptySnapshot))

	for _, bad := range []string{"", "1:2", "a:2:", "5:4:", "1:5:7", "1:5:0", "1:5:x", "1:2:3:4"} {
		_, err := ParseSnapshot(bad)
		require.Error(t, err, bad)
	}
}

func TestDeltaRanges(t *testing.T) {
	b := Snapshot{Xmin: 100, Xmax: 110, Xip: []uint64{100, 104, 107}}
	e := Snapshot{Xmin: 107, Xmax: 120, Xip: []uint64{107, 115}}
	require.Equal(t, []uint64{100, 104}, FinishedBy(b, e))
	require.Equal(t, []KeyRange{
		{Lo: 100, LoID: MinID, Hi: 100, HiID: MaxID},
		{Lo: 104, LoID: MinID, Hi: 104, HiID: MaxID},
		{Lo: 109, LoID: MaxID, Hi: 119, HiID: MaxID},
	}, DeltaRanges(b, e))
	require.Equal(t, []KeyRange{{Lo: 100, LoID: MinID, Hi: 100, HiID: MaxID}},
		DeltaRanges(b, Snapshot{Xmin: 104, Xmax: 110, Xip: []uint64{104, 107}}), "xmax did not move: no range part")
	require.True(t, EmptyDelta(b, Snapshot{Xmin: 100, Xmax: 110, Xip: []uint64{100, 104, 107}}))
	require.False(t, EmptyDelta(b, Snapshot{Xmin: 100, Xmax: 110, Xip: []uint64{100, 107}}))
}

// The intersection sees as finished exactly what both see as finished.
func TestIntersectSnapshots(t *testing.T) {
	a, b := mustSnapshot(t, "100:110:100,104"), mustSnapshot(t, "98:108:98,105")
	got := Intersect(a, b)
	require.Equal(t, "98:108:98,100,104,105", got.String())
	for x := uint64(90); x < 115; x++ {
		require.Equal(t, !a.Running(x) && !b.Running(x), !got.Running(x), "xid %d", x)
	}
	require.True(t, got.Within(a) && got.Within(b))
}

func TestSnapshotWithin(t *testing.T) {
	for _, c := range []struct {
		s, t string
		want bool
	}{
		{"100:110:100,104", "100:110:100,104", true},
		{"100:110:100,104", "104:120:104", true},      // 100 finished since: still within
		{"100:110:100,104", "100:120:100,105", false}, // t still runs 105, which s saw finish
		{"100:110:100,104", "100:108:", false},        // t does not see 108 and 109
		{"100:110:100,108,109", "100:108:", true},     // s does not see them either
		{"100:100:", "100:100:", true},
	} {
		require.Equal(t, c.want, mustSnapshot(t, c.s).Within(mustSnapshot(t, c.t)), "%s within %s", c.s, c.t)
	}
}
