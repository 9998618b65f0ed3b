package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/lock"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// Owner epochs fence the saves of exclusive watchers (contract rule 18). The token table's
// owner_epoch column counts the client's owners. A watcher that becomes active claims the next
// epoch on its lock session, in a statement that only runs while that session holds the lock,
// and reads the saved token in the same statement; each of its saves then updates the row only
// while the row still holds its epoch. So once a successor claimed the client, no save of an
// earlier owner lands, however late it runs, and the successor resumes from the last save that
// did.

// claimToken reads the client's saved token (found is false when it has none). With claim, an
// exclusive watcher on a token table with the owner_epoch column claims a new epoch in the same
// statement, and its saves are fenced from then on; on a table without the column it warns,
// once, that saves are not fenced. Without claim (a rewind: the watcher still owns the client)
// it only reads the token and keeps its epoch. ckMu must be held.
func (w *Watcher) claimToken(ctx context.Context, claim bool) (raw string, found bool, err error) {
	if claim {
		w.fenced, w.epoch = false, 0
	}
	if claim && w.cfg.Exclusive && !w.cfg.Ephemeral {
		if err := w.cfg.DB.QueryRowContext(ctx, w.q.epochColumn, changelog.Quote(w.cfg.TokenTable)).Scan(&w.fenced); err != nil {
			return "", false, fmt.Errorf("inspect token table %s: %w", w.cfg.TokenTable, err)
		}
		if w.fenced {
			return w.claimEpoch(ctx)
		}
		if !w.unfencedNoted {
			w.unfencedNoted = true
			w.log.Warn("the token table has no "+changelog.EpochColumn+" column: saves of exclusive watchers are not fenced, "+
				"so a watcher paused past the hand-over could overwrite its successor's token; upgrade it with "+
				"schema.Install, or the statements it lists with DryRun", "token_table", w.cfg.TokenTable)
		}
	}
	err = w.cfg.DB.QueryRowContext(ctx, w.q.loadToken, w.cfg.ClientName).Scan(&raw)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("read token table %s: %w", w.cfg.TokenTable, err)
	}
	return raw, true, nil
}

// claimEpoch claims the client's next owner epoch on the lock session and returns the saved
// token. A client without a token row gets epoch 1 from its first save (claimNew).
func (w *Watcher) claimEpoch(ctx context.Context) (raw string, found bool, err error) {
	s := w.excl.current()
	if s == nil {
		return "", false, w.lockLostErr()
	}
	c, o := lock.Halves(lock.Key(w.cfg.TokenTable, w.cfg.ClientName))
	row, err := s.Query(ctx, w.q.claimEpoch, w.cfg.ClientName, string(itoa(c)), string(itoa(o)))
	if err != nil {
		return "", false, fmt.Errorf("claim an owner epoch in token table %s: %w", w.cfg.TokenTable, err)
	}
	if len(row) != 3 || row[0].String != "t" {
		w.loseLock(lock.ErrNotHeld)
		return "", false, w.lockLostErr()
	}
	if !row[1].Valid {
		return "", false, nil
	}
	if w.epoch, err = strconv.ParseInt(row[1].String, 10, 64); err != nil {
		return "", false, fmt.Errorf("claim an owner epoch: %q: %w", row[1].String, err)
	}
	w.log.Info("claimed the client", "owner_epoch", w.epoch)
	return row[2].String, true, nil
}

// lockLostErr is why an exclusive watcher cannot claim or save: the error that stopped it.
func (w *Watcher) lockLostErr() error {
	if err := w.excl.lostErr(); err != nil {
		return err
	}
	return fmt.Errorf("%w: the lock session was released", ErrExclusiveLost)
}

// writeToken saves p as the client's token; seq is the last delivery acknowledged in memory
// when p was computed (the marker of a watcher that acknowledged in a transaction, txack.go).
// It is fenced to the watcher's owner epoch when it claimed one (the first save of a fenced new
// client creates the token row with epoch 1, on the lock session), and a position read in a
// server incarnation is written only while the server is still in it (see rewind.go). A fenced
// save that matches no row stops the watcher and returns an error wrapping ErrFenced; a save
// whose incarnation ended writes nothing and returns ErrServerRecovered. ckMu must be held.
func (w *Watcher) writeToken(ctx context.Context, p Position, seq uint64) error {
	tok := position.EncodeToken(p, w.cfg.TableName)
	var inc string
	if p.Span != nil {
		inc = p.Span.Inc
	}
	switch {
	case w.sh != nil:
		return w.writeShared(ctx, p, string(tok), inc)
	case w.fenced && w.epoch == 0: // the lock session ends with a crash: it cannot outlive the incarnation
		return w.claimNew(ctx, string(tok))
	case w.txAcked:
		return w.writeMarked(ctx, tok, seq, inc)
	}
	return w.writePlain(ctx, string(tok), inc)
}

// writePlain is writeToken's statement without a marker. ckMu must be held.
func (w *Watcher) writePlain(ctx context.Context, tok, inc string) error {
	var (
		res sql.Result
		err error
	)
	switch {
	case !w.fenced && inc == "":
		_, err = w.cfg.DB.ExecContext(ctx, w.q.saveToken, w.cfg.ClientName, tok)
		return err
	case !w.fenced:
		res, err = w.cfg.DB.ExecContext(ctx, w.q.saveTokenInc, w.cfg.ClientName, tok, inc)
	case inc == "":
		res, err = w.cfg.DB.ExecContext(ctx, w.q.saveFenced, w.cfg.ClientName, tok, w.epoch)
	default:
		res, err = w.cfg.DB.ExecContext(ctx, w.q.saveFencedInc, w.cfg.ClientName, tok, w.epoch, inc)
	}
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	return w.noWriteErr(ctx, w.cfg.DB, w.fenced, w.epoch, inc)
}

// noWriteErr explains a save that matched no row: the incarnation ended (ErrServerRecovered),
// or, fenced to epoch, a later owner claimed the client (ErrFenced: the watcher stops). q is
// where the save ran.
func (w *Watcher) noWriteErr(ctx context.Context, q queryer, fenced bool, epoch int64, inc string) error {
	if !fenced { // only the incarnation can have stopped an upsert
		return ErrServerRecovered
	}
	if inc != "" {
		var same bool
		if err := q.QueryRowContext(ctx, w.q.incarnationIs, inc).Scan(&same); err != nil {
			return fmt.Errorf("the save wrote nothing; checking why: %w", err)
		}
		if !same {
			return ErrServerRecovered
		}
	}
	err := fmt.Errorf("%w: the token row no longer holds owner epoch %d", ErrFenced, epoch)
	w.stopOwning(err, "fenced off: a later watcher owns this client; stopping")
	return err
}

// claimNew creates the token row of a new client with epoch 1, on the lock session while it
// holds the lock. It fails when a row appeared meanwhile (a watcher without Config.Exclusive
// saved one): the load is retried, and claims that row.
func (w *Watcher) claimNew(ctx context.Context, token string) error {
	s := w.excl.current()
	if s == nil {
		return w.lockLostErr()
	}
	c, o := lock.Halves(lock.Key(w.cfg.TokenTable, w.cfg.ClientName))
	row, err := s.Query(ctx, w.q.claimNew, w.cfg.ClientName, token, string(itoa(c)), string(itoa(o)))
	switch {
	case err != nil:
		return err
	case len(row) == 0:
		return errors.New("the token row was created meanwhile, or the lock was lost: claiming again")
	}
	w.epoch = 1
	w.log.Info("claimed the client", "owner_epoch", w.epoch)
	return nil
}
