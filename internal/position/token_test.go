package position

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDeltaTokenRoundTrip(t *testing.T) {
	ts := time.Date(2025, 5, 6, 7, 8, 9, 123456000, time.UTC)
	base, end := mustSnapshot(t, "100:105:100,103"), mustSnapshot(t, "103:120:103,110")
	for _, tc := range []struct {
		name string
		pos  Position
		json string
	}{
		{"switch-over", Position{ChangedAt: ts, ID: 7, Span: &Span{Base: base}},
			`{"timestamp":"2025-05-06T07:08:09.123456Z","eventID":7,"switchover":"100:105:100,103"}`},
		{"delta start", Position{ChangedAt: ts, ID: 7, Span: &Span{Seq: 1, Base: base}},
			`{"timestamp":"2025-05-06T07:08:09.123456Z","eventID":7,"snapshot":"100:105:100,103"}`},
		{"inside a delta", Position{ChangedAt: ts, ID: 41, InRows: true, Span: &Span{Seq: 1, Base: base, End: end, HasEnd: true}},
			`{"timestamp":"2025-05-06T07:08:09.123456Z","eventID":41,"snapshot":"100:105:100,103",` +
				`"deltaEnd":"103:120:103,110","deltaAfterID":41}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := EncodeToken(tc.pos, "")
			require.JSONEq(t, tc.json, string(data))
			got, err := DecodeToken(data)
			require.NoError(t, err)
			require.Equal(t, 0, tc.pos.Compare(got))
			require.Equal(t, tc.pos.InRows, got.InRows)
			require.True(t, tc.pos.Span.Base.Equal(got.Span.Base))
			require.Equal(t, tc.pos.Span.HasEnd, got.Span.HasEnd)
			require.True(t, tc.pos.Span.End.Equal(got.Span.End))
		})
	}
}

// A token records its client's table, escaped as JSON; tokens without one still load.
func TestTokenRecordsItsTable(t *testing.T) {
	p := Make(time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC), 7)
	data := EncodeToken(p, `odd "name" é`)
	require.Equal(t, `{"timestamp":"2025-05-06T07:08:09Z","eventID":7,"table":"odd \"name\" é"}`, string(data))
	got, table, err := DecodeTableToken(data)
	require.NoError(t, err)
	require.Equal(t, p, got)
	require.Equal(t, `odd "name" é`, table)
	require.Equal(t, string(data), p.Token(`odd "name" é`), "Token is the saved-token JSON")

	got, table, err = DecodeTableToken([]byte(`{"timestamp":"2025-05-06T07:08:09Z","eventID":7}`))
	require.NoError(t, err)
	require.Equal(t, p, got)
	require.Empty(t, table, "an older token records no table")

	_, table, err = DecodeTableToken([]byte(`{"eventID":4.5,"table":"items"}`))
	require.Error(t, err)
	require.Equal(t, "items", table, "a token that does not load still names its table")
}

func TestDecodeTokenRejectsBadSnapshots(t *testing.T) {
	const ts = `"timestamp":"2025-05-06T07:08:09Z","eventID":7`
	for _, bad := range []string{
		`{"eventID":7,"snapshot":"1:5:"}`,
		`{` + ts + `,"snapshot":"x"}`,
		`{` + ts + `,"switchover":"1:5:","snapshot":"1:5:"}`,
		`{` + ts + `,"deltaEnd":"1:9:"}`,
		`{` + ts + `,"deltaAfterID":7}`,
		`{` + ts + `,"snapshot":"10:20:","deltaAfterID":7}`,
		`{` + ts + `,"snapshot":"10:20:","deltaEnd":"10:30:"}`,
		`{` + ts + `,"snapshot":"10:20:","deltaEnd":"10:15:","deltaAfterID":7}`,
		`{` + ts + `,"snapshot":"10:20:","deltaEnd":"10:30:","deltaAfterID":8}`,
		`{` + ts + `,"snapshot":"10:20:","deltaEnd":"10:30:","deltaAfterID":"x"}`,
		`{` + ts + `,"snapshot":"10:20:","deltaEnd":"10:30:","deltaAfterID":7,"deltaXid":"25","deltaID":7}`,
		`{` + ts + `,"snapshot":"10:20:","deltaEnd":"10:30:","deltaXid":"25"}`,
		`{` + ts + `,"snapshot":"10:20:","deltaEnd":"10:30:","deltaXid":"15","deltaID":1}`,
		`{` + ts + `,"snapshot":"10:20:","deltaEnd":"10:30:25","deltaXid":"25","deltaID":1}`,
		`{` + ts + `,"snapshot":"10:20:","deltaEnd":"10:30:","deltaXid":"x","deltaID":1}`,
	} {
		_, err := DecodeToken([]byte(bad))
		require.Error(t, err, bad)
	}
}

// Every field of a token that PostgreSQL or the watcher cannot have written is refused, with
// the token and what is wrong in the error: a snapshot below the first transaction id (from
// which a read would skip the rows after it), a negative id, data after the object, fields
// that do not go together.
func TestDecodeTokenRefusesCorruptTokens(t *testing.T) {
	const ts = `"timestamp":"2025-05-06T07:08:09Z"`
	for bad, why := range map[string]string{
		`{` + ts + `,"eventID":0,"snapshot":"0:0:"}`:                                                    `xmin 0 is below 3`,
		`{` + ts + `,"eventID":5,"snapshot":"2:10:"}`:                                                   `xmin 2 is below 3`,
		`{` + ts + `,"eventID":5,"switchover":"0:0:"}`:                                                  `xmin 0 is below 3`,
		`{` + ts + `,"eventID":5,"snapshot":"10:20:","deltaEnd":"0:30:","deltaAfterID":5}`:              `xmin 0 is below 3`,
		`{` + ts + `,"eventID":-1}`:                                                                     `eventID: -1 is negative`,
		`{"eventID":-7}`:                                                                                `eventID: -7 is negative`,
		`{` + ts + `,"eventID":-5,"snapshot":"10:20:"}`:                                                 `eventID: -5 is negative`,
		`{` + ts + `,"eventID":5,"snapshot":"10:20:","deltaEnd":"10:30:","deltaXid":"15","deltaID":-1}`: `deltaID: -1 is negative`,
		`{` + ts + `,"eventID":5} {}`:                                                                   `has data after its JSON object`,
		`{` + ts + `,"eventID":5}x`:                                                                     `has data after its JSON object`,
		`{` + ts + `,"eventID":5,"switchover":"10:20:","deltaAfterID":5}`:                               `switchover goes with no snapshot`,
		`{` + ts + `,"eventID":5,"switchover":"10:20:","deltaXid":"12"}`:                                `switchover goes with no snapshot`,
		`{"timestamp":"yesterday","eventID":5}`:                                                         `timestamp`,
		`{` + ts + `,"eventID":1.5}`:                                                                    `eventID: not an integer`,
		`{` + ts + `,"eventID":1e30}`:                                                                   `eventID: not an integer`,
	} {
		_, err := DecodeToken([]byte(bad))
		require.ErrorContains(t, err, why, bad)
		require.ErrorContains(t, err, fmt.Sprintf("%q", bad), "the error quotes the token")
	}
	for _, good := range []string{
		`{"timestamp":"0001-01-01T00:00:00Z","eventID":0,"snapshot":"3:3:"}`,       // a new client of an empty table
		`{"timestamp":"0001-01-01T00:00:00Z","eventID":0,"switchover":"700:700:"}`, // from the beginning
		`{` + ts + `,"eventID":5} `,
	} {
		_, err := DecodeToken([]byte(good))
		require.NoError(t, err, good)
	}
}

// A token DecodeToken accepts is one the watcher can write: it survives EncodeToken unchanged
// in order and snapshots, its ids are not negative and its snapshots start at a real
// transaction id.
func FuzzDecodeToken(f *testing.F) {
	const ts = `"timestamp":"2025-05-06T07:08:09Z"`
	for _, seed := range []string{
		`{` + ts + `,"eventID":0,"snapshot":"0:0:"}`, `{` + ts + `,"eventID":7,"snapshot":"100:105:100,103"}`,
		`{` + ts + `,"eventID":41,"snapshot":"100:105:100,103","deltaEnd":"103:120:103,110","deltaAfterID":41}`,
		`{` + ts + `,"eventID":7,"switchover":"100:105:100,103"}`, `{"eventID":7}`, `{` + ts + `,"eventID":-1}`,
		`{` + ts + `,"eventID":41,"snapshot":"100:105:100","deltaEnd":"103:120:110","deltaXid":"107","deltaID":41}`,
		`{` + ts + `,"eventID":5,"table":"items"}`, `{` + ts + `,"eventID":5}x`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := DecodeToken(data)
		if err != nil {
			return
		}
		require.GreaterOrEqual(t, p.ID, int64(0), "%q", data)
		if p.Span == nil {
			again, err := DecodeToken(EncodeToken(p, ""))
			require.NoError(t, err)
			require.Equal(t, p, again)
			return
		}
		for _, s := range []Snapshot{p.Span.Base, p.Span.End} {
			if s.Xmax != 0 || s.Xmin != 0 { // end is zero without hasEnd
				require.GreaterOrEqual(t, s.Xmin, uint64(FirstNormalXid), "%q", data)
			}
		}
		again, err := DecodeToken(EncodeToken(p, ""))
		require.NoError(t, err, "%q re-encoded as %q", data, EncodeToken(p, ""))
		require.Equal(t, 0, p.Compare(again), "%q", data)
		require.True(t, p.Span.Base.Equal(again.Span.Base), "%q", data)
	})
}

// A token saved inside a delta by an earlier release, which read deltas in (txid, id) order,
// resumes at the start of that delta: it replays the rows passed there, and skips none. A token
// of this release inside a delta has no deltaXid: an earlier release, which requires deltaXid
// and deltaID with deltaEnd, refuses it instead of reading its id in (txid, id) order.
func TestDeltaTokensOfEarlierReleases(t *testing.T) {
	p, err := DecodeToken([]byte(`{"timestamp":"2025-05-06T07:08:09Z","eventID":41,"snapshot":"100:105:100",` +
		`"deltaEnd":"103:120:110","deltaXid":"107","deltaID":41}`))
	require.NoError(t, err)
	require.True(t, p.InDelta())
	require.False(t, p.InRows, "at the start of the delta")
	require.Equal(t, "103:120:110", p.Span.End.String(), "of the same delta")
	require.Equal(t, int64(41), p.ID, "eventID still names the last row certified")

	tok := string(EncodeToken(Position{ChangedAt: time.Now(), ID: 41, InRows: true,
		Span: &Span{Seq: 1, Base: mustSnapshot(t, "100:105:100"), End: mustSnapshot(t, "103:120:110"), HasEnd: true}}, "t"))
	require.Contains(t, tok, `"deltaEnd":`)
	require.NotContains(t, tok, `"deltaXid"`)
	require.NotContains(t, tok, `"deltaID"`)
}

func TestDeltaPositionOrder(t *testing.T) {
	base, end := mustSnapshot(t, "100:105:100"), mustSnapshot(t, "106:120:")
	d1 := &Span{Seq: 1, Base: base, End: end, HasEnd: true}
	start := Position{ID: 99, Span: &Span{Seq: 1, Base: base}}
	a := Position{ID: 3, Xid: 106, InRows: true, Span: d1}
	b := Position{ID: 5, Xid: 100, InRows: true, Span: d1}
	switchOver := Position{ChangedAt: time.Now(), ID: 1000, Span: &Span{Base: base}}
	next := b.NextDelta(end)
	require.True(t, start.Before(a), "a delta's start is before its rows, whatever the ids")
	require.True(t, a.Before(b), "id order inside a delta, whatever the txids")
	require.True(t, b.Before(next), "the next delta is after every row of this one")
	require.True(t, switchOver.Before(start), "the legacy part of a switch-over is before every delta")
	require.Equal(t, 0, start.Compare(start.WithEnd(end, "")), "taking the end snapshot does not move the start")
	require.Equal(t, Position{ID: 4, Xid: 100, InRows: true, Span: d1}, b.Predecessor())
}

func mustSnapshot(t *testing.T, s string) Snapshot {
	t.Helper()
	snap, err := ParseSnapshot(s)
	require.NoError(t, err)
	return snap
}
