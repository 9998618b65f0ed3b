package changelog

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStatementsQuoteTheirTablesOnce(t *testing.T) {
	s := NewStatements(StatementParams{ChangelogTable: "audit.changes", TokenTable: "tokens", BatchSize: 50})
	require.Contains(t, s.Read, `FROM "audit"."changes"`)
	require.True(t, strings.HasSuffix(s.Read, "LIMIT 50"))
	require.Contains(t, s.DeltaRange, "LIMIT 51")
	require.Contains(t, s.LoadToken, `"tokens"`)
	require.Equal(t, `SELECT count(*) FROM "audit"."changes" WHERE table_name = $1 AND id > $2`, s.Unprocessed)
	require.False(t, s.Unit)
	require.Empty(t, s.DeltaSpan)

	flagged := NewStatements(StatementParams{ChangelogTable: "audit.changes", TokenTable: "tokens", BatchSize: 50, MarksProcessed: true})
	require.Contains(t, flagged.Unprocessed, "processed = FALSE")
}

func TestAckIndexCoversTheFourSaves(t *testing.T) {
	seen := map[int]bool{}
	for _, fenced := range []bool{false, true} {
		for _, inc := range []string{"", "(inc)"} {
			i := AckIndex(fenced, inc)
			f, w := ackIndexParts(i)
			require.Equal(t, fenced, f)
			require.Equal(t, inc != "", w)
			seen[i] = true
		}
	}
	require.Len(t, seen, 4)
	s := NewStatements(StatementParams{ChangelogTable: "c", TokenTable: "t", BatchSize: 1})
	require.Contains(t, s.AckSave[AckIndex(true, "x")], FenceCondition)
	require.NotContains(t, s.AckTx[AckIndex(false, "")], "NOWAIT")
}

func TestSharedReadsAddTheUnitCondition(t *testing.T) {
	r := NewReads(`"c"`, "10", "11", &UnitReads{Cond: " AND u BETWEEN 0 AND 3", Expr: "u"})
	require.True(t, r.Unit)
	require.Contains(t, r.DeltaRange, " AND u BETWEEN 0 AND 3")
	require.Contains(t, r.DeltaSpan, " AND u BETWEEN 0 AND 3")
}
