package changelog

import "strings"

// DefaultPruneBatch is the number of rows Prune, and the SQL retention function
// ("<changelog>_prune"), delete per statement by default.
const DefaultPruneBatch = 10000

// RestrictedTokens returns the SQL condition that a restrictive row-level security policy of the
// token table (table, an expression of type regclass) applies to the current role, which then
// does not see every client's token. Prune and the SQL retention function (schema/prune.sql)
// refuse such a role ([RestrictedTokensMessage]).
func RestrictedTokens(table string) string {
	return `COALESCE(row_security_active(` + table + `), false) AND EXISTS (
	SELECT FROM pg_policy p WHERE p.polrelid = ` + table + ` AND NOT p.polpermissive
	AND EXISTS (SELECT FROM unnest(p.polroles) r WHERE r = 0 OR pg_has_role(current_user, r, 'USAGE')))`
}

// RestrictedTokensMessage is the refusal of a role restricted by RestrictTokens to prune; %s is
// the token table.
const RestrictedTokensMessage = "token table %s hides other clients' tokens from this role (RestrictTokens): " +
	"prune as the table's owner or a BYPASSRLS role, which see every token"

// The forms of a saved token's position, by what it certifies: a legacy position, the legacy
// part of a switch-over, a snapshot (with or without a delta it has not entered), and a
// position inside a delta.
const (
	FormLegacy     = "legacy"
	FormSwitchover = "switchover"
	FormSnapshot   = "snapshot"
	FormInRows     = "rows"
)

// TokenFields are SQL expressions of a saved token's fields: TS (timestamptz) and ID (bigint)
// its legacy position, or, inside a delta, ID its eventID; Base and End (pg_snapshot) its
// snapshot and its delta's end.
type TokenFields struct{ TS, ID, Base, End string }

// Certified returns the predicate, on changelog row c, of the rows a saved token of form,
// with the fields f, has passed. Prune fills f with parameters, the SQL retention function
// (schema/prune.sql) with the columns of the tokens it decoded: both delete by this one rule.
func Certified(form string, f TokenFields) string {
	legacy := "(c.changed_at, c.id) <= (" + f.TS + ", " + f.ID + ")"
	seen := "c.txid IS NULL OR pg_visible_in_snapshot(c.txid, " + f.Base + ")"
	switch form {
	case FormLegacy:
		return legacy
	case FormSwitchover:
		return "(" + legacy + " AND (" + seen + "))"
	case FormSnapshot:
		return "(" + seen + ")"
	}
	return "(" + seen + " OR (pg_visible_in_snapshot(c.txid, " + f.End + ") AND c.id <= " + f.ID + "))"
}

// CertifiedByToken is Certified for a token t of the SQL retention function
// (schema/prune.sql), whatever its form: the columns form, ts, id, base and fin (its delta's end).
// A token of no known form certifies nothing (NULL).
func CertifiedByToken() string {
	f := TokenFields{TS: "t.ts", ID: "t.id", Base: "t.base", End: "t.fin"}
	var b strings.Builder
	b.WriteString("CASE t.form")
	for _, form := range []string{FormLegacy, FormSwitchover, FormSnapshot, FormInRows} {
		b.WriteString("\n            WHEN '" + form + "' THEN " + Certified(form, f))
	}
	b.WriteString(" END")
	return b.String()
}
