package changelog

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestSplitChecksEachPart(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"datastore_changelog", true},
		{"app.datastore_changelog", true},
		{"a$b", true},
		{"", false},
		{"a.b.c", false},
		{"1table", false},
		{`bad"name`, false},
		{"app." + strings.Repeat("x", MaxIdentifierLen), true},
		{strings.Repeat("x", MaxIdentifierLen+1), false},
	} {
		if err := CheckName(tc.name); (err == nil) != tc.ok {
			t.Errorf("CheckName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	if err := CheckChannel("app.channel"); err == nil {
		t.Error("CheckChannel accepted a schema-qualified channel")
	}
}

func TestQuote(t *testing.T) {
	if got, want := Quote("app.Changes"), `"app"."Changes"`; got != want {
		t.Errorf("Quote = %s, want %s", got, want)
	}
	// A name that was never checked is quoted whole, so it stays one inert identifier.
	if got, want := Quote(`x"; DROP TABLE t; --`), `"x""; DROP TABLE t; --"`; got != want {
		t.Errorf("Quote of an unchecked name = %s, want %s", got, want)
	}
	if got, want := QuoteLiteral("it's"), `'it''s'`; got != want {
		t.Errorf("QuoteLiteral = %s, want %s", got, want)
	}
}

func TestNamesBesideTheChangelog(t *testing.T) {
	if got := ParkedTable("app.log"); got != "app.log_parked" {
		t.Errorf("ParkedTable = %s", got)
	}
	if got := UnitExpression("app.log"); got != `COALESCE(unit, "app"."log_unit"(record_id::text))` {
		t.Errorf("UnitExpression = %s", got)
	}
	long := strings.Repeat("t", MaxIdentifierLen)
	if got := TriggerName("app." + long); len(got) != MaxIdentifierLen || !strings.HasPrefix(got, "ttt") {
		t.Errorf("TriggerName of a long table = %q, want it cut to %d bytes as PostgreSQL cuts it", got, MaxIdentifierLen)
	}
	if got := TriggerName("app.health_events"); got != "health_events_changes" {
		t.Errorf("TriggerName = %s", got)
	}
}

func TestCheckText(t *testing.T) {
	for _, tc := range []struct {
		s  string
		ok bool
	}{{"node1", true}, {"a\x00b", false}, {"\xff", false}, {strings.Repeat("é", 5), true}, {strings.Repeat("é", 6), false}} {
		if err := CheckText(tc.s, 5); (err == nil) != tc.ok {
			t.Errorf("CheckText(%q, 5) = %v, want ok=%v", tc.s, err, tc.ok)
		}
	}
}

func TestHasCode(t *testing.T) {
	err := errors.Join(errors.New("context"), &pgconn.PgError{Code: LockNotAvailable})
	if !HasCode(err, LockNotAvailable) || HasCode(err, UndefinedTable) || HasCode(errors.New("x"), LockNotAvailable) {
		t.Error("HasCode does not tell the wrapped code apart")
	}
}

// UnitOf is the first four bytes of the key's MD5, big-endian, modulo 1024 (values computed
// with another MD5 implementation).
func TestUnitOf(t *testing.T) {
	for key, want := range map[string]int{"": 217, "a": 441, "items/1": 139, "node-7": 792} {
		if got := UnitOf(key); got != want {
			t.Errorf("UnitOf(%q) = %d, want %d", key, got, want)
		}
	}
}
