package changelog

import (
	"strconv"

	"github.com/pgchangestream/pgchangestream/internal/lock"
)

// MaxDeltaIDs bounds the ids of a large delta kept in memory (8 bytes each): a larger delta is
// listed again, after the last id passed, each time its list is used up.
const MaxDeltaIDs = 1 << 20

// Statements are the watcher's SQL, with the configured identifiers quoted once, built by
// NewStatements.
type Statements struct {
	Reads
	// Snapshot: the current snapshot, the end of the next delta. SnapshotInc adds the
	// server's incarnation (NULL while its row is missing).
	Snapshot, SnapshotInc string
	// Detect: whether the changelog ($1, quoted) has the txid column with its default, on
	// PostgreSQL 13 or later, whether the incarnation table ($2, quoted) exists, and whether the
	// changelog has statistics (the root's delta.go). StatsExist: the last alone.
	Detect, StatsExist string
	// DeltaStart: the current snapshot and the highest txid stored for the table, checked at
	// Start against each other and against the saved token. DeltaStartInc adds the
	// incarnation.
	DeltaStart, DeltaStartInc string
	// ClaimIncarnation inserts the incarnation row if it is missing (after a crash).
	ClaimIncarnation string
	// SaveTokenInc and SaveFencedInc are SaveToken and SaveFenced for a position read in the
	// server incarnation given as their last parameter: they write nothing (no row affected)
	// if the incarnation changed since, so that a position read before a crash is never saved
	// after it. IncarnationIs tells whether the incarnation is still $1, for a fenced save that
	// wrote nothing.
	SaveTokenInc, SaveFencedInc, IncarnationIs string
	// ByID: one row, for late rows named by NOTIFY (legacy changelogs). The id is looked up in
	// a subquery the table_name condition cannot enter (OFFSET 0), so that only the primary key
	// serves it: with table_name in the same scan, statistics that have not seen the table yet
	// (a burst of its first rows) make an index on (table_name, ...) look cheaper, and that
	// scan reads every entry of the table.
	ByID string
	// Newest: the start position of a client without a saved token.
	Newest string
	// SwitchCut: the txid a switch-over's snapshot $6 is cut below (NULL: none), so that the
	// rows with a txid after the legacy position ($2, $3) are read in deltas: the lowest txid
	// of them that $6 sees above every txid $6 sees of a row at or before the legacy position
	// ($4, $5), looked for only when $7 (a position with rows before it). Both scans follow
	// the (table_name, txid, id) index (see switchSnapshot).
	SwitchCut string
	// RowTime: the changed_at of an id-only saved token's row.
	RowTime string
	// LoadToken, SaveToken: the saved token. SaveFenced: SaveToken of an exclusive watcher,
	// only while the row's owner_epoch is still its own ($3): see load.go.
	LoadToken, SaveToken, SaveFenced string
	// AckSave and AckTx save a token that carries the acknowledgement marker (txack.go): the
	// watcher's own saves once it acknowledged in a caller's transaction, and MarkProcessedTx's
	// write in that transaction. Indexed by AckIndex; the parameters are those of SaveToken,
	// SaveTokenInc, SaveFenced and SaveFencedInc. AckSave does not wait for a row lock. ReadAck:
	// the stored token's marker.
	AckSave, AckTx [4]string
	ReadAck        string
	// EpochColumn: whether the token table ($1, quoted) has the owner_epoch column.
	// ClaimEpoch: on the lock session, when it holds the lock (classid $2, objid $3), the
	// client's next owner epoch and its saved token; ClaimNew: the same for a client without a
	// token row, inserting its start token ($2) with epoch 1 (lock: $3, $4). BumpEpoch: what
	// token reset runs, fencing off every earlier owner.
	EpochColumn, ClaimEpoch, ClaimNew, BumpEpoch string
	// ClaimAck and ClaimAckFenced insert, in a transactional handler's transaction, the
	// acknowledgement row of client $1's event $2, unless one exists; the fenced form only while
	// the token row holds owner epoch $3, which it locks FOR KEY SHARE (see ackrows.go). Both
	// set the transaction's idle_in_transaction_session_timeout (the last parameter, in ms) in
	// the same round trip.
	// EpochOf: the token row's owner epoch. CompactAcks deletes client $1's acknowledgement rows
	// whose changelog row is gone or certified by the condition that follows it, except those of
	// the client's parked events (a rerun must find them).
	// CompactFence, followed by the owner epoch's placeholder, fences CompactAcks.
	ClaimAck, ClaimAckFenced, EpochOf, CompactAcks, CompactFence string
	// ParkFence fences the insert of client $1's parked event (deadletter.Store.Insert) to the
	// owner epoch $9, locking the token row FOR KEY SHARE.
	ParkFence string
	// Unprocessed: GetUnprocessedEventCount.
	Unprocessed string
}

// Reads are the reads of changelog rows. A Shared member's read only the units of its ranges
// (NewReads with a UnitReads) and return each row's unit as their last column (Unit).
type Reads struct {
	// Read: the next batch after a legacy position. The row comparison lets PostgreSQL seek
	// the (table_name, changed_at, id) index to the position instead of filtering earlier
	// entries.
	Read string
	// SwitchRead: read in the legacy part of a switch-over: the same, limited to the rows the
	// switch-over's snapshot ($4) sees or that were written before the upgrade.
	SwitchRead string
	// DeltaRead: the first page of a snapshot delta: the rows its end snapshot ($6) sees in the
	// (txid, id) index ranges given as arrays (lower keys $2, $3; upper keys $4, $5) with an id
	// above $7, in (txid, id) order, at most one more than a batch (the reader sorts them by
	// id; one more says the delta does not fit a batch). Each range is its own index range scan
	// (an "= ANY" list is not), which stops at the limit.
	DeltaRead string
	// DeltaRange: DeltaRead for a delta read as one range (the common case: no transaction of
	// the base snapshot ended), with its keys as scalars: one index range scan, whose order
	// is the result's, with no sort.
	DeltaRange string
	// DeltaIDs: the ids of a delta larger than a batch, after $7, in id order, at most
	// MaxDeltaIDs: the rows of DeltaRead's ranges, each read whole in its index order (so that
	// only its index range can serve it), then sorted by id.
	DeltaIDs string
	// DeltaRows: the rows of a listed delta with the ids $1, by primary key, in id order.
	// DeltaKeyRange: the same for a page of consecutive ids, every id from $1 to $2.
	// DeltaSpan (Shared members only): the rows of the member's units with ids from $1 to $2.
	DeltaRows, DeltaKeyRange, DeltaSpan string
	// Unit: the rows end with their unit.
	Unit bool
}

// ChangelogColumns are the columns of a changelog row as the watcher scans it.
const ChangelogColumns = `id, record_id::text, operation, old_values::text, new_values::text, changed_at`

// StatementParams are what the watcher's statements depend on.
type StatementParams struct {
	ChangelogTable, TokenTable string // not quoted
	BatchSize                  int    // rows of one read
	// MarksProcessed: the watcher sets the legacy processed flag, and Unprocessed counts the
	// rows without it.
	MarksProcessed bool
}

// NewStatements builds the watcher's statements for p.
func NewStatements(p StatementParams) Statements {
	cl := Quote(p.ChangelogTable)
	tok := Quote(p.TokenTable)
	limit := strconv.Itoa(p.BatchSize)
	inc := Quote(IncarnationTable(p.ChangelogTable))
	acks := Quote(AckTable(p.ChangelogTable))
	incarnation := IncarnationSQL(p.ChangelogTable)
	pageLimit := strconv.Itoa(p.BatchSize + 1)
	newestTxid := `(SELECT c.txid::text AS newest_txid FROM ` + cl + ` c
		WHERE c.table_name = $1 AND c.txid IS NOT NULL ORDER BY c.txid DESC LIMIT 1)`
	q := Statements{
		Reads:       NewReads(cl, limit, pageLimit, nil),
		Snapshot:    `SELECT pg_current_snapshot()::text`,
		SnapshotInc: `SELECT pg_current_snapshot()::text, ` + incarnation,
		Detect: `SELECT current_setting('server_version_num')::int >= 130000 AND EXISTS (
		SELECT FROM pg_attribute a JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attrelid = to_regclass($1) AND a.attname = '` + TxidColumn + `' AND NOT a.attisdropped
			AND format_type(a.atttypid, NULL) = 'xid8' AND pg_get_expr(d.adbin, d.adrelid) = 'pg_current_xact_id()'),
		to_regclass($2) IS NOT NULL, ` + StatsExistSQL("$1"),
		StatsExist:       `SELECT ` + StatsExistSQL("$1"),
		DeltaStart:       `SELECT pg_current_snapshot()::text, ` + newestTxid,
		DeltaStartInc:    `SELECT pg_current_snapshot()::text, ` + newestTxid + `, ` + incarnation,
		ClaimIncarnation: `INSERT INTO ` + inc + ` DEFAULT VALUES ON CONFLICT DO NOTHING`,
		SaveTokenInc:     SaveTokenSQL(tok, false, incarnation),
		SaveFencedInc:    SaveTokenSQL(tok, true, incarnation),
		IncarnationIs:    `SELECT COALESCE(` + incarnation + ` = $1, false)`,
		ByID:             `SELECT ` + ChangelogColumns + ` FROM (SELECT * FROM ` + cl + ` WHERE id = $2 OFFSET 0) c WHERE table_name = $1`,
		Newest:           NewestRowSQL(cl),
		RowTime:          RowTimeSQL(cl),
		LoadToken:        LoadTokenSQL(tok),
		SaveToken:        SaveTokenSQL(tok, false, ""),
		SaveFenced:       SaveTokenSQL(tok, true, ""),
		EpochColumn:      EpochColumnSQL,
		SwitchCut: `SELECT (SELECT c.txid FROM ` + cl + ` c WHERE c.table_name = $1 AND c.txid > COALESCE(CASE WHEN $7 THEN
		(SELECT b.txid FROM ` + cl + ` b WHERE b.table_name = $1 AND b.txid IS NOT NULL AND (b.changed_at, b.id) <= ($4, $5)
			AND pg_visible_in_snapshot(b.txid, $6::pg_snapshot) ORDER BY b.txid DESC LIMIT 1) END, '0'::xid8)
	AND (c.changed_at, c.id) > ($2, $3) AND pg_visible_in_snapshot(c.txid, $6::pg_snapshot) ORDER BY c.txid LIMIT 1)::text`,
		ClaimEpoch: `WITH held AS (SELECT ` + lock.HeldBySessionSQL("$2", "$3") + ` AS held),
	claimed AS (UPDATE ` + tok + ` AS tok SET ` + EpochColumn + ` = COALESCE(tok.` + EpochColumn + `, 0) + 1 FROM held
		WHERE held.held AND tok.client_name = $1 AND tok.client_name IN (` + LockForUpdate(tok, "$1") + `)
		RETURNING tok.` + EpochColumn + `, tok.resume_token::text AS token)
	SELECT held.held, claimed.` + EpochColumn + `, claimed.token FROM held LEFT JOIN claimed ON true`,
		ClaimNew: `INSERT INTO ` + tok + ` (client_name, resume_token, last_updated, ` + EpochColumn + `)
	SELECT $1, $2::jsonb, now(), 1 WHERE ` + lock.HeldBySessionSQL("$3", "$4") + `
	ON CONFLICT (client_name) DO NOTHING RETURNING ` + EpochColumn,
		ClaimAck: `INSERT INTO ` + acks + ` (client_name, changelog_id) SELECT $1::varchar, $2::bigint
	FROM (SELECT set_config('idle_in_transaction_session_timeout', $3, true)) AS idle ON CONFLICT DO NOTHING`,
		ClaimAckFenced: `INSERT INTO ` + acks + ` (client_name, changelog_id) SELECT tok.client_name, $2 FROM ` + tok + ` AS tok,
	(SELECT set_config('idle_in_transaction_session_timeout', $4, true)) AS idle
	WHERE tok.client_name = $1 AND ` + FenceCondition + ` FOR KEY SHARE OF tok ON CONFLICT DO NOTHING`,
		EpochOf:   `SELECT ` + EpochColumn + ` FROM ` + tok + ` WHERE client_name = $1`,
		ParkFence: ` FROM ` + tok + ` AS tok WHERE tok.client_name = $1 AND tok.` + EpochColumn + ` = $9 FOR KEY SHARE OF tok`,
		CompactAcks: `DELETE FROM ` + acks + ` AS a WHERE a.client_name = $1 AND NOT EXISTS (
	SELECT FROM ` + Quote(ParkedTable(p.ChangelogTable)) + ` p WHERE p.client_name = a.client_name AND p.changelog_id = a.changelog_id)
	AND NOT EXISTS (SELECT FROM ` + cl + ` c WHERE c.id = a.changelog_id AND NOT `,
		CompactFence: ` AND EXISTS (SELECT FROM ` + tok + ` AS tok WHERE tok.client_name = $1 AND tok.` + EpochColumn + ` = `,
		BumpEpoch:    BumpEpochSQL(tok),
		Unprocessed:  `SELECT count(*) FROM ` + cl + ` WHERE table_name = $1 AND id > $2 AND processed = FALSE`,
		ReadAck:      `SELECT resume_token->'ack'->>'w', resume_token->'ack'->>'seq' FROM ` + tok + ` WHERE client_name = $1`,
	}
	for i := range q.AckSave {
		fenced, withInc := ackIndexParts(i)
		var incQ string
		if withInc {
			incQ = incarnation
		}
		q.AckSave[i] = ackSaveSQL(tok, fenced, incQ, true)
		q.AckTx[i] = ackSaveSQL(tok, fenced, incQ, false)
	}
	if !p.MarksProcessed {
		q.Unprocessed = `SELECT count(*) FROM ` + cl + ` WHERE table_name = $1 AND id > $2`
	}
	return q
}

// IncarnationSQL is the subquery of the server's incarnation (NULL while its row is missing)
// for changelog table cl (not quoted).
func IncarnationSQL(cl string) string {
	return `(SELECT incarnation::text FROM ` + Quote(IncarnationTable(cl)) + `)`
}

// UnitReads is the unit part of a Shared member's reads: the condition on the units its reads
// ask for, and the unit expression.
type UnitReads struct{ Cond, Expr string }

// NewReads builds the row reads of changelog cl (quoted), limit and pageLimit rows at a time.
// A Shared member's reads (u not nil) add u.Cond, a condition on the unit expression inside
// each scan, where the index checks it, and return the rows' units as their last column.
func NewReads(cl, limit, pageLimit string, u *UnitReads) Reads {
	sel, withXid := ChangelogColumns, ChangelogColumns+`, txid`
	delta := `c.id, c.record_id::text, c.operation, c.old_values::text, c.new_values::text, c.changed_at, c.txid`
	var cond string
	if u != nil { // the unit last, after the txid column (the watcher's scanRows)
		sel += `, ` + u.Expr
		withXid += `, ` + u.Expr
		delta += `, ` + u.Expr // the inner scan's columns: unambiguous
		cond = u.Cond
	}
	q := Reads{
		Read: `SELECT ` + ChangelogColumns + ` FROM ` + cl + `
	WHERE table_name = $1 AND (changed_at, id) > ($2, $3)
	ORDER BY changed_at, id LIMIT ` + limit,
		SwitchRead: `SELECT ` + sel + ` FROM ` + cl + `
	WHERE table_name = $1` + cond + ` AND (changed_at, id) > ($2, $3) AND (txid IS NULL OR pg_visible_in_snapshot(txid, $4::pg_snapshot))
	ORDER BY changed_at, id LIMIT ` + limit,
		DeltaRead: `SELECT ` + delta + `
	FROM unnest($2::xid8[], $3::int8[], $4::xid8[], $5::int8[]) AS r(lo, lo_id, hi, hi_id)
	CROSS JOIN LATERAL (SELECT * FROM ` + cl + ` WHERE table_name = $1
		AND (txid, id) > (r.lo, r.lo_id) AND (txid, id) <= (r.hi, r.hi_id)` + cond + ` AND pg_visible_in_snapshot(txid, $6::pg_snapshot) AND id > $7
		ORDER BY txid, id LIMIT ` + pageLimit + `) c
	ORDER BY c.txid, c.id LIMIT ` + pageLimit,
		DeltaRange: `SELECT ` + withXid + ` FROM ` + cl + `
	WHERE table_name = $1 AND (txid, id) > ($2::xid8, $3) AND (txid, id) <= ($4::xid8, $5)` + cond + ` AND pg_visible_in_snapshot(txid, $6::pg_snapshot) AND id > $7
	ORDER BY txid, id LIMIT ` + pageLimit,
		DeltaRows:     `SELECT ` + withXid + ` FROM ` + cl + ` WHERE id = ANY($1::int8[]) ORDER BY id`,
		DeltaKeyRange: `SELECT ` + withXid + ` FROM ` + cl + ` WHERE id BETWEEN $1 AND $2 ORDER BY id`,
		DeltaIDs: `SELECT c.id FROM unnest($2::xid8[], $3::int8[], $4::xid8[], $5::int8[]) AS r(lo, lo_id, hi, hi_id)
	CROSS JOIN LATERAL (SELECT id FROM ` + cl + ` WHERE table_name = $1
		AND (txid, id) > (r.lo, r.lo_id) AND (txid, id) <= (r.hi, r.hi_id)` + cond + ` AND pg_visible_in_snapshot(txid, $6::pg_snapshot) AND id > $7
		ORDER BY txid, id) c
	ORDER BY c.id LIMIT ` + strconv.Itoa(MaxDeltaIDs),
		Unit: u != nil,
	}
	if u != nil {
		q.DeltaSpan = `SELECT ` + withXid + ` FROM ` + cl + ` WHERE id BETWEEN $1 AND $2` + u.Cond + ` ORDER BY id`
	}
	return q
}

// ackSaveSQL is the statement that saves a marked token $2 of client $1: an update of the row
// (fenced: only while its owner epoch is $3; given the incarnation subquery, only while the
// server's incarnation is still the last parameter) that writes nothing over a marker of the
// same watcher with a higher seq. With nowait it fails at once when the row is locked.
func ackSaveSQL(tokenTable string, fenced bool, incarnation string, nowait bool) string {
	q := `UPDATE ` + tokenTable + ` AS tok SET resume_token = $2::jsonb, last_updated = now()
	WHERE tok.client_name = $1`
	n := 3
	if fenced {
		q += ` AND ` + FenceCondition
		n++
	}
	if incarnation != "" {
		q += ` AND ` + incarnation + ` = $` + strconv.Itoa(n)
	}
	q += `
	AND NOT COALESCE(tok.resume_token->'ack'->>'w' = $2::jsonb->'ack'->>'w'
		AND (tok.resume_token->'ack'->>'seq')::numeric > ($2::jsonb->'ack'->>'seq')::numeric, false)`
	if nowait {
		q += `
	AND EXISTS (SELECT FROM ` + tokenTable + ` AS l WHERE l.client_name = $1 FOR UPDATE NOWAIT)`
	}
	return q
}

// AckIndex is the index in Statements.AckSave and AckTx of a fenced save and of one
// conditioned on an incarnation; ackIndexParts is its inverse.
func AckIndex(fenced bool, inc string) int {
	i := 0
	if fenced {
		i |= 1
	}
	if inc != "" {
		i |= 2
	}
	return i
}

func ackIndexParts(i int) (fenced, withInc bool) { return i&1 != 0, i&2 != 0 }

// StatsExistSQL is the condition that the changelog (the parameter p, quoted) has statistics:
// those of its table_name column, which every read's estimate starts from.
func StatsExistSQL(p string) string {
	return `EXISTS (SELECT FROM pg_catalog.pg_stats s
		JOIN pg_catalog.pg_namespace n ON n.nspname = s.schemaname
		JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = s.tablename
		WHERE c.oid = to_regclass(` + p + `) AND s.attname = 'table_name')`
}

// TableCheckSQL asks whether the changelog cl (not quoted) has a row of table $1, or a table
// named $1 has a trigger. The first part is one probe of the (table_name, changed_at, id) index.
func TableCheckSQL(cl string) string {
	return `SELECT EXISTS (SELECT 1 FROM ` + Quote(cl) + ` WHERE table_name = $1)
	OR EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
		WHERE c.relname = $1 AND NOT t.tgisinternal)`
}
