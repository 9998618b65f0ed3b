package pgchangestream

import (
	"database/sql"
	"strconv"
)

// queries holds the watcher's SQL, with the configured identifiers quoted once.
type queries struct {
	// read: the next batch after a position. The row comparison lets PostgreSQL seek the
	// (table_name, changed_at, id) index to the position instead of filtering earlier entries.
	read string
	// byID: one row, for late rows named by NOTIFY.
	byID string
	// newest: the start position of a client without a saved token.
	newest string
	// rowTime: the changed_at of an id-only saved token's row.
	rowTime string
	// loadToken, saveToken: the saved token. save also marks the legacy processed flag in the
	// same statement (one round trip, one commit) unless disabled: the rows of the table at or
	// before the saved position, exactly the rows the checkpoint certifies. The position
	// comparison is served by the partial index on unprocessed rows, so a save touches only
	// the rows it marks; an "id <=" predicate would scan every unprocessed row of the table per
	// save, and would mark rows with lower ids whose positions are still pending.
	loadToken, saveToken, save string
	// unprocessed: GetUnprocessedEventCount.
	unprocessed string
}

const changelogColumns = `id, record_id::text, operation, old_values::text, new_values::text, changed_at`

func buildQueries(cfg Config) queries {
	cl := quoteIdentifier(cfg.ChangelogTable)
	tok := quoteIdentifier(cfg.TokenTable)
	upsert := `INSERT INTO ` + tok + ` (client_name, resume_token, last_updated) VALUES ($1, $2::jsonb, now())
	ON CONFLICT (client_name) DO UPDATE SET resume_token = EXCLUDED.resume_token, last_updated = EXCLUDED.last_updated`
	q := queries{
		read: `SELECT ` + changelogColumns + ` FROM ` + cl + `
	WHERE table_name = $1 AND (changed_at, id) > ($2, $3)
	ORDER BY changed_at, id LIMIT ` + strconv.Itoa(cfg.BatchSize),
		byID:      `SELECT ` + changelogColumns + ` FROM ` + cl + ` WHERE table_name = $1 AND id = $2`,
		newest:    `SELECT changed_at, id FROM ` + cl + ` WHERE table_name = $1 ORDER BY changed_at DESC, id DESC LIMIT 1`,
		rowTime:   `SELECT changed_at FROM ` + cl + ` WHERE id = $1`,
		loadToken: `SELECT resume_token::text FROM ` + tok + ` WHERE client_name = $1`,
		saveToken: upsert,
		save: `WITH token AS (` + upsert + `)
	UPDATE ` + cl + ` SET processed = TRUE WHERE table_name = $3 AND (changed_at, id) <= ($4, $5) AND processed = FALSE`,
		unprocessed: `SELECT count(*) FROM ` + cl + ` WHERE table_name = $1 AND id > $2 AND processed = FALSE`,
	}
	if cfg.DisableProcessedFlag {
		q.save = q.saveToken
		q.unprocessed = `SELECT count(*) FROM ` + cl + ` WHERE table_name = $1 AND id > $2`
	}
	return q
}

// scanRows reads changelog rows into buf and closes rows.
func scanRows(rows *sql.Rows, buf []changelogRow) ([]changelogRow, error) {
	defer rows.Close()
	for rows.Next() {
		var (
			r        changelogRow
			old, new sql.RawBytes
		)
		if err := rows.Scan(&r.ID, &r.RecordID, &r.Operation, &old, &new, &r.ChangedAt); err != nil {
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
