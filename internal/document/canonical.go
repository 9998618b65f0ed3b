package document

import (
	"bytes"
	"math"
	"strconv"
	"unicode/utf8"
)

// canonicalJSON reports whether decoding data, a valid JSON object, gives every decoder the
// same input as decoding json.Marshal of the map it decodes to after the changes
// UnmarshalMap makes, except for white space and the order of members:
//   - every string and number is written as json.Marshal writes it (so a json.Number, an int
//     field or a time.Time sees the same bytes; "1.0", "1e2", "\u00e9" or "<" do not pass);
//   - every member name is printable ASCII without escapes, and no two names of one object are
//     equal ignoring case (so each name reaches the same struct field, whatever the order);
//   - no name is "createdat" (renamed by the round trip) and the top level has no "document"
//     (unwrapped by it).
//
// It reads data once and allocates nothing for objects of up to len(nameSet.small) members.
func canonicalJSON(data []byte) bool {
	i, ok := canonicalValue(data, skipSpace(data, 0), 0)
	return ok && skipSpace(data, i) == len(data)
}

// canonicalValue checks the value at data[i], inside depth objects and arrays, and returns the
// index after it.
func canonicalValue(data []byte, i, depth int) (int, bool) {
	switch c := data[i]; {
	case c == '{':
		var names nameSet
		return canonicalObject(data, i, depth+1, &names)
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
		return canonicalString(data, i)
	case c == '-' || isDigit(c):
		end := skipNumber(data, i)
		return end, canonicalNumber(data[i:end])
	case c == 'f':
		return i + len("false"), true
	default:
		return i + len("true"), true // true or null
	}
}

// canonicalObject checks the object at data[i], the depth-th container, and returns the index
// after it. names holds the names the object is taken to have already (fullDocumentJSON writes
// members in front), and gets the object's own.
func canonicalObject(data []byte, i, depth int, names *nameSet) (int, bool) {
	if i = skipSpace(data, i+1); data[i] == '}' {
		return i + 1, true
	}
	for {
		end, ok := plainName(data, i)
		name := data[i+1 : end-1]
		if !ok || string(name) == "createdat" || depth == 1 && string(name) == "document" || !names.add(name) {
			return 0, false
		}
		if i, ok = canonicalValue(data, skipSpace(data, skipSpace(data, end)+1), depth); !ok {
			return 0, false
		}
		if i = skipSpace(data, i); data[i] == '}' {
			return i + 1, true
		}
		i = skipSpace(data, i+1) // past the comma
	}
}

// stringStop and nameStop mark the bytes the scans of a string stop at: in a canonical string,
// the quote and each byte that may make it other than json.Marshal writes it (an escape, <, >,
// &, a multi-byte character); in a member name, the quote and each byte that is not printable
// ASCII without escapes.
var stringStop, nameStop = func() (str, name [256]bool) {
	for c := range 256 {
		str[c] = c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c >= utf8.RuneSelf
		name[c] = c == '"' || c == '\\' || c < 0x20 || c > 0x7e
	}
	return str, name
}()

// plainName returns the index after the member name starting at data[i] == '"' of valid JSON
// and whether the name is printable ASCII without escapes.
func plainName(data []byte, i int) (int, bool) {
	for i++; !nameStop[data[i]]; i++ {
	}
	return i + 1, data[i] == '"'
}

// canonicalString returns the index after the string starting at data[i] == '"' of valid JSON
// and whether json.Marshal writes it as it is: no escapes, no characters json.Marshal escapes
// (<, >, &, U+2028, U+2029) and valid UTF-8.
func canonicalString(data []byte, i int) (int, bool) {
	for i++; ; {
		for !stringStop[data[i]] {
			i++
		}
		switch c := data[i]; {
		case c == '"':
			return i + 1, true
		case c < utf8.RuneSelf: // an escape, '<', '>' or '&'
			return 0, false
		}
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			return 0, false
		}
		i += size
	}
}

// nameSet holds the member names of one object, compared ignoring ASCII case (all are ASCII):
// in an array for the first few, then also in a map of their upper-case forms.
type nameSet struct {
	small [32][]byte
	n     int
	many  map[string][]byte // upper-case form -> name, once small is full
}

// add adds name and reports whether no name equal to it ignoring case was there.
func (s *nameSet) add(name []byte) bool {
	if _, dup := s.find(name); dup {
		return false
	}
	if s.n < len(s.small) {
		s.small[s.n] = name
		s.n++
		return true
	}
	if s.many == nil {
		s.many = make(map[string][]byte, 2*len(s.small))
	}
	s.many[string(bytes.ToUpper(name))] = name
	return true
}

// find returns the name of s equal to name ignoring case.
func (s *nameSet) find(name []byte) ([]byte, bool) {
	for _, seen := range s.small[:s.n] {
		if asciiEqualFold(seen, name) {
			return seen, true
		}
	}
	if s.many == nil {
		return nil, false
	}
	seen, ok := s.many[string(bytes.ToUpper(name))]
	return seen, ok
}

// asciiEqualFold reports whether the ASCII texts a and b are equal ignoring case, as
// bytes.EqualFold, without its Unicode folding.
func asciiEqualFold(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// canonicalNumber reports whether json.Marshal writes the float64 or the json.Number the JSON
// number b decodes to (see numberKept) as b.
func canonicalNumber(b []byte) bool {
	digits := 0
	for _, c := range b {
		if !isDigit(c) && c != '-' {
			digits = math.MaxInt // a fraction or an exponent
			break
		}
		digits++
	}
	if digits <= 15 || numberKept(b) { // an integer that float64 holds exactly, or a json.Number,
		return true // written back byte for byte
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
