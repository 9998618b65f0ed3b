package pgchangestream

import (
	"database/sql"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// statements returns the watcher's statements for cfg (defaults filled in).
func statements(cfg Config) changelog.Statements {
	return changelog.NewStatements(changelog.StatementParams{ChangelogTable: cfg.ChangelogTable,
		TokenTable: cfg.TokenTable, BatchSize: cfg.BatchSize, MarksProcessed: cfg.marksProcessed()})
}

// rowColumns says which columns a read returns after the changelog columns: the txid column
// (delta reads) and the unit (the reads of Shared members), in that order.
type rowColumns struct{ xid, unit bool }

// columnsOf returns the columns of the reads rq: with the txid column or not.
func columnsOf(rq *changelog.Reads, xid bool) rowColumns { return rowColumns{xid: xid, unit: rq.Unit} }

// scanRows reads changelog rows, with the columns cols, into buf and closes rows.
func scanRows(rows *sql.Rows, buf []changelogRow, cols rowColumns) ([]changelogRow, error) {
	defer rows.Close()
	dest := make([]any, 0, 8)
	for rows.Next() {
		var (
			r        changelogRow
			old, new sql.RawBytes
		)
		dest = append(dest[:0], &r.ID, &r.RecordID, &r.Operation, &old, &new, &r.ChangedAt)
		if cols.xid {
			dest = append(dest, &r.Xid)
		}
		if cols.unit {
			dest = append(dest, &r.Unit)
		}
		if err := rows.Scan(dest...); err != nil {
			return buf, err
		}
		r.OldValues = cloneOrNil(old)
		r.NewValues = cloneOrNil(new)
		buf = append(buf, r)
	}
	return buf, rows.Err()
}

// cloneOrNil copies a column's bytes (RawBytes is only valid until the next row); NULL stays nil.
func cloneOrNil(b sql.RawBytes) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}
