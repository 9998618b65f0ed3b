package document

import (
	"bytes"
	"encoding/json"
	"math"
	"math/big"
	"reflect"
	"strconv"
	"strings"
	"testing"

	gojson "github.com/goccy/go-json"
	"github.com/stretchr/testify/require"
)

// decodeSeeds are JSON texts where decoders are known to disagree: numbers at the edges of
// float64, escapes and surrogates, invalid UTF-8, duplicate keys, deep nesting, trailing data
// and inputs that are not objects or not JSON.
var decodeSeeds = []string{
	`{}`, ` {"a":1} `, "\t\r\n{\"a\":1}\n", `{"a":1,"a":2}`, `{"a":{"b":1},"a":{"c":2}}`, `{"a":[1,2],"a":null}`,
	`{"n":0,"m":-0,"f":1.5,"e":1e3,"E":1E-7,"x":-1.25e+300}`,
	`{"big":12345678901234567890,"bigger":123456789012345678901234567890,"max":9007199254740993}`,
	`{"tiny":4.9e-324,"under":1e-400,"huge":1.7976931348623157e308}`, `{"over":1e400}`, `{"over":-1e309}`,
	`{"lead":01}`, `{"dot":1.}`, `{"exp":1e}`, `{"plus":+1}`, `{"hex":0x1}`, `{"nan":NaN}`,
	`{"s":"\u00e9\u4e2d\ud83d\ude00","raw":"é中😀"}`, `{"lone":"\ud800","low":"\udc00x","pair":"\ud800\udc00"}`,
	`{"esc":"\"\\\/\b\f\n\r\t","nul":"\u0000","ctl":"\u001f"}`, `{"bad":"\x"}`, `{"bad":"\u12"}`,
	"{\"raw\":\"a\tb\"}", "{\"inv\":\"\xff\xfe\"}", "{\"trunc\":\"\xe2\x82\"}", "{\"\xc3\x28\":1}",
	"\xef\xbb\xbf{}", `{"k\u0041":1,"kA":2}`, `{"":""}`, `{"a":true,"b":false,"c":null}`,
	`{"a":[[],[{}],[[1]]],"b":{"c":{"d":{"e":[]}}}}`, `{"a":tru}`, `{"a":nul}`, `{"a":1,}`, `{"a" 1}`,
	`{"a":1}x`, `{"a":1} {}`, `{"a":1}]`, `{`, `}`, ``, ` `, `null`, `[]`, `[{"a":1}]`, `"s"`, `1`,
	`true`, `{"a":1}` + "\x00", `{'a':1}`, `{a:1}`,
}

// nestedSeed returns an object nested depth levels deep.
func nestedSeed(depth int) string {
	s := ""
	for range depth {
		s += `{"a":`
	}
	s += "1"
	for range depth {
		s += "}"
	}
	return s
}

// nestedArrays returns arrays nested depth levels deep.
func nestedArrays(depth int) string { return strings.Repeat("[", depth) + strings.Repeat("]", depth) }

// requireSameDecode checks that scanJSON agrees with encoding/json's Valid on data and that
// UnmarshalObject gives what referenceDecode gives: the same error, or the same document, float
// signs and the bytes of every string included.
func requireSameDecode(t *testing.T, data []byte) {
	t.Helper()
	valid, _ := scanJSON(data)
	require.Equal(t, json.Valid(data), valid, "validity of %q", data)
	want, wantErr := referenceDecode(data)
	got, err := UnmarshalObject(data)
	if wantErr != nil {
		require.EqualError(t, err, wantErr.Error(), "input %q", data)
		require.Equal(t, reflect.TypeOf(wantErr), reflect.TypeOf(err), "input %q", data)
		return
	}
	require.NoError(t, err, "input %q", data)
	require.True(t, sameJSONValue(want, got), "input %q:\nwant %#v\ngot  %#v", data, want, got)
}

// referenceDecode is what UnmarshalObject must give: encoding/json's Unmarshal into a
// map[string]any for every input but a valid JSON object, and for a valid object its decoding
// with UseNumber where every number a float64 holds (referenceKept is false) is that float64.
func referenceDecode(data []byte) (map[string]any, error) {
	var doc map[string]any
	if trimmed := bytes.TrimLeft(data, " \t\r\n"); !json.Valid(data) || len(trimmed) == 0 || trimmed[0] != '{' {
		err := json.Unmarshal(data, &doc)
		return doc, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	var convert func(v any) any
	convert = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			for k, item := range v {
				v[k] = convert(item)
			}
		case []any:
			for i, item := range v {
				v[i] = convert(item)
			}
		case json.Number:
			if !referenceKept(string(v)) {
				f, err := strconv.ParseFloat(string(v), 64)
				if err != nil {
					panic(err)
				}
				return f
			}
		}
		return v
	}
	convert(doc)
	return doc, nil
}

// referenceKept is the rule of numberKept written with math/big: an integer literal beyond
// ±2^53, a number beyond float64's range, or a number with a non-zero digit that rounds to zero.
func referenceKept(n string) bool {
	if !strings.ContainsAny(n, ".eE") {
		i, ok := new(big.Int).SetString(n, 10)
		if !ok {
			panic(n)
		}
		return i.CmpAbs(new(big.Int).Lsh(big.NewInt(1), 53)) > 0
	}
	f, err := strconv.ParseFloat(n, 64)
	if err != nil {
		return true
	}
	mantissa, _, _ := strings.Cut(strings.ToLower(n), "e")
	return f == 0 && strings.Trim(mantissa, "-.0") != ""
}

func TestUnmarshalObjectKeepsNumbersFloat64CannotHold(t *testing.T) {
	doc, err := UnmarshalObject([]byte(`{"huge": 1e400, "label": "keep me", "neg": -1e400, "long": 123456789012345678901234567890,
		"above": 9007199254740993, "below": -9007199254740993, "max": 9007199254740992, "min": -9007199254740992,
		"tiny": 1e-400, "zero": 0e-400, "negzero": -0, "small": 4.9e-324, "big": 1.5e300, "frac": 12345678901234567890.5,
		"nested": [{"x": 1e400, "y": 1}], "dup": 1, "dup": 99999999999999999999}`))
	require.NoError(t, err)
	require.Equal(t, map[string]any{
		"huge": json.Number("1e400"), "label": "keep me", "neg": json.Number("-1e400"),
		"long": json.Number("123456789012345678901234567890"), "above": json.Number("9007199254740993"),
		"below": json.Number("-9007199254740993"), "max": float64(1 << 53), "min": -float64(1 << 53),
		"tiny": json.Number("1e-400"), "zero": float64(0), "negzero": math.Copysign(0, -1), "small": 5e-324,
		"big": 1.5e300, "frac": 12345678901234567890.5, "nested": []any{map[string]any{"x": json.Number("1e400"), "y": float64(1)}},
		"dup": json.Number("99999999999999999999"),
	}, doc)
	require.True(t, math.Signbit(doc["negzero"].(float64)))
}

// sameJSONValue is reflect.DeepEqual for decoded JSON that also tells -0 from 0.
func sameJSONValue(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || (a == nil) != (b == nil) || len(a) != len(b) {
			return false
		}
		for k, av := range a {
			if bv, ok := b[k]; !ok || !sameJSONValue(av, bv) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !sameJSONValue(a[i], b[i]) {
				return false
			}
		}
		return true
	case float64:
		b, ok := b.(float64)
		return ok && math.Float64bits(a) == math.Float64bits(b)
	default:
		return reflect.DeepEqual(a, b)
	}
}

func TestUnmarshalObjectMatchesEncodingJSON(t *testing.T) {
	deep := []string{nestedSeed(200), nestedSeed(10000), nestedSeed(10001), `{"a":` + nestedArrays(9999) + `}`,
		`{"a":` + nestedArrays(10000) + `}`, nestedArrays(10000), nestedArrays(10001)}
	for _, s := range append(append(decodeSeeds, evBenchOld, evBenchNew), deep...) {
		requireSameDecode(t, []byte(s))
	}
}

func TestUnmarshalObjectCopiesStrings(t *testing.T) {
	data := []byte(`{"key":"value","arr":["x"],"obj":{"k":"v"}}`)
	doc, err := UnmarshalObject(data)
	require.NoError(t, err)
	for i := range data {
		data[i] = ' '
	}
	require.Equal(t, map[string]any{"key": "value", "arr": []any{"x"}, "obj": map[string]any{"k": "v"}}, doc)
}

func FuzzDecodeMatchesEncodingJSON(f *testing.F) {
	for _, s := range append(decodeSeeds, evBenchOld, evBenchNew, nestedSeed(50)) {
		f.Add([]byte(s))
	}
	f.Fuzz(requireSameDecode)
}

var (
	evSinkDoc   map[string]any
	evSinkValid bool
)

// BenchmarkValidJSON checks a health_events row of about 1 KB with encoding/json's Valid and
// with scanJSON, the check in front of the faster decoder.
func BenchmarkValidJSON(b *testing.B) {
	data := []byte(evBenchNew)
	for _, v := range []struct {
		name  string
		valid func([]byte) bool
	}{{"encoding_json", json.Valid}, {"scanJSON", func(data []byte) bool { valid, _ := scanJSON(data); return valid }}} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				evSinkValid = v.valid(data)
			}
		})
	}
}

// BenchmarkDecodeDocument decodes a health_events row of about 1 KB into a map[string]any
// with encoding/json, with github.com/goccy/go-json alone, and with UnmarshalObject (which
// validates first), so the choice of decoder and the cost of its checks are measured side
// by side.
func BenchmarkDecodeDocument(b *testing.B) {
	data := []byte(evBenchNew)
	decoders := []struct {
		name   string
		decode func([]byte) (map[string]any, error)
	}{
		{"encoding_json", func(data []byte) (doc map[string]any, err error) { return doc, json.Unmarshal(data, &doc) }},
		{"goccy", func(data []byte) (doc map[string]any, err error) { return doc, gojson.Unmarshal(data, &doc) }},
		{"unmarshalObject", UnmarshalObject},
	}
	for _, d := range decoders {
		b.Run(d.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				doc, err := d.decode(data)
				if err != nil {
					b.Fatal(err)
				}
				evSinkDoc = doc
			}
		})
	}
}
