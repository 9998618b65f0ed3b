package changelog

import (
	"strconv"

	"github.com/pgchangestream/pgchangestream/internal/position"
)

// CertifiedBy returns the SQL predicate, on changelog row c, of the rows a saved token at p has
// passed (see Certified); arg adds a parameter and returns its placeholder.
func CertifiedBy(p position.Position, arg func(any) string) string {
	var (
		f    TokenFields
		form string
	)
	switch { // the parameters in the order the predicate names them
	case p.Span == nil || !p.InDelta():
		form = FormLegacy
		f.TS, f.ID = arg(p.ChangedAt)+"::timestamptz", arg(p.ID)+"::bigint"
		if p.Span != nil {
			form, f.Base = FormSwitchover, arg(p.Span.Base.String())+"::pg_snapshot"
		}
	case !p.InRows:
		form, f.Base = FormSnapshot, arg(p.Span.Base.String())+"::pg_snapshot"
	default:
		form, f.Base = FormInRows, arg(p.Span.Base.String())+"::pg_snapshot"
		f.End, f.ID = arg(p.Span.End.String())+"::pg_snapshot", arg(p.ID)+"::bigint"
	}
	return Certified(form, f)
}

// NotCertifiedBy returns the SQL predicate, on changelog row c, of the rows a saved token at p
// has not passed, with a bound an index can serve: a legacy position's, or the base snapshot's
// xmin, below which every transaction is visible.
func NotCertifiedBy(p position.Position, arg func(any) string) string {
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
