package pgchangestream

import (
	"bytes"
	"math"
	"strconv"
	"unicode/utf8"
)

// canonicalJSON reports whether decoding data, a valid JSON object, gives every decoder the
// same input as decoding json.Marshal of the map it decodes to after the changes
// unmarshalDocumentMap makes, except for white space and the order of members:
//   - every string and number is written as json.Marshal writes it (so a json.Number, an int
//     field or a time.Time sees the same bytes; "1.0", "1e2", 2^53+1, "\u00e9" or "<" do not pass);
//   - every member name is printable ASCII without escapes, and no two names of one object are
//     equal ignoring case (so each name reaches the same struct field, whatever the order);
//   - no name is "createdat" (renamed by the round trip) and the top level has no "document"
//     (unwrapped by it).
func canonicalJSON(data []byte) bool {
	i, ok := canonicalValue(data, skipSpace(data, 0), 0)
	return ok && skipSpace(data, i) == len(data)
}

// canonicalValue checks the value at data[i], inside depth objects and arrays, and returns the
// index after it.
func canonicalValue(data []byte, i, depth int) (int, bool) {
	switch c := data[i]; {
	case c == '{':
		return canonicalObject(data, i, depth+1)
	case c == '[':
		if i = skipSpace(data, i+1); data[i] == ']' {
			return i + 1, true
		}
		for {
			var ok bool
			if i, ok = canonicalValue(data, i, depth+1); !ok {
				return 0, false
			}
			if i = skipSpace(data, i); data[i] == ']' {
				return i + 1, true
			}
			i = skipSpace(data, i+1) // past the comma
		}
	case c == '"':
		end := skipValidString(data, i)
		return end, canonicalString(data[i+1 : end-1])
	case c == '-' || isDigit(c):
		end := skipNumber(data, i)
		return end, canonicalNumber(data[i:end])
	default:
		return skipValue(data, i), true // true, false or null
	}
}

// canonicalObject checks the object at data[i], the depth-th container, and returns the index
// after it.
func canonicalObject(data []byte, i, depth int) (int, bool) {
	var names nameSet
	if i = skipSpace(data, i+1); data[i] == '}' {
		return i + 1, true
	}
	for {
		end := skipValidString(data, i)
		name := data[i+1 : end-1]
		if !plainName(name) || string(name) == "createdat" || depth == 1 && string(name) == "document" || !names.add(name) {
			return 0, false
		}
		var ok bool
		if i, ok = canonicalValue(data, skipSpace(data, skipSpace(data, end)+1), depth); !ok {
			return 0, false
		}
		if i = skipSpace(data, i); data[i] == '}' {
			return i + 1, true
		}
		i = skipSpace(data, i+1) // past the comma
	}
}

// plainName reports whether a member name is printable ASCII without escapes.
func plainName(name []byte) bool {
	for _, c := range name {
		if c < 0x20 || c > 0x7e || c == '\\' {
			return false
		}
	}
	return true
}

// nameSet holds the member names of one object, compared ignoring ASCII case: in a slice for
// the first few, then in a map of their upper-case forms.
type nameSet struct {
	small [16][]byte
	n     int
	many  map[string]struct{}
}

// add adds name and reports whether no name equal to it ignoring case was there.
func (s *nameSet) add(name []byte) bool {
	if s.many == nil && s.n < len(s.small) {
		for _, seen := range s.small[:s.n] {
			if bytes.EqualFold(seen, name) {
				return false
			}
		}
		s.small[s.n] = name
		s.n++
		return true
	}
	if s.many == nil {
		s.many = make(map[string]struct{}, 2*len(s.small))
		for _, seen := range s.small[:s.n] {
			s.many[string(bytes.ToUpper(seen))] = struct{}{}
		}
	}
	key := string(bytes.ToUpper(name))
	if _, dup := s.many[key]; dup {
		return false
	}
	s.many[key] = struct{}{}
	return true
}

// canonicalString reports whether json.Marshal writes the string whose JSON text (between
// the quotes) is s as s: no escapes, no characters json.Marshal escapes (<, >, &, U+2028,
// U+2029) and valid UTF-8.
func canonicalString(s []byte) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c == '\\' || c == '<' || c == '>' || c == '&' {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			return false
		}
		i += size
	}
	return true
}

// canonicalNumber reports whether json.Marshal writes the float64 the JSON number b decodes
// to as b.
func canonicalNumber(b []byte) bool {
	digits := 0
	for _, c := range b {
		if !isDigit(c) && c != '-' {
			digits = math.MaxInt // a fraction or an exponent
			break
		}
		digits++
	}
	if digits <= 15 { // an integer that float64 holds exactly, written back digit for digit
		return true
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return false
	}
	var buf [32]byte
	return bytes.Equal(appendJSONFloat(buf[:0], f), b)
}

// appendJSONFloat appends f as json.Marshal writes a float64.
func appendJSONFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' { // json.Marshal writes e-07 as e-7
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}
