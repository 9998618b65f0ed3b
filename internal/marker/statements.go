package marker

import (
	"strconv"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// Statements are the marker's SQL statements for one changelog, built once by NewStatements.
type Statements struct {
	// Legacy, Phase, Delta, Switch and InDelta select the ids of the rows newly certified since
	// the rows last marked, whose legacy processed flag a pass then sets with MarkIDs. Legacy
	// selects table $1's legacy positions in ($2, $3) .. ($4, $5); Phase, in the legacy part of a
	// switch-over, only those that snapshot $6 sees or that have no txid. Delta selects the rows
	// in the (txid, id) index ranges $2..$5 that the saved position certifies: those snapshot $6
	// sees, and those snapshot $7 sees with an id up to $8. Switch is Delta after the legacy part
	// of a switch-over ended: it also selects the rest of that part, the legacy positions after
	// ($9, $10) that snapshot $6 sees. InDelta, when the saved position moved on inside a delta,
	// selects the rows with an id above $2 and up to $3 that the delta's end snapshot $4 sees, by
	// primary key. Only the range index (or the primary key) can serve them: they have no
	// "processed" predicate, which the partial unprocessed index would match (a generic plan of a
	// cached statement would otherwise read every unprocessed row from the range's changed_at
	// on). So marking costs about what it certifies.
	Legacy, Phase, Delta, Switch, InDelta string
	// CatchUp begins the selection of a page of the catch-up after a load: the ids and
	// changed_at of table $1's rows not flagged, after the legacy key ($2, $3), that the loaded
	// position certifies (the predicate changelog.CertifiedBy appends, from $4 on), in
	// (changed_at, id) order. The "processed = FALSE" predicate lets the partial unprocessed
	// indexes serve it (the existing schema's (table_name, changed_at, id), or schema.Install's
	// (changed_at)), so it reads the table's rows not flagged, not the whole changelog.
	CatchUp string
	// MarkIDs sets the processed flag of the rows with the ids $1 (an int8 array) that do not
	// have it, by primary key.
	MarkIDs string
}

// NewStatements builds the statements of the marker of changelog table cl (not quoted).
func NewStatements(cl string) Statements {
	cl = changelog.Quote(cl)
	seesOrOld := `(txid IS NULL OR pg_visible_in_snapshot(txid, $6::pg_snapshot))`
	legacyIDs := func(after, cond string) string {
		return `SELECT id FROM ` + cl + ` WHERE table_name = $1 AND (changed_at, id) > ` + after + cond + `
		ORDER BY changed_at, id`
	}
	upTo := ` AND (changed_at, id) <= ($4, $5)`
	deltaIDs := `SELECT c.id FROM unnest($2::xid8[], $3::int8[], $4::xid8[], $5::int8[]) AS r(lo, lo_id, hi, hi_id)
		CROSS JOIN LATERAL (SELECT id FROM ` + cl + ` WHERE table_name = $1
			AND (txid, id) > (r.lo, r.lo_id) AND (txid, id) <= (r.hi, r.hi_id)
			AND (pg_visible_in_snapshot(txid, $6::pg_snapshot)
				OR (pg_visible_in_snapshot(txid, $7::pg_snapshot) AND id <= $8))) c`
	return Statements{
		Legacy: legacyIDs(`($2, $3)`, upTo),
		Phase:  legacyIDs(`($2, $3)`, upTo+` AND `+seesOrOld),
		Delta:  deltaIDs,
		Switch: `(` + legacyIDs(`($9, $10)`, ` AND `+seesOrOld) + `)
	UNION ALL ` + deltaIDs,
		InDelta: `SELECT id FROM ` + cl + ` WHERE id > $2 AND id <= $3 AND table_name = $1
			AND pg_visible_in_snapshot(txid, $4::pg_snapshot)`,
		CatchUp: `SELECT c.id, c.changed_at FROM ` + cl + ` c WHERE c.table_name = $1 AND c.processed = FALSE
	AND (c.changed_at, c.id) > ($2::timestamptz, $3::bigint) AND `,
		MarkIDs: `UPDATE ` + cl + ` SET processed = TRUE WHERE id = ANY($1::int8[]) AND processed = FALSE`,
	}
}

// MarkStatement returns the statement, and its arguments, that selects the rows of table that
// p certifies and prev, an earlier saved position of the same watcher, does not.
func (s Statements) MarkStatement(table string, prev, p position.Position) (string, []any) {
	switch {
	case p.Span == nil:
		return s.Legacy, []any{table, prev.ChangedAt, prev.ID, p.ChangedAt, p.ID}
	case !p.InDelta():
		return s.Phase, []any{table, prev.ChangedAt, prev.ID, p.ChangedAt, p.ID, p.Span.Base.String()}
	case CertifiedByID(prev, p):
		return s.InDelta, []any{table, prev.ID, p.ID, p.Span.End.String()}
	}
	q, from := s.Delta, prev
	if !prev.InDelta() { // the legacy part of the switch-over ended since
		// A legacy prev has no switch-over snapshot (the pass gives it one): p's base, which
		// sees no less, marks only rows p certifies, and may leave some of the rest unmarked.
		base := p.Span.Base
		if prev.Span != nil {
			base = prev.Span.Base
		}
		q, from = s.Switch, position.Position{Span: &position.Span{Seq: 1, Base: base}}
	}
	lo, loID, hi, hiID := changelog.RangeArrays(CertifyRanges(from, p))
	args := []any{table, lo, loID, hi, hiID, p.Span.Base.String(), p.Top().String(), p.ID}
	if q == s.Switch {
		args = append(args, prev.ChangedAt, prev.ID)
	}
	return q, args
}

// CatchUpStatement returns the statement, and its arguments, that selects the next page of the
// catch-up of table after the legacy key of after: rows that loaded and saved both certify.
func (s Statements) CatchUpStatement(table string, loaded, saved, after position.Position) (string, changelog.Params) {
	args := changelog.Params{table, after.ChangedAt, after.ID}
	return s.CatchUp + changelog.CertifiedBy(loaded, args.Add) + "\n\tAND " + changelog.CertifiedBy(saved, args.Add) +
		"\n\tORDER BY c.changed_at, c.id LIMIT " + strconv.Itoa(CatchUpPage), args
}

// CertifyRanges returns the (txid, id) index ranges holding the rows that delta position p
// certifies and prev, an earlier delta position, does not: the rows visible in p's top snapshot
// and not in prev's base. They may hold rows p does not certify (the save filters them out).
// When prev is past some rows of p's own delta, the rows between them are found by id instead
// (CertifiedByID).
func CertifyRanges(prev, p position.Position) []position.KeyRange {
	return position.DeltaRanges(prev.Span.Base, p.Top())
}

// CertifiedByID reports whether the rows p certifies and prev does not are the rows of p's
// delta with ids from prev's (excluded) to p's: both are past rows of the same delta.
func CertifiedByID(prev, p position.Position) bool {
	return prev.InRows && p.InRows && prev.Span.Seq == p.Span.Seq
}
