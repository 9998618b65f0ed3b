package document

import "bytes"

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

// objectMembers returns the values of the last members named a and b of the JSON object data,
// which must be valid, nil for a name without a member. ok is false when a member name holds an
// escape, so that it may or may not spell a or b.
func objectMembers(data []byte, a, b string) (va, vb []byte, ok bool) {
	i := skipSpace(data, 0) + 1
	for {
		if i = skipSpace(data, i); data[i] == '}' {
			return va, vb, true
		}
		end := skipValidString(data, i)
		name := data[i+1 : end-1]
		if bytes.IndexByte(name, '\\') >= 0 {
			return nil, nil, false
		}
		start := skipSpace(data, skipSpace(data, end)+1) // past the colon
		i = skipValue(data, start)
		switch string(name) {
		case a:
			va = data[start:i]
		case b:
			vb = data[start:i]
		}
		if i = skipSpace(data, i); data[i] == ',' {
			i++
		}
	}
}

// skipValue returns the index after the JSON value starting at data[i], which must be valid.
func skipValue(data []byte, i int) int {
	depth := 0
	for {
		switch c := data[i]; {
		case c == '"':
			i = skipValidString(data, i)
		case c == '{' || c == '[':
			depth++
			i++
		case c == '}' || c == ']':
			depth--
			i++
		case c == 't' || c == 'n':
			i += len("true")
		case c == 'f':
			i += len("false")
		case c == '-' || isDigit(c):
			i = skipNumber(data, i)
		default: // white space, a comma or a colon inside a container
			i++
		}
		if depth == 0 {
			return i
		}
	}
}

// skipValidString returns the index after the string starting at data[i] == '"' of valid JSON:
// after the next quote not escaped by an odd number of backslashes.
func skipValidString(data []byte, i int) int {
	for i++; ; i++ {
		i += bytes.IndexByte(data[i:], '"')
		escapes := 0
		for data[i-1-escapes] == '\\' {
			escapes++
		}
		if escapes%2 == 0 {
			return i + 1
		}
	}
}
