package position

import (
	"strconv"
	"strings"
)

// The forms of a saved token's position, by what it certifies (see savedToken): a legacy
// position, the legacy part of a switch-over, a snapshot (with or without a delta it has not
// entered), and a position inside a delta.
const (
	FormLegacy     = "legacy"
	FormSwitchover = "switchover"
	FormSnapshot   = "snapshot"
	FormInRows     = "rows"
)

// tokenFields are SQL expressions of a saved token's fields: ts (timestamptz) and id (bigint)
// its legacy position, or, inside a delta, id its eventID; base and end (pg_snapshot) its
// snapshot and its delta's end.
type tokenFields struct{ ts, id, base, end string }

// CertifiedBy returns the SQL predicate, on changelog row c, of the rows a saved token at p has
// passed (see savedToken); arg adds a parameter and returns its placeholder.
func CertifiedBy(p Position, arg func(any) string) string {
	var (
		f    tokenFields
		form string
	)
	switch { // the parameters in the order the predicate names them
	case p.Span == nil || !p.InDelta():
		form = FormLegacy
		f.ts, f.id = arg(p.ChangedAt)+"::timestamptz", arg(p.ID)+"::bigint"
		if p.Span != nil {
			form, f.base = FormSwitchover, arg(p.Span.Base.String())+"::pg_snapshot"
		}
	case !p.InRows:
		form, f.base = FormSnapshot, arg(p.Span.Base.String())+"::pg_snapshot"
	default:
		form, f.base = FormInRows, arg(p.Span.Base.String())+"::pg_snapshot"
		f.end, f.id = arg(p.Span.End.String())+"::pg_snapshot", arg(p.ID)+"::bigint"
	}
	return certifiedSQL(form, f)
}

// certifiedSQL returns the predicate, on changelog row c, of the rows a saved token of form,
// with the fields f, has passed. [Prune] fills f with parameters, the SQL retention function
// (schema/prune.sql) with the columns of the tokens it decoded: both delete by this one rule.
func certifiedSQL(form string, f tokenFields) string {
	legacy := "(c.changed_at, c.id) <= (" + f.ts + ", " + f.id + ")"
	seen := "c.txid IS NULL OR pg_visible_in_snapshot(c.txid, " + f.base + ")"
	switch form {
	case FormLegacy:
		return legacy
	case FormSwitchover:
		return "(" + legacy + " AND (" + seen + "))"
	case FormSnapshot:
		return "(" + seen + ")"
	}
	return "(" + seen + " OR (pg_visible_in_snapshot(c.txid, " + f.end + ") AND c.id <= " + f.id + "))"
}

// CertifiedByTokenSQL is certifiedSQL for a token t of the SQL retention function
// (schema/prune.sql), whatever its form: the columns form, ts, id, base and fin (its delta's end).
// A token of no known form certifies nothing (NULL).
func CertifiedByTokenSQL() string {
	f := tokenFields{ts: "t.ts", id: "t.id", base: "t.base", end: "t.fin"}
	var b strings.Builder
	b.WriteString("CASE t.form")
	for _, form := range []string{FormLegacy, FormSwitchover, FormSnapshot, FormInRows} {
		b.WriteString("\n            WHEN '" + form + "' THEN " + certifiedSQL(form, f))
	}
	b.WriteString(" END")
	return b.String()
}

// NotCertifiedBy returns the SQL predicate, on changelog row c, of the rows a saved token at p
// has not passed, with a bound an index can serve: a legacy position's, or the base snapshot's
// xmin, below which every transaction is visible.
func NotCertifiedBy(p Position, arg func(any) string) string {
	var bound string
	if p.InDelta() {
		bound = "c.txid >= " + arg(strconv.FormatUint(p.Span.Base.Xmin, 10)) + "::xid8"
	} else {
		bound = "(c.changed_at, c.id) > (" + arg(p.ChangedAt) + "::timestamptz, " + arg(p.ID) + "::bigint)"
		if p.Span != nil { // the switch-over's legacy part: rows it does not see are ahead too
			bound = "(" + bound + " OR NOT pg_visible_in_snapshot(c.txid, " + arg(p.Span.Base.String()) + "::pg_snapshot))"
		}
	}
	return bound + " AND NOT " + CertifiedBy(p, arg)
}
