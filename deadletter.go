package pgchangestream

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/pgchangestream/pgchangestream/admin"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/document"
	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

// sqlParkedStore is the dead-letter table of one client: "<changelog>_parked", created by
// schema.Install.
type sqlParkedStore struct {
	db     *sql.DB
	table  string // quoted
	name   string // for messages
	client string
}

var _ parkedStore = (*sqlParkedStore)(nil)

// newParkedStore returns the dead-letter store of client beside the changelog log.
func newParkedStore(db *sql.DB, log, client string) *sqlParkedStore {
	name := changelog.ParkedTable(log)
	return &sqlParkedStore{db: db, table: changelog.Quote(name), name: name, client: client}
}

// parkedStore returns the dead-letter table of the watcher's client, its parks fenced as the
// watcher's saves are (fencedParks).
func (w *Watcher) parkedStore() parkedStore {
	return fencedParks{newParkedStore(w.cfg.DB, w.cfg.ChangelogTable, w.cfg.ClientName), w}
}

// fencedParks is the dead-letter table of a watcher whose parks are fenced like its saves: an
// exclusive watcher's insert its row only while the token row holds the watcher's owner epoch,
// a Shared member's only while it owns the event's range (each holding that row FOR KEY SHARE
// until the insert commits). So a former owner that wakes up after a hand-over parks nothing:
// its successor runs the event, and no stale row is left for an operator to run again. A
// refused park is ErrFenced, which stops Process; the watcher stops as for a fenced save.
type fencedParks struct {
	*sqlParkedStore
	w *Watcher
}

func (f fencedParks) park(ctx context.Context, p ParkedEvent) (int64, error) {
	w := f.w
	if w.sh != nil {
		member := w.sh.id.Load()
		id, inserted, err := f.insert(ctx, p, w.sh.q.parkFence, member)
		if err != nil || inserted {
			return id, err
		}
		var acked, exists bool
		if err := w.cfg.DB.QueryRowContext(ctx, w.sh.q.ackState, w.cfg.ClientName, p.ChangelogID).Scan(&acked, &exists); err != nil {
			return 0, fmt.Errorf("pgchangestream: park event %d wrote nothing; checking why: %w", p.ChangelogID, err)
		}
		if !exists { // its range is unknown: parked as an unshared watcher parks
			return f.sqlParkedStore.park(ctx, p)
		}
		return 0, procrun.Fatal(w.rangeFenced(member, p.ChangelogID, "parked"))
	}
	w.ckMu.Lock()
	fenced, epoch, err := w.txFenceLocked()
	w.ckMu.Unlock()
	switch {
	case err != nil:
		return 0, procrun.Fatal(err)
	case !fenced:
		return f.sqlParkedStore.park(ctx, p)
	}
	id, inserted, err := f.insert(ctx, p, w.q.parkFence, epoch)
	if err != nil || inserted {
		return id, err
	}
	return 0, procrun.Fatal(w.noWriteErr(ctx, w.cfg.DB, true, epoch, ""))
}

// released returns the released events of a Shared member's ranges only (and those whose
// changelog row is gone): each is run again by the member that owns its event's range, not by
// every member polling the client's dead-letter table. Until the member joined, it owns none.
func (f fencedParks) released(ctx context.Context, limit int) ([]ParkedEvent, error) {
	if f.w.sh == nil {
		return f.sqlParkedStore.released(ctx, limit)
	}
	return f.releasedWhere(ctx, limit, f.w.sh.q.releasedOwned, f.w.sh.id.Load())
}

// parkedColumns are the columns scanParked reads, in order.
const parkedColumns = `id, client_name, event_key, table_name, changelog_id, event::text, error, attempts, blocking, retry_requested, parked_at`

// scanParked reads the rows of a query selecting parkedColumns.
func scanParked(rows *sql.Rows) ([]ParkedEvent, error) {
	defer rows.Close()
	var out []ParkedEvent
	for rows.Next() {
		var (
			p   ParkedEvent
			doc []byte
		)
		if err := rows.Scan(&p.ID, &p.Client, &p.Key, &p.Table, &p.ChangelogID, &doc, &p.Error,
			&p.Attempts, &p.Blocking, &p.RetryRequested, &p.ParkedAt); err != nil {
			return nil, err
		}
		ev, err := document.UnmarshalObject(doc)
		if err != nil {
			return nil, fmt.Errorf("parked event %d: decode its document: %w", p.ID, err)
		}
		p.Event = ev
		out = append(out, p)
	}
	return out, rows.Err()
}

// check wraps a failed statement on the table with its name, and says how to create the table
// when it is missing.
func (s *sqlParkedStore) check(what string, err error) error {
	if err == nil {
		return nil
	}
	if changelog.HasCode(err, changelog.UndefinedTable) {
		return fmt.Errorf("pgchangestream: %s: dead-letter table %s is missing (run schema.Install): %w", what, s.name, err)
	}
	return fmt.Errorf("pgchangestream: %s in %s: %w", what, s.name, err)
}

func (s *sqlParkedStore) query(ctx context.Context, what, where string, args ...any) ([]ParkedEvent, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+parkedColumns+` FROM `+s.table+` WHERE `+where, args...)
	if err != nil {
		return nil, s.check(what, err)
	}
	out, err := scanParked(rows)
	return out, s.check(what, err)
}

func (s *sqlParkedStore) park(ctx context.Context, p ParkedEvent) (int64, error) {
	id, _, err := s.insert(ctx, p, "")
	return id, err
}

// insert inserts p, unless fence, a FROM clause with a condition (its arguments from $9 on),
// selects no row: inserted is then false.
//
// A key PostgreSQL's text cannot hold (a NUL byte, invalid UTF-8) is refused as a Fatal error:
// stored changed, it would no longer find its parked events, and retrying cannot succeed. The
// event then stops Process as under StopOnFailure, unacknowledged. The error text, a message
// only, is stored with such bytes replaced.
func (s *sqlParkedStore) insert(ctx context.Context, p ParkedEvent, fence string, fenceArgs ...any) (id int64, inserted bool, err error) {
	what := fmt.Sprintf("park event %d of key %q", p.ChangelogID, p.Key)
	if !storableText(p.Key) {
		return 0, false, procrun.Fatal(fmt.Errorf("pgchangestream: %s: the key holds a NUL byte or invalid UTF-8, "+
			"which the dead-letter table's text column cannot store", what))
	}
	doc, err := json.Marshal(p.Event)
	if err != nil {
		return 0, false, fmt.Errorf("pgchangestream: %s: encode its document: %w", what, err)
	}
	errText := strings.ReplaceAll(strings.ToValidUTF8(p.Error, "\ufffd"), "\x00", `\x00`)
	args := append([]any{s.client, p.Key, p.Table, p.ChangelogID, string(doc), errText, p.Attempts, p.Blocking}, fenceArgs...)
	err = s.db.QueryRowContext(ctx, `INSERT INTO `+s.table+
		` (client_name, event_key, table_name, changelog_id, event, error, attempts, blocking)
		SELECT $1::text, $2::text, $3::text, $4::bigint, $5::text::jsonb, $6::text, $7::int, $8::boolean`+fence+` RETURNING id`,
		args...).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return id, err == nil, s.check(what, err)
}

// storableText reports whether PostgreSQL's text type can hold s: valid UTF-8 without NUL.
func storableText(s string) bool {
	return utf8.ValidString(s) && !strings.Contains(s, "\x00")
}

func (s *sqlParkedStore) blockedKeys(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT DISTINCT event_key FROM `+s.table+
		` WHERE client_name = $1 AND blocking ORDER BY event_key`, s.client)
	if err != nil {
		return nil, s.check("read blocked keys", err)
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, s.check("read blocked keys", err)
		}
		keys = append(keys, k)
	}
	return keys, s.check("read blocked keys", rows.Err())
}

func (s *sqlParkedStore) released(ctx context.Context, limit int) ([]ParkedEvent, error) {
	return s.releasedWhere(ctx, limit, "")
}

// releasedWhere is released with the condition and (from $3 on) args added.
func (s *sqlParkedStore) releasedWhere(ctx context.Context, limit int, and string, args ...any) ([]ParkedEvent, error) {
	return s.query(ctx, "read released events", `client_name = $1 AND retry_requested`+and+` ORDER BY id LIMIT $2`,
		append([]any{s.client, limit}, args...)...)
}

func (s *sqlParkedStore) keyEvents(ctx context.Context, key string) ([]ParkedEvent, error) {
	return s.query(ctx, "read parked events of a key", `client_name = $1 AND event_key = $2 ORDER BY id`, s.client, key)
}

func (s *sqlParkedStore) repark(ctx context.Context, id int64, attempts int, errText string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE `+s.table+
		` SET attempts = $3, error = $4, retry_requested = FALSE, parked_at = NOW() WHERE client_name = $1 AND id = $2`,
		s.client, id, attempts, errText)
	return s.check("park event again", err)
}

func (s *sqlParkedStore) finish(ctx context.Context, id int64) error {
	_, err := s.finishIn(ctx, s.db, id)
	return err
}

// execer is a *sql.DB or a *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// finishIn deletes the parked event id through ex; it returns false when there was none.
func (s *sqlParkedStore) finishIn(ctx context.Context, ex execer, id int64) (bool, error) {
	res, err := ex.ExecContext(ctx, `DELETE FROM `+s.table+` WHERE client_name = $1 AND id = $2`, s.client, id)
	if err != nil {
		return false, s.check("remove parked event", err)
	}
	n, err := res.RowsAffected()
	return n == 1, s.check("remove parked event", err)
}

// parkedAdmin validates opts and returns the store of client.
func parkedAdmin(db *sql.DB, client string, opts admin.Options) (*sqlParkedStore, error) {
	log := cmp.Or(opts.ChangelogTable, DefaultChangelogTable)
	if err := changelog.CheckName(log); err != nil {
		return nil, fmt.Errorf("%w: admin.Options.ChangelogTable: %v", ErrInvalidConfig, err)
	}
	return newParkedStore(db, log, client), nil
}

// ListParked returns the parked events of client (of every client when client is ""), oldest
// first. Events are parked by [Watcher.Process] under [ParkOnFailure] and [BlockOnFailure].
func ListParked(ctx context.Context, db *sql.DB, client string, opts admin.Options) ([]ParkedEvent, error) {
	s, err := parkedAdmin(db, client, opts)
	if err != nil {
		return nil, err
	}
	return s.query(ctx, "list parked events", `$1 = '' OR client_name = $1 ORDER BY id`, client)
}

// RetryParked asks the running Process of client to run the parked event id again, at its next
// look at the dead-letter table ([ProcessOptions].ParkedPollInterval): the Process of the watcher
// that owns the event (not an exclusive standby; with [Config.Shared], the member owning its
// range). For an event parked
// under [BlockOnFailure] it releases the event's key: every parked event of the key runs again,
// in the order they were parked, and the key's new events run after them; if one fails again it
// is parked again and holds the key. It returns an error wrapping [ErrNotParked] when the client
// has no parked event id.
func RetryParked(ctx context.Context, db *sql.DB, client string, id int64, opts admin.Options) error {
	s, err := parkedAdmin(db, client, opts)
	if err != nil {
		return err
	}
	return s.request(ctx, id)
}

// request asks for the parked event id to run again.
func (s *sqlParkedStore) request(ctx context.Context, id int64) error {
	res, err := s.db.ExecContext(ctx, `UPDATE `+s.table+` SET retry_requested = TRUE WHERE client_name = $1 AND id = $2`, s.client, id)
	return s.found("retry parked event", id, res, err)
}

// DropParked deletes the parked event id of client without running it again. A key held under
// [BlockOnFailure] stays held while it has other parked events (release it with
// [RetryParked]); once the last is dropped, Process lets the key's new events run. It returns
// an error wrapping [ErrNotParked] when the client has no parked event id.
func DropParked(ctx context.Context, db *sql.DB, client string, id int64, opts admin.Options) error {
	s, err := parkedAdmin(db, client, opts)
	if err != nil {
		return err
	}
	res, err := db.ExecContext(ctx, `DELETE FROM `+s.table+` WHERE client_name = $1 AND id = $2`, client, id)
	return s.found("drop parked event", id, res, err)
}

// found checks that a statement on parked event id changed a row.
func (s *sqlParkedStore) found(what string, id int64, res sql.Result, err error) error {
	if err != nil {
		return s.check(what, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return s.check(what, err)
	} else if n == 0 {
		return fmt.Errorf("%w: client %q has no parked event %d", ErrNotParked, s.client, id)
	}
	return nil
}
