package document

import (
	"bytes"
	"encoding/json"
	"strconv"

	gojson "github.com/goccy/go-json"
)

// UnmarshalObject decodes the JSON text of a changelog column into doc, with the result and
// the error of encoding/json's Unmarshal into a map[string]any, about twice as fast, except for
// the numbers a float64 cannot hold (see numberKept), which become a json.Number of their text
// where encoding/json fails or loses digits: every value jsonb accepts is kept.
//
// Objects that pass scanJSON (exactly the texts encoding/json accepts), which is every value
// PostgreSQL's jsonb gives, and hold no such number are decoded with github.com/goccy/go-json
// (strings copied, numbers float64, the last of duplicate keys wins, invalid UTF-8 replaced, as
// encoding/json does). Objects with such a number are decoded by encoding/json with UseNumber,
// and every other number made a float64 again. Anything else takes encoding/json itself, so
// every input it rejects is rejected with its own error: the faster decoder's syntax checks
// differ in places and are never relied on. FuzzDecodeMatchesEncodingJSON holds the paths to
// the same documents.
func UnmarshalObject(data []byte) (doc map[string]any, err error) {
	switch object, kept := scanObject(data); {
	case object && !kept:
		if err := gojson.Unmarshal(data, &doc); err == nil {
			return doc, nil
		}
		doc = nil
	case object:
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if err := dec.Decode(&doc); err != nil {
			return nil, err
		}
		floatNumbers(doc)
		return doc, nil
	}
	err = json.Unmarshal(data, &doc)
	return doc, err
}

// floatNumbers replaces, in place, every json.Number of v, decoded with UseNumber, that a float64
// holds (see numberKept) by that float64, and returns v.
func floatNumbers(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for key, item := range v {
			v[key] = floatNumbers(item)
		}
	case []any:
		for i, item := range v {
			v[i] = floatNumbers(item)
		}
	case json.Number:
		if !numberKept([]byte(v)) {
			f, _ := strconv.ParseFloat(string(v), 64)
			return f
		}
	}
	return v
}

// maxExactInteger is 2^53: every integer of at most its magnitude is exactly a float64.
const maxExactInteger = "9007199254740992"

// numberKept reports whether the valid JSON number b is decoded as a json.Number of its text
// instead of a float64, because a float64 cannot hold it: an integer written without fraction or
// exponent beyond ±2^53 (123456789012345678901234567890), a number beyond float64's range (1e400),
// or one that is not zero but rounds to zero (1e-400). Other numbers are the nearest float64,
// as encoding/json decodes them.
func numberKept(b []byte) bool {
	digits := bytes.TrimPrefix(b, []byte("-"))
	if bytes.IndexAny(digits, ".eE") < 0 {
		return len(digits) > len(maxExactInteger) ||
			len(digits) == len(maxExactInteger) && string(digits) > maxExactInteger
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return true // out of range
	}
	if f != 0 {
		return false
	}
	if e := bytes.IndexAny(digits, "eE"); e >= 0 {
		digits = digits[:e]
	}
	return bytes.ContainsAny(digits, "123456789")
}

// mayBeKept is a quick test that numberKept(data[start:end]) is false: numbers of up to 15
// bytes without an exponent are always float64s.
func mayBeKept(data []byte, start, end int) bool {
	if end-start > 15 {
		return true
	}
	for _, c := range data[start:end] {
		if c == 'e' || c == 'E' {
			return true
		}
	}
	return false
}

// scanObject reports whether data is a JSON object that encoding/json accepts, and whether it
// holds a number that numberKept keeps.
func scanObject(data []byte) (object, kept bool) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false, false
	}
	return scanJSON(data)
}
