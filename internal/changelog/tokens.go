package changelog

// The statements on the token table that the watcher and the admin package both run.

const (
	// FenceCondition is the condition that fences a statement on the token row (alias tok) to
	// the owner epoch $3.
	FenceCondition = `tok.` + EpochColumn + ` = $3`
)

// LockForUpdate is a sub-select that locks the token row of client (a placeholder) FOR UPDATE:
// the lock that waits for the transactional acknowledgements in flight, which hold the row FOR
// KEY SHARE (see the root's ackrows.go), while the saves' own updates do not.
func LockForUpdate(tok, client string) string {
	return `SELECT client_name FROM ` + tok + ` WHERE client_name = ` + client + ` FOR UPDATE`
}

// SaveTokenSQL is the statement that saves token $2 of client $1: an upsert, or, fenced, an
// update of the row only while its owner epoch is still $3 (see FenceCondition). Given the
// incarnation subquery, it writes only while the server's incarnation is still its last
// parameter ($3, or $4 fenced).
func SaveTokenSQL(tokenTable string, fenced bool, incarnation string) string {
	if fenced {
		q := `UPDATE ` + tokenTable + ` AS tok SET resume_token = $2::jsonb, last_updated = now()
	WHERE tok.client_name = $1 AND ` + FenceCondition
		if incarnation != "" {
			q += ` AND ` + incarnation + ` = $4`
		}
		return q
	}
	values := `VALUES ($1, $2::jsonb, now())`
	if incarnation != "" {
		values = `SELECT $1, $2::jsonb, now() WHERE ` + incarnation + ` = $3`
	}
	return `INSERT INTO ` + tokenTable + ` (client_name, resume_token, last_updated) ` + values + `
	ON CONFLICT (client_name) DO UPDATE SET resume_token = EXCLUDED.resume_token, last_updated = EXCLUDED.last_updated`
}

// LoadTokenSQL reads the saved token of client $1 from the token table tok (quoted).
func LoadTokenSQL(tok string) string {
	return `SELECT resume_token::text FROM ` + tok + ` WHERE client_name = $1`
}

// NewestRowSQL reads the changed_at and id of the newest row of table $1 in changelog cl
// (quoted): the start position of a client without a saved token.
func NewestRowSQL(cl string) string {
	return `SELECT changed_at, id FROM ` + cl + ` WHERE table_name = $1 ORDER BY changed_at DESC, id DESC LIMIT 1`
}

// RowTimeSQL reads the changed_at of the row with id $1 in changelog cl (quoted): the time of
// an id-only saved token's row.
func RowTimeSQL(cl string) string {
	return `SELECT changed_at FROM ` + cl + ` WHERE id = $1`
}

// EpochColumnSQL reads whether the token table $1 (quoted) has the EpochColumn.
const EpochColumnSQL = `SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass($1)
		AND attname = '` + EpochColumn + `' AND NOT attisdropped)`

// BumpEpochSQL moves the owner epoch of client $1 on in token table tok (quoted), once the
// transactional acknowledgements in flight finished (LockForUpdate), if the row has one.
func BumpEpochSQL(tok string) string {
	return `UPDATE ` + tok + ` SET ` + EpochColumn + ` = ` + EpochColumn + ` + 1 WHERE client_name = $1 AND ` +
		EpochColumn + ` IS NOT NULL AND client_name IN (` + LockForUpdate(tok, "$1") + `)`
}
