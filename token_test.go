package pgchangestream

import (
	"testing"

	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

func mustSnapshot(t testing.TB, s string) position.Snapshot {
	t.Helper()
	snap, err := position.ParseSnapshot(s)
	require.NoError(t, err)
	return snap
}

// Moving on to the next delta moves only snapshots: nothing to save.
func TestNextDeltaIsUnchanged(t *testing.T) {
	base, end := mustSnapshot(t, "100:105:100"), mustSnapshot(t, "106:120:")
	b := Position{ID: 5, Xid: 100, InRows: true, Span: &position.Span{Seq: 1, Base: base, End: end, HasEnd: true}}
	require.True(t, unchanged(b.NextDelta(end), Position{ID: 5, Span: &position.Span{Seq: 9, Base: end}}),
		"only snapshots moved on: nothing to save")
}
