package changelog

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// identifierPart is one part of a table or channel name: an unquoted-style SQL identifier.
var identifierPart = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*$`)

// MaxIdentifierLen is PostgreSQL's NAMEDATALEN-1: longer names are silently truncated.
const MaxIdentifierLen = 63

// Split splits "name" or "schema.name" and checks each part.
func Split(name string) (pgx.Identifier, error) {
	if name == "" {
		return nil, errors.New("name is empty")
	}
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%q has more than one dot (want name or schema.name)", name)
	}
	for _, p := range parts {
		if !identifierPart.MatchString(p) {
			return nil, fmt.Errorf("%q is not a valid identifier (letters, digits, _ and $, not starting with a digit)", name)
		}
		if len(p) > MaxIdentifierLen {
			return nil, fmt.Errorf("%q is longer than %d bytes", p, MaxIdentifierLen)
		}
	}
	return pgx.Identifier(parts), nil
}

// CheckName reports whether name is a valid table or function name.
func CheckName(name string) error {
	_, err := Split(name)
	return err
}

// CheckChannel reports whether name is a valid NOTIFY channel: one identifier, no schema.
func CheckChannel(name string) error {
	if strings.Contains(name, ".") {
		return fmt.Errorf("%q contains a dot", name)
	}
	return CheckName(name)
}

// Quote quotes a name already checked by CheckName ("schema"."name").
func Quote(name string) string {
	id, err := Split(name)
	if err != nil {
		// Unreachable for validated names; quoting the whole string keeps it inert anyway.
		return pgx.Identifier{name}.Sanitize()
	}
	return id.Sanitize()
}

// QuoteLiteral returns s as a SQL string literal. Names reaching it are validated identifiers,
// which hold no quote or backslash; quotes are doubled all the same.
func QuoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// Unqualified returns the name part of "name" or "schema.name".
func Unqualified(name string) string {
	return name[strings.LastIndexByte(name, '.')+1:]
}

// CheckText reports whether s can be stored in a VARCHAR(max) column: valid UTF-8, no NUL
// byte (PostgreSQL text cannot hold one), at most max characters.
func CheckText(s string, max int) error {
	switch {
	case !utf8.ValidString(s):
		return errors.New("not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return errors.New("contains a NUL byte")
	}
	if n := utf8.RuneCountInString(s); n > max {
		return fmt.Errorf("%d characters, longer than the column's %d", n, max)
	}
	return nil
}
