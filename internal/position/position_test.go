package position

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPositionOrder(t *testing.T) {
	a := pos(1, 9)
	require.True(t, a.Before(pos(1, 10)))
	require.True(t, a.Before(pos(2, 1)), "changed_at orders before id")
	require.Equal(t, 0, a.Compare(Make(a.ChangedAt.In(time.FixedZone("x", 3600)), 9)),
		"equal instants in other zones are equal")
	sub := Make(a.ChangedAt.Add(999*time.Nanosecond), 9)
	require.Equal(t, 0, a.Compare(sub), "compared at microsecond precision")
	require.Equal(t, pos(1, 8), a.Predecessor())
}

func TestTokenRoundTrip(t *testing.T) {
	p := Make(time.Date(2025, 5, 6, 7, 8, 9, 123456000, time.UTC), 452)
	data := EncodeToken(p, "")
	require.JSONEq(t, `{"timestamp":"2025-05-06T07:08:09.123456Z","eventID":452}`, string(data))
	got, err := DecodeToken(data)
	require.NoError(t, err)
	require.Equal(t, 0, p.Compare(got))
}

func TestDecodeTokenFormats(t *testing.T) {
	got, err := DecodeToken([]byte(`{"timestamp":"2025-05-06T07:08:09.5+02:00","eventID":7}`))
	require.NoError(t, err)
	require.Equal(t, int64(7), got.ID)
	require.True(t, got.ChangedAt.Equal(time.Date(2025, 5, 6, 5, 8, 9, 5e8, time.UTC)))

	got, err = DecodeToken([]byte(`{"eventID": 452}`))
	require.ErrorIs(t, err, ErrTokenNeedsLookup, "an id-only token needs its row's time")
	require.Equal(t, int64(452), got.ID)

	got, err = DecodeToken([]byte(`{"eventID": 4.52e2, "timestamp": "2025-05-06T07:08:09Z"}`))
	require.NoError(t, err, "a float eventID written by a JSON library is accepted")
	require.Equal(t, int64(452), got.ID)

	for _, bad := range []string{``, `null`, `{}`, `{"eventID":"x"}`, `{"eventID":1.5}`, `{"eventID":1,"timestamp":"yesterday"}`, `[1]`} {
		_, err := DecodeToken([]byte(bad))
		require.Error(t, err, bad)
		require.False(t, errors.Is(err, ErrTokenNeedsLookup), bad)
	}
}

func TestParseToken(t *testing.T) {
	id, ok, err := ParseToken([]byte("452"))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(452), id)

	_, ok, err = ParseToken(nil)
	require.NoError(t, err)
	require.False(t, ok, "an empty token certifies nothing")

	for _, bad := range []string{"abc", "1.5", " 1", "99999999999999999999", `{"eventID":1}`} {
		_, ok, err := ParseToken([]byte(bad))
		require.ErrorIs(t, err, ErrInvalidToken, bad)
		require.ErrorContains(t, err, "decimal")
		require.False(t, ok)
	}
}

func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"452", "", "-1", "abc", "9223372036854775807", "9223372036854775808", "+7"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, token []byte) {
		id, ok, err := ParseToken(token)
		if len(token) == 0 {
			require.False(t, ok)
			require.NoError(t, err)
			return
		}
		want, perr := strconv.ParseInt(string(token), 10, 64)
		if perr != nil {
			require.ErrorIs(t, err, ErrInvalidToken)
			require.False(t, ok)
			return
		}
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, want, id)
		// Every token the watcher hands out parses back to its id.
		back, ok, err := ParseToken(strconv.AppendInt(nil, id, 10))
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, id, back)
	})
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// pos returns a position sec seconds after t0.
func pos(sec int, id int64) Position {
	return Make(t0.Add(time.Duration(sec)*time.Second), id)
}
