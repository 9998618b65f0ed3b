package pgchangestream

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// The faster decoder is given the types it decodes as encoding/json does: none reaching an
// encoding.TextUnmarshaler other than time.Time.
func TestFasterDecoderTypeGate(t *testing.T) {
	for _, tt := range []struct {
		v           any
		plain, fast bool
	}{
		{new(healthEventWithStatus), true, true},
		{new(docStruct), true, true},
		{new(map[string]any), true, true},
		{new(any), true, true},
		{new(textTarget), true, false},
		{new(map[textLevel]int), true, false},
		{new([]*textLevel), true, false},
		{new(rawTarget), false, false},
	} {
		typ := reflect.TypeOf(tt.v).Elem()
		p := inspectType(typ, false, map[reflect.Type]bool{})
		require.Equal(t, tt.plain, p.plain, "%v plain", typ)
		require.Equal(t, tt.fast, p.plain && p.fast, "%v fast", typ)
	}
}

// A typed read of a health event takes the faster decoder: 67 allocations through encoding/json.
func TestUnmarshalDocumentAllocations(t *testing.T) {
	for _, rawDocuments := range []bool{false, true} {
		ev := healthEvent(t, rawDocuments)
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := Document[healthEventWithStatus](ev); err != nil {
				t.Fatal(err)
			}
		})
		require.LessOrEqual(t, allocs, 45.0, "raw %v", rawDocuments)
	}
}

// When the faster decoder fails, the target is decoded afresh by encoding/json: its error (the
// first in the text's order, where the round trip reports the first in sorted order), and the
// members after the failing one, as the map round trip gives them.
func TestUnmarshalDocumentErrorsAreEncodingJSONs(t *testing.T) {
	w := newWatcher(Config{ClientName: "c", TableName: "t"}.withDefaults())
	ev, raw, err := w.event(evRow("INSERT", "", `{"i8": 300, "s": "after", "a": {"n": 1.5, "s": "in"}}`))
	require.NoError(t, err)
	var got docStruct
	gotErr := EventWithToken{Event: ev, raw: raw}.UnmarshalDocument(&got)
	var typeErr *json.UnmarshalTypeError
	require.True(t, errors.As(gotErr, &typeErr), "%T %v", errors.Unwrap(gotErr), gotErr)
	var want docStruct
	require.Error(t, unmarshalDocumentMap(ev, &want))
	require.Equal(t, want, got)
	require.Equal(t, "after", got.S)
}
