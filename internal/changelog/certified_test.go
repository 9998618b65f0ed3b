package changelog

import (
	"strconv"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// predicate returns the certification predicate of a saved token and its parameters.
func predicate(t *testing.T, raw string) (string, []any) {
	t.Helper()
	pos, err := position.DecodeToken([]byte(raw))
	require.NoError(t, err)
	var args []any
	p := CertifiedBy(pos, func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	})
	return p, args
}

func TestPrunePredicateOfEveryTokenForm(t *testing.T) {
	ts := `"2026-01-02T03:04:05.123456Z"`
	pos := position.Make(time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC), 42)
	for _, tc := range []struct {
		name, token, want string
		args              []any
	}{
		{"legacy", `{"timestamp":` + ts + `,"eventID":42}`,
			`(c.changed_at, c.id) <= ($1::timestamptz, $2::bigint)`, []any{pos.ChangedAt, int64(42)}},
		{"snapshot", `{"timestamp":` + ts + `,"eventID":42,"snapshot":"10:20:12,15"}`,
			`(c.txid IS NULL OR pg_visible_in_snapshot(c.txid, $1::pg_snapshot))`, []any{"10:20:12,15"}},
		{"snapshot with delta", `{"timestamp":` + ts + `,"eventID":77,"snapshot":"10:20:12","deltaEnd":"18:25:","deltaAfterID":77}`,
			`(c.txid IS NULL OR pg_visible_in_snapshot(c.txid, $1::pg_snapshot) OR (pg_visible_in_snapshot(c.txid, $2::pg_snapshot) ` +
				`AND c.id <= $3::bigint))`, []any{"10:20:12", "18:25:", int64(77)}},
		// An earlier release's position inside a delta, in (txid, id) order, certifies only
		// what the start of its delta does.
		{"earlier release's delta", `{"timestamp":` + ts + `,"eventID":77,"snapshot":"10:20:12","deltaEnd":"18:25:","deltaXid":"12","deltaID":77}`,
			`(c.txid IS NULL OR pg_visible_in_snapshot(c.txid, $1::pg_snapshot))`, []any{"10:20:12"}},
		{"switchover", `{"timestamp":` + ts + `,"eventID":42,"switchover":"30:31:"}`,
			`((c.changed_at, c.id) <= ($1::timestamptz, $2::bigint) AND (c.txid IS NULL OR pg_visible_in_snapshot(c.txid, $3::pg_snapshot)))`,
			[]any{pos.ChangedAt, int64(42), "30:31:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, args := predicate(t, tc.token)
			require.Equal(t, tc.want, p)
			require.Equal(t, tc.args, args)
		})
	}
}
