package admin

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/lock"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// Options names the tables the calls work on. Zero values take the defaults of the watcher's
// Config.
type Options struct {
	ChangelogTable string // default "datastore_changelog"
	TokenTable     string // default "resume_tokens"
}

// resolved are the validated tables of a call, and the statements it runs on them.
type resolved struct {
	changelog, tokens string // names, defaults filled, for messages
	cl, tok           string // quoted
	ranges            string // the changelog's _ranges table (shared clients), quoted
	// The statements on these tables that the watcher runs too.
	newest, rowTime, loadToken, saveToken, bumpEpoch string
}

// resolve validates the names and fills the defaults.
func (o Options) resolve() (resolved, error) {
	log, err := o.changelogTable()
	if err != nil {
		return resolved{}, err
	}
	tok := cmp.Or(o.TokenTable, changelog.DefaultTokenTable)
	if err := changelog.CheckName(tok); err != nil {
		return resolved{}, fmt.Errorf("%w: admin.Options.TokenTable: %v", changelog.ErrInvalidConfig, err)
	}
	cl, qtok := changelog.Quote(log), changelog.Quote(tok)
	return resolved{changelog: log, tokens: tok, cl: cl, tok: qtok,
		ranges: changelog.Quote(changelog.RangeTable(log)),
		newest: changelog.NewestRowSQL(cl), rowTime: changelog.RowTimeSQL(cl), loadToken: changelog.LoadTokenSQL(qtok),
		saveToken: changelog.SaveTokenSQL(qtok, false, ""), bumpEpoch: changelog.BumpEpochSQL(qtok)}, nil
}

// changelogTable returns the changelog's name, the default filled, or why it is invalid.
func (o Options) changelogTable() (string, error) {
	log := cmp.Or(o.ChangelogTable, changelog.DefaultChangelogTable)
	if err := changelog.CheckName(log); err != nil {
		return "", fmt.Errorf("%w: admin.Options.ChangelogTable: %v", changelog.ErrInvalidConfig, err)
	}
	return log, nil
}

// SavedToken is one client's row of the token table.
type SavedToken struct {
	Client    string    `json:"client"`
	Token     string    `json:"token"` // the saved JSON, as stored
	UpdatedAt time.Time `json:"updated_at"`
}

// ListTokens returns every client's saved token, ordered by client name.
func ListTokens(ctx context.Context, db *sql.DB, opts Options) ([]SavedToken, error) {
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

// ResetTarget is where [ResetToken] places a client, for which table, and whether to save.
// Exactly one of Beginning, Newest, Time, AfterID and Position is set.
type ResetTarget struct {
	Beginning bool      // before every row
	Newest    bool      // after the newest row (of Table, when set)
	Time      time.Time // before the first row with changed_at at or after Time
	AfterID   int64     // after the row with this id (which must exist)
	Position  *Position // exactly this position, e.g. one a [TokenBacklog] reports
	// Table is the table the client's watcher reads (the changelog's table_name, its
	// Config.TableName). The token records it, so [Prune] keeps only that table's rows for the
	// client; with Newest it is also the table whose newest row counts. Empty: the token keeps
	// the table the client's current token records (none for a client without a token, which
	// [Prune] then counts for every table), and Newest counts the newest row of any table.
	Table string
	// DryRun resolves the position and changes nothing: no lock is taken, so ErrClientActive
	// is not checked. The returned position's Token method gives the token a reset saves:
	// pos.Token(table), with Table or else the table the current token records.
	DryRun bool
}

// resolveTarget returns the position a client placed at target resumes after.
func resolveTarget(ctx context.Context, db *sql.DB, t resolved, target ResetTarget) (pos Position, err error) {
	set := 0
	for _, b := range []bool{target.Beginning, target.Newest, !target.Time.IsZero(), target.AfterID != 0, target.Position != nil} {
		if b {
			set++
		}
	}
	if set != 1 {
		return Position{}, errors.New("pgchangestream: reset target: set exactly one of Beginning, Newest, Time, AfterID, Position")
	}
	switch {
	case target.Position != nil:
		return *target.Position, nil
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
		err = db.QueryRowContext(ctx, t.newest, target.Table).Scan(&ts, &id)
	case target.Newest:
		err = db.QueryRowContext(ctx, `SELECT changed_at, id FROM `+t.cl+` ORDER BY changed_at DESC, id DESC LIMIT 1`).
			Scan(&ts, &id)
	default:
		err = db.QueryRowContext(ctx, t.rowTime, id).Scan(&ts)
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

// ResetToken places client at to, and returns the position it resumes after. It saves the
// position as the client's token, in the form every schema state accepts: {"timestamp",
// "eventID"}, with the table of to.Table, else the table the client's current token records.
// With to.DryRun it only returns the position (see [ResetTarget]).
//
// It refuses (ErrClientActive) while a watcher of the client runs, and moves the client's owner
// epoch on, so that a former exclusive watcher that lost its lock but did not notice yet (a
// paused process) cannot save over the reset (ErrFenced). For a shared client (Config.Shared)
// it saves the position to every range too, and frees them in the same statement: a member
// still running (a polling one holds no lock) saves nothing over the reset (its saves match only
// the ranges it owns: it stops with ErrFenced), and the members that claim the ranges again read
// from the position. A client without a token gets one that records to.Table, or none, which
// [Prune] counts for every table: give a new client its Table.
func ResetToken(ctx context.Context, db *sql.DB, client string, to ResetTarget, opts Options) (Position, error) {
	t, err := opts.resolve()
	if err != nil {
		return Position{}, err
	}
	if to.Table != "" {
		if err := changelog.CheckText(to.Table, changelog.MaxTableNameLen); err != nil || strings.TrimSpace(to.Table) == "" {
			if err == nil {
				err = errors.New("is empty")
			}
			return Position{}, fmt.Errorf("%w: ResetTarget.Table: %v", changelog.ErrInvalidConfig, err)
		}
	}
	pos, err := resolveTarget(ctx, db, t, to)
	if err != nil || to.DryRun {
		return pos, err
	}
	return pos, resetToken(ctx, db, client, to.Table, pos, t)
}

// resetToken saves pos as the client's token for table; "" keeps the table of its token.
func resetToken(ctx context.Context, db *sql.DB, client, table string, pos Position, t resolved) error {
	return withClientLock(ctx, db, client, t, func(conn *sql.Conn) error {
		ranged, err := hasRangeTable(ctx, conn, t)
		if err != nil {
			return err
		}
		if table == "" {
			var raw string
			err := conn.QueryRowContext(ctx, t.loadToken, client).Scan(&raw)
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
		if err := conn.QueryRowContext(ctx, changelog.EpochColumnSQL, t.tok).Scan(&fenced); err != nil {
			return fmt.Errorf("inspect token table %s: %w", t.tokens, err)
		}
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("write token table %s: %w", t.tokens, err)
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(ctx, t.saveToken, client, token); err != nil {
			return fmt.Errorf("write token table %s: %w", t.tokens, err)
		}
		if ranged { // freed in the same statement: a member's saves only match the ranges it owns (ErrFenced)
			if _, err := tx.ExecContext(ctx, `UPDATE `+t.ranges+` SET owner = NULL, resume_token = $2::jsonb, last_updated = now()
	WHERE client_name = $1`, client, token); err != nil {
				return fmt.Errorf("reset the ranges of client %s: %w", client, err)
			}
		}
		if fenced {
			if _, err := tx.ExecContext(ctx, t.bumpEpoch, client); err != nil {
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
func DeleteToken(ctx context.Context, db *sql.DB, client string, opts Options) (bool, error) {
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
func withClientLock(ctx context.Context, db *sql.DB, client string, t resolved, f func(*sql.Conn) error) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer lock.Release(conn)
	got, err := lock.TryLock(ctx, conn, lock.Key(t.tokens, client))
	if err != nil {
		return fmt.Errorf("try the lock of client %s: %w", client, err)
	}
	if !got {
		return fmt.Errorf("%w: %s", changelog.ErrClientActive, client)
	}
	return f(conn)
}

// hasRangeTable reports whether the changelog has a _ranges table (schema.Install adds it), where
// shared clients keep their positions.
func hasRangeTable(ctx context.Context, conn *sql.Conn, t resolved) (bool, error) {
	var exists bool
	if err := conn.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, t.ranges).Scan(&exists); err != nil {
		return false, fmt.Errorf("look for range table %s: %w", t.ranges, err)
	}
	return exists, nil
}
