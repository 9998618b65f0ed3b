package admin

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// TokenBacklog is what a saved token has not passed (see [Backlog]).
type TokenBacklog struct {
	// Position is where a watcher loading the token resumes: after it. ChangedAt is zero for a
	// position before every row (a client that started on a table without rows).
	Position Position
	// Table is the table the token records; "" for none.
	Table string
	// RowGone is set for an id-only token whose changelog row no longer exists: its watcher
	// replays from the beginning, and every row counts.
	RowGone bool
	// Rows is the number of changelog rows, visible now, that the token does not certify: what
	// a watcher restarting from it would deliver. The same count as the watcher's Backlog, and the
	// rows [Prune] keeps for this token.
	Rows int64
	// Lag is the age of the oldest of those rows, from its changed_at, by the database's clock;
	// 0 when there is none: the watcher's Stats.Lag, seen from the saved token.
	Lag time.Duration
}

// Backlog loads a saved token (its JSON, as [ListTokens] returns it) the way a watcher
// does and counts the changelog rows of table ("" for every table) it does not certify. An
// id-only token's row is looked up; a token that cannot be loaded is an error wrapping
// ErrInvalidSavedToken.
func Backlog(ctx context.Context, db *sql.DB, token, table string, opts Options) (TokenBacklog, error) {
	t, err := opts.resolve()
	if err != nil {
		return TokenBacklog{}, err
	}
	var b TokenBacklog
	b.Position, b.Table, b.RowGone, err = loadSavedToken(ctx, db, t, token)
	if err != nil {
		return TokenBacklog{}, err
	}
	var args changelog.Params
	var conds []string
	if table != "" {
		conds = append(conds, "c.table_name = "+args.Add(table))
	}
	b.Rows, b.Lag, _, err = changelog.CountNotCertified(ctx, db, t.cl, b.Position, conds, args)
	if err != nil {
		return TokenBacklog{}, fmt.Errorf("count backlog in changelog %s: %w", t.changelog, err)
	}
	return b, nil
}

// loadSavedToken decodes a saved token as a watcher loads it: an id-only token takes its row's
// changed_at or, with rowGone, is placed before every row when that row is gone. A token that
// cannot be decoded is an error wrapping changelog.ErrInvalidSavedToken; table is set even then, when the
// token names one.
func loadSavedToken(ctx context.Context, db *sql.DB, t resolved, token string) (pos Position, table string, rowGone bool, err error) {
	pos, table, err = position.DecodeTableToken([]byte(token))
	if errors.Is(err, position.ErrTokenNeedsLookup) {
		id := pos.ID
		pos, err = lookUpTokenRow(ctx, db, t.rowTime, id)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return Position{ID: id}, table, true, nil
		case err != nil:
			return Position{}, table, false, fmt.Errorf("look up the row of an id-only token in changelog %s: %w", t.changelog, err)
		}
	}
	if err != nil {
		return Position{}, table, false, fmt.Errorf("%w: %v", changelog.ErrInvalidSavedToken, err)
	}
	return pos, table, false, nil
}
