package pgchangestream

import (
	"bytes"
	"encoding/json"
	"strconv"

	gojson "github.com/goccy/go-json"
)

// unmarshalObject decodes the JSON text of a changelog column into doc, with the result and
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
func unmarshalObject(data []byte) (doc map[string]any, err error) {
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

// maxNestingDepth is the deepest nesting of objects and arrays encoding/json accepts.
const maxNestingDepth = 10000

// scanJSON reports whether data is one JSON value with optional white space around it, with
// the verdict of encoding/json's Valid, including its nesting limit and its acceptance of any
// byte other than a control character inside strings, and whether it holds a number that
// numberKept keeps (reported only for valid data). It is several times faster than Valid.
func scanJSON(data []byte) (valid, kept bool) {
	// inObject[d/64] bit d%64 is set when the container at depth d is an object.
	var inObject [maxNestingDepth/64 + 1]uint64
	depth := 0
	i := skipSpace(data, 0)
	for {
		// A value starts at i.
		if i >= len(data) {
			return false, false
		}
		switch c := data[i]; {
		case c == '{' || c == '[':
			if depth++; depth > maxNestingDepth {
				return false, false
			}
			if c == '{' {
				inObject[depth/64] |= 1 << (depth % 64)
			} else {
				inObject[depth/64] &^= 1 << (depth % 64)
			}
			i = skipSpace(data, i+1)
			if i < len(data) && data[i] == c+2 { // '}' is '{'+2 and ']' is '['+2
				depth--
				i++
				break
			}
			if c == '{' {
				if i = skipKey(data, i); i < 0 {
					return false, false
				}
			}
			continue
		case c == '"':
			i = skipString(data, i)
		case c == '-' || '0' <= c && c <= '9':
			start := i
			if i = skipNumber(data, i); i >= 0 && !kept && mayBeKept(data, start, i) {
				kept = numberKept(data[start:i])
			}
		case c == 't':
			i = skipLiteral(data, i, "true")
		case c == 'f':
			i = skipLiteral(data, i, "false")
		case c == 'n':
			i = skipLiteral(data, i, "null")
		default:
			return false, false
		}
		if i < 0 {
			return false, false
		}
		// A value ended at i: close containers until a comma asks for the next value.
		for {
			i = skipSpace(data, i)
			if depth == 0 {
				return i == len(data), kept && i == len(data)
			}
			if i >= len(data) {
				return false, false
			}
			object := inObject[depth/64]&(1<<(depth%64)) != 0
			c := data[i]
			if c == ',' {
				i = skipSpace(data, i+1)
				if object {
					if i = skipKey(data, i); i < 0 {
						return false, false
					}
				}
				break
			}
			if object && c == '}' || !object && c == ']' {
				depth--
				i++
				continue
			}
			return false, false
		}
	}
}

// skipSpace returns the index of the first byte at or after i that is not JSON white space.
func skipSpace(data []byte, i int) int {
	for i < len(data) {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipKey skips an object key, the colon after it and the white space around them, returning
// where the value starts, or -1.
func skipKey(data []byte, i int) int {
	if i >= len(data) || data[i] != '"' {
		return -1
	}
	if i = skipString(data, i); i < 0 {
		return -1
	}
	if i = skipSpace(data, i); i >= len(data) || data[i] != ':' {
		return -1
	}
	return skipSpace(data, i+1)
}

// skipString returns the index after the string starting at data[i] == '"', or -1.
func skipString(data []byte, i int) int {
	for i++; i < len(data); {
		switch c := data[i]; {
		case c == '"':
			return i + 1
		case c == '\\':
			if i+1 >= len(data) {
				return -1
			}
			switch data[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+5 >= len(data) || !isHex(data[i+2]) || !isHex(data[i+3]) || !isHex(data[i+4]) || !isHex(data[i+5]) {
					return -1
				}
				i += 6
			default:
				return -1
			}
		case c < 0x20:
			return -1
		default:
			i++
		}
	}
	return -1
}

// skipNumber returns the index after the number starting at data[i], or -1.
func skipNumber(data []byte, i int) int {
	if data[i] == '-' {
		i++
	}
	switch {
	case i < len(data) && data[i] == '0':
		i++
	case i < len(data) && '1' <= data[i] && data[i] <= '9':
		i = skipDigits(data, i+1)
	default:
		return -1
	}
	if i < len(data) && data[i] == '.' {
		if i+1 >= len(data) || !isDigit(data[i+1]) {
			return -1
		}
		i = skipDigits(data, i+1)
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if i >= len(data) || !isDigit(data[i]) {
			return -1
		}
		i = skipDigits(data, i)
	}
	return i
}

// skipLiteral returns the index after lit at data[i], or -1 if it is not there.
func skipLiteral(data []byte, i int, lit string) int {
	if !bytes.HasPrefix(data[i:], []byte(lit)) {
		return -1
	}
	return i + len(lit)
}

// skipDigits returns the index of the first byte at or after i that is not a digit.
func skipDigits(data []byte, i int) int {
	for i < len(data) && isDigit(data[i]) {
		i++
	}
	return i
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isHex(c byte) bool { return isDigit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }
