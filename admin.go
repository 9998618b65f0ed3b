package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// AdminOptions names the tables of the token and retention functions ([ListTokens],
// [ResetToken], [DeleteToken], [Prune]). Zero values take the [Config] defaults.
type AdminOptions struct {
	ChangelogTable string // default "datastore_changelog"
	TokenTable     string // default "resume_tokens"
}

// adminTables are the validated tables of an administration function.
type adminTables struct {
	changelog, tokens string  // names, defaults filled, for messages
	cl, tok           string  // quoted
	ranges            string  // the changelog's _ranges table (shared clients), quoted
	q                 queries // the watcher's queries on these tables
}

// resolve validates the names and fills the defaults.
func (o AdminOptions) resolve() (adminTables, error) {
	cfg := Config{ChangelogTable: o.ChangelogTable, TokenTable: o.TokenTable}.withDefaults()
	if err := changelog.CheckName(cfg.ChangelogTable); err != nil {
		return adminTables{}, fmt.Errorf("%w: AdminOptions.ChangelogTable: %v", ErrInvalidConfig, err)
	}
	if err := changelog.CheckName(cfg.TokenTable); err != nil {
		return adminTables{}, fmt.Errorf("%w: AdminOptions.TokenTable: %v", ErrInvalidConfig, err)
	}
	return adminTables{changelog: cfg.ChangelogTable, tokens: cfg.TokenTable,
		cl: changelog.Quote(cfg.ChangelogTable), tok: changelog.Quote(cfg.TokenTable),
		ranges: changelog.Quote(changelog.RangeTable(cfg.ChangelogTable)), q: buildQueries(cfg)}, nil
}

// SavedToken is one client's row of the token table.
type SavedToken struct {
	Client    string    `json:"client"`
	Token     string    `json:"token"` // the saved JSON, as stored
	UpdatedAt time.Time `json:"updated_at"`
}

// ListTokens returns every client's saved token, ordered by client name.
func ListTokens(ctx context.Context, db *sql.DB, opts AdminOptions) ([]SavedToken, error) {
	t, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, `SELECT client_name, resume_token::text, last_updated FROM `+t.tok+` ORDER BY client_name`)
	if err != nil {
		return nil, fmt.Errorf("read token table %s: %w", t.tokens, err)
	}
	defer rows.Close()
	var out []SavedToken
	for rows.Next() {
		var (
			st      SavedToken
			updated sql.NullTime
		)
		if err := rows.Scan(&st.Client, &st.Token, &updated); err != nil {
			return nil, fmt.Errorf("read token table %s: %w", t.tokens, err)
		}
		st.UpdatedAt = updated.Time
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read token table %s: %w", t.tokens, err)
	}
	return out, nil
}

// ResetTarget is where [ResetPosition] places a client: exactly one of its fields is set.
type ResetTarget struct {
	Beginning bool      // before every row
	Newest    bool      // after the newest row (of Table, when set)
	Table     string    // with Newest: the table whose newest row counts; empty: any table
	Time      time.Time // before the first row with changed_at at or after Time
	AfterID   int64     // after the row with this id (which must exist)
}

// ResetPosition returns the position a client placed at target resumes after.
func ResetPosition(ctx context.Context, db *sql.DB, target ResetTarget, opts AdminOptions) (Position, error) {
	t, err := opts.resolve()
	if err != nil {
		return Position{}, err
	}
	set := 0
	for _, b := range []bool{target.Beginning, target.Newest, !target.Time.IsZero(), target.AfterID != 0} {
		if b {
			set++
		}
	}
	if set != 1 {
		return Position{}, errors.New("pgchangestream: reset target: set exactly one of Beginning, Newest, Time, AfterID")
	}
	switch {
	case target.Beginning:
		return Position{}, nil
	case !target.Time.IsZero():
		// Every row with changed_at before Time, whatever its id, is passed.
		return position.Make(target.Time.Add(-time.Microsecond), math.MaxInt64), nil
	}
	var (
		ts time.Time
		id = target.AfterID
	)
	switch {
	case target.Newest && target.Table != "":
		err = db.QueryRowContext(ctx, t.q.newest, target.Table).Scan(&ts, &id)
	case target.Newest:
		err = db.QueryRowContext(ctx, `SELECT changed_at, id FROM `+t.cl+` ORDER BY changed_at DESC, id DESC LIMIT 1`).
			Scan(&ts, &id)
	default:
		err = db.QueryRowContext(ctx, t.q.rowTime, id).Scan(&ts)
	}
	switch {
	case errors.Is(err, sql.ErrNoRows) && target.Newest:
		return Position{}, nil // an empty changelog: nothing to pass
	case errors.Is(err, sql.ErrNoRows):
		return Position{}, fmt.Errorf("pgchangestream: changelog row %d does not exist", target.AfterID)
	case err != nil:
		return Position{}, fmt.Errorf("read changelog %s: %w", t.changelog, err)
	}
	return position.Make(ts, id), nil
}

// ResetTokenJSON returns the token [ResetTableToken] saves for pos and table, and [ResetToken]
// saves for pos when the client's current token records table ("" for none).
func ResetTokenJSON(pos Position, table string) string {
	return string(position.EncodeToken(pos, table))
}

// ResetToken saves pos as the client's token, in the form every schema state accepts:
// {"timestamp", "eventID"}, keeping the table the client's current token records. It refuses
// (ErrClientActive) while a watcher of the client runs. A client without a token gets one that
// records no table, which [Prune] counts for every table: use [ResetTableToken] for it.
// It also moves the client's owner epoch on, so that a former exclusive watcher that lost its
// lock but did not notice yet (a paused process) cannot save over the reset (ErrFenced). For a
// shared client ([Config.Shared]) it saves pos to every range too, and frees them in the same
// statement: a member still running (a polling one holds no lock) saves nothing over the reset
// (its saves match only the ranges it owns: it stops with ErrFenced), and the members that
// claim the ranges again read from pos.
func ResetToken(ctx context.Context, db *sql.DB, client string, pos Position, opts AdminOptions) error {
	return resetToken(ctx, db, client, "", pos, opts)
}

// ResetTableToken is [ResetToken] for the client of table (the changelog's table_name, which
// its watcher reads): the token records table, so [Prune] keeps only that table's rows for it.
func ResetTableToken(ctx context.Context, db *sql.DB, client, table string, pos Position, opts AdminOptions) error {
	if err := changelog.CheckText(table, MaxTableNameLen); err != nil || strings.TrimSpace(table) == "" {
		if err == nil {
			err = errors.New("is empty")
		}
		return fmt.Errorf("%w: table: %v", ErrInvalidConfig, err)
	}
	return resetToken(ctx, db, client, table, pos, opts)
}

// resetToken saves pos as the client's token for table; "" keeps the table of its token.
func resetToken(ctx context.Context, db *sql.DB, client, table string, pos Position, opts AdminOptions) error {
	t, err := opts.resolve()
	if err != nil {
		return err
	}
	return withClientLock(ctx, db, client, t, func(conn *sql.Conn) error {
		ranged, err := hasRangeTable(ctx, conn, t)
		if err != nil {
			return err
		}
		if table == "" {
			var raw string
			err := conn.QueryRowContext(ctx, t.q.loadToken, client).Scan(&raw)
			if errors.Is(err, sql.ErrNoRows) && ranged { // a shared client that never ran unshared
				err = conn.QueryRowContext(ctx, `SELECT resume_token::text FROM `+t.ranges+
					` WHERE client_name = $1 ORDER BY range_no LIMIT 1`, client).Scan(&raw)
			}
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("read the saved token of client %s: %w", client, err)
			}
			if err == nil {
				_, table, _ = position.DecodeTableToken([]byte(raw)) // a token that does not load keeps its table all the same
			}
		}
		token := string(position.EncodeToken(pos, table))
		var fenced bool
		if err := conn.QueryRowContext(ctx, t.q.epochColumn, t.tok).Scan(&fenced); err != nil {
			return fmt.Errorf("inspect token table %s: %w", t.tokens, err)
		}
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("write token table %s: %w", t.tokens, err)
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(ctx, t.q.saveToken, client, token); err != nil {
			return fmt.Errorf("write token table %s: %w", t.tokens, err)
		}
		if ranged { // freed in the same statement: a member's saves only match the ranges it owns (ErrFenced)
			if _, err := tx.ExecContext(ctx, `UPDATE `+t.ranges+` SET owner = NULL, resume_token = $2::jsonb, last_updated = now()
	WHERE client_name = $1`, client, token); err != nil {
				return fmt.Errorf("reset the ranges of client %s: %w", client, err)
			}
		}
		if fenced {
			if _, err := tx.ExecContext(ctx, t.q.bumpEpoch, client); err != nil {
				return fmt.Errorf("fence the client's owners in token table %s: %w", t.tokens, err)
			}
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("write token table %s: %w", t.tokens, err)
		}
		return nil
	})
}

// DeleteToken deletes the client's saved token; its next watcher starts as a new client. It
// reports whether there was one, and refuses (ErrClientActive) while a watcher of the client
// runs. For a shared client it deletes its ranges too; a member still running then stops at its
// next save (ErrFenced).
func DeleteToken(ctx context.Context, db *sql.DB, client string, opts AdminOptions) (bool, error) {
	t, err := opts.resolve()
	if err != nil {
		return false, err
	}
	var n int64
	err = withClientLock(ctx, db, client, t, func(conn *sql.Conn) error {
		ranged, err := hasRangeTable(ctx, conn, t)
		if err != nil {
			return err
		}
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("delete from token table %s: %w", t.tokens, err)
		}
		defer func() { _ = tx.Rollback() }()
		res, err := tx.ExecContext(ctx, `DELETE FROM `+t.tok+` WHERE client_name = $1`, client)
		if err != nil {
			return fmt.Errorf("delete from token table %s: %w", t.tokens, err)
		}
		if n, err = res.RowsAffected(); err != nil {
			return err
		}
		if ranged { // a member's saves then match no range: it stops (ErrFenced)
			res, err := tx.ExecContext(ctx, `DELETE FROM `+t.ranges+` WHERE client_name = $1`, client)
			if err != nil {
				return fmt.Errorf("delete the ranges of client %s: %w", client, err)
			}
			m, err := res.RowsAffected()
			if err != nil {
				return err
			}
			n += m
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("delete from token table %s: %w", t.tokens, err)
		}
		return nil
	})
	return n > 0, err
}

// withClientLock runs f on a connection holding the client's lock, which no watcher of the
// client holds meanwhile; ErrClientActive if one does.
func withClientLock(ctx context.Context, db *sql.DB, client string, t adminTables, f func(*sql.Conn) error) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	s := &sqlLockSession{conn: conn}
	defer s.close()
	got, err := s.tryLock(ctx, lockKey(t.tokens, client))
	if err != nil {
		return fmt.Errorf("try the lock of client %s: %w", client, err)
	}
	if !got {
		return fmt.Errorf("%w: %s", ErrClientActive, client)
	}
	return f(conn)
}

// hasRangeTable reports whether the changelog has a _ranges table (InstallSchema adds it), where
// shared clients keep their positions.
func hasRangeTable(ctx context.Context, conn *sql.Conn, t adminTables) (bool, error) {
	var exists bool
	if err := conn.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, t.ranges).Scan(&exists); err != nil {
		return false, fmt.Errorf("look for range table %s: %w", t.ranges, err)
	}
	return exists, nil
}
