package deadletter

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/document"
	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

// Event is one event in the dead-letter table of a client.
type Event struct {
	ID             int64 // the parked row's id
	Client         string
	Key            string
	Table          string         // ns.coll of the event
	ChangelogID    int64          // the changelog id (the resume token)
	Event          map[string]any // the document as delivered
	Error          string         // the last handler error
	Attempts       int
	Blocking       bool // parked under BlockOnFailure: holds its key
	RetryRequested bool // an operator asked to run it again
	ParkedAt       time.Time
}

// Store is the dead-letter table of one client: "<changelog>_parked", created by
// schema.Install. It keeps no state of its own: every call is one statement.
type Store struct {
	db     *sql.DB
	table  string // quoted
	name   string // for messages
	client string
}

// New returns the dead-letter store of client beside the changelog changelogTable, a name
// already checked (changelog.CheckName). A store of client "" lists every client's events.
func New(db *sql.DB, changelogTable, client string) *Store {
	name := changelog.ParkedTable(changelogTable)
	return &Store{db: db, table: changelog.Quote(name), name: name, client: client}
}

// parkedColumns are the columns scanParked reads, in order.
const parkedColumns = `id, client_name, event_key, table_name, changelog_id, event::text, error, attempts, blocking, retry_requested, parked_at`

// scanParked reads the rows of a query selecting parkedColumns.
func scanParked(rows *sql.Rows) ([]Event, error) {
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var (
			p   Event
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
func (s *Store) check(what string, err error) error {
	if err == nil {
		return nil
	}
	if changelog.HasCode(err, changelog.UndefinedTable) {
		return fmt.Errorf("pgchangestream: %s: dead-letter table %s is missing (run schema.Install): %w", what, s.name, err)
	}
	return fmt.Errorf("pgchangestream: %s in %s: %w", what, s.name, err)
}

func (s *Store) query(ctx context.Context, what, where string, args ...any) ([]Event, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+parkedColumns+` FROM `+s.table+` WHERE `+where, args...)
	if err != nil {
		return nil, s.check(what, err)
	}
	out, err := scanParked(rows)
	return out, s.check(what, err)
}

// Park inserts p (ID and ParkedAt are filled by the store; Client is the store's) and returns
// its id. It fails as [Store.Insert] does.
func (s *Store) Park(ctx context.Context, p Event) (int64, error) {
	id, _, err := s.Insert(ctx, p, "")
	return id, err
}

// Insert inserts p, unless fence, a FROM clause with a condition (its arguments from $9 on),
// selects no row: inserted is then false.
//
// A key PostgreSQL's text cannot hold (a NUL byte, invalid UTF-8) is refused as a Fatal error
// (procrun.Fatal): stored changed, it would no longer find its parked events, and retrying
// cannot succeed. The event then stops Process as under StopOnFailure, unacknowledged. The
// error text, a message only, is stored with such bytes replaced.
func (s *Store) Insert(ctx context.Context, p Event, fence string, fenceArgs ...any) (id int64, inserted bool, err error) {
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

// BlockedKeys returns the keys that have a Blocking parked event, in order.
func (s *Store) BlockedKeys(ctx context.Context) ([]string, error) {
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

// Released returns the parked events an operator asked to retry, oldest first, at most limit.
func (s *Store) Released(ctx context.Context, limit int) ([]Event, error) {
	return s.ReleasedWhere(ctx, limit, "")
}

// ReleasedWhere is [Store.Released] with the condition and (from $3 on) args added.
func (s *Store) ReleasedWhere(ctx context.Context, limit int, and string, args ...any) ([]Event, error) {
	return s.query(ctx, "read released events", `client_name = $1 AND retry_requested`+and+` ORDER BY id LIMIT $2`,
		append([]any{s.client, limit}, args...)...)
}

// KeyEvents returns every parked event of key, oldest first.
func (s *Store) KeyEvents(ctx context.Context, key string) ([]Event, error) {
	return s.query(ctx, "read parked events of a key", `client_name = $1 AND event_key = $2 ORDER BY id`, s.client, key)
}

// List returns the parked events of the store's client (of every client when it is ""),
// oldest first.
func (s *Store) List(ctx context.Context) ([]Event, error) {
	return s.query(ctx, "list parked events", `$1 = '' OR client_name = $1 ORDER BY id`, s.client)
}

// Repark records a failed rerun of parked event id: new error and attempts, RetryRequested
// cleared.
func (s *Store) Repark(ctx context.Context, id int64, attempts int, errText string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE `+s.table+
		` SET attempts = $3, error = $4, retry_requested = FALSE, parked_at = NOW() WHERE client_name = $1 AND id = $2`,
		s.client, id, attempts, errText)
	return s.check("park event again", err)
}

// Finish deletes parked event id, which ran successfully.
func (s *Store) Finish(ctx context.Context, id int64) error {
	_, err := s.FinishIn(ctx, s.db, id)
	return err
}

// Execer is a *sql.DB or a *sql.Tx.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// FinishIn deletes the parked event id through ex; it returns false when there was none.
func (s *Store) FinishIn(ctx context.Context, ex Execer, id int64) (bool, error) {
	res, err := ex.ExecContext(ctx, `DELETE FROM `+s.table+` WHERE client_name = $1 AND id = $2`, s.client, id)
	if err != nil {
		return false, s.check("remove parked event", err)
	}
	n, err := res.RowsAffected()
	return n == 1, s.check("remove parked event", err)
}

// Request asks for the parked event id to run again. It returns an error wrapping
// changelog.ErrNotParked when the client has no parked event id.
func (s *Store) Request(ctx context.Context, id int64) error {
	res, err := s.db.ExecContext(ctx, `UPDATE `+s.table+` SET retry_requested = TRUE WHERE client_name = $1 AND id = $2`, s.client, id)
	return s.found("retry parked event", id, res, err)
}

// Drop deletes the parked event id without running it again. It returns an error wrapping
// changelog.ErrNotParked when the client has no parked event id.
func (s *Store) Drop(ctx context.Context, id int64) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM `+s.table+` WHERE client_name = $1 AND id = $2`, s.client, id)
	return s.found("drop parked event", id, res, err)
}

// found checks that a statement on parked event id changed a row.
func (s *Store) found(what string, id int64, res sql.Result, err error) error {
	if err != nil {
		return s.check(what, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return s.check(what, err)
	} else if n == 0 {
		return fmt.Errorf("%w: client %q has no parked event %d", changelog.ErrNotParked, s.client, id)
	}
	return nil
}
