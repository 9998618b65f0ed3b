package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/lock"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// Loading the saved token: the start of a client (new, from the beginning, a legacy token
// switching over, a restored database refused), the owner-epoch claims of exclusive watchers,
// and the rewinds after a server recovery. The writes of the token are in checkpoint.go.

// Server recoveries. PostgreSQL restarts its transaction counter after the last id found in
// flushed WAL. A rollback's record, and an asynchronous commit's, are not flushed before the
// transaction leaves the running set, so after a crash (or a failover to a standby that had not
// received them, or a point-in-time restore) their ids are handed out again. A snapshot taken
// before can then see an id as finished whose new transaction is still to commit: a delta from
// it would skip that transaction's rows.
//
// The watcher tags the snapshots it reads with the value of the one row of an unlogged table
// (the incarnation): crash recovery empties it, and a promoted standby or a restored backup does
// not have it. When a new snapshot's incarnation differs from the one its delta starts at, or
// the snapshot went back, positions read since the saved token can no longer be trusted: the
// watcher goes back to the saved token as the database has it now (rewind), and delivers again
// from there. A saved token that survived is safe: the commit that saved it was flushed, and so
// was all WAL before it, including every record its snapshots relied on. Saves of positions of an
// older incarnation write nothing (saveTokenInc), so a position read before the crash is never
// saved after it.

// currentSnapshot returns the database's current snapshot and, where the changelog has an
// incarnation table, the server's incarnation, inserting its row after a crash emptied it.
func (r *reader) currentSnapshot(ctx context.Context) (position.Snapshot, string, error) {
	var text, inc string
	if !r.hasInc {
		if err := r.cfg.DB.QueryRowContext(ctx, r.q.Snapshot).Scan(&text); err != nil {
			return position.Snapshot{}, "", err
		}
	} else if err := r.queryIncarnation(ctx, r.q.SnapshotInc, nil, &text, &inc); err != nil {
		return position.Snapshot{}, "", err
	}
	snap, err := position.ParseSnapshot(text)
	return snap, inc, err
}

// queryIncarnation runs q, whose last column is the incarnation, into dest (the incarnation
// last, into *inc). If the incarnation row is missing it inserts it and runs q again.
func (r *reader) queryIncarnation(ctx context.Context, q string, args []any, dest ...any) error {
	inc := dest[len(dest)-1].(*string)
	var v sql.NullString
	dest[len(dest)-1] = &v
	for try := 0; ; try++ {
		if err := r.cfg.DB.QueryRowContext(ctx, q, args...).Scan(dest...); err != nil {
			return err
		}
		if v.Valid {
			*inc = v.String
			return nil
		}
		if try > 0 {
			return fmt.Errorf("the incarnation row of %s is missing right after it was inserted",
				changelog.IncarnationTable(r.cfg.ChangelogTable))
		}
		if _, err := r.cfg.DB.ExecContext(ctx, r.q.ClaimIncarnation); err != nil {
			return fmt.Errorf("insert the incarnation row of %s (the watcher's role needs INSERT on it): %w",
				changelog.IncarnationTable(r.cfg.ChangelogTable), err)
		}
	}
}

// serverRecovered reports why positions of span s cannot be trusted with end, a new snapshot of
// incarnation inc: the incarnation changed (a crash, failover or restore), or the snapshot's
// xmax went back, which it never does while the server runs (the same, seen without an
// incarnation table, if the counter has not yet passed the old xmax again). It returns "" when
// they can.
func serverRecovered(s *position.Span, end position.Snapshot, inc string) string {
	switch {
	case s.Inc != "" && inc != s.Inc:
		return "the server's incarnation changed (crash recovery, failover or restore)"
	case end.Xmax < s.Base.Xmax:
		return fmt.Sprintf("the transaction counter went back: snapshot %s after %s", end, s.Base)
	}
	return ""
}

// askRewind has the reader go back to the saved token before its next read: a save found
// that the server recovered since the position was read.
func (w *Watcher) askRewind() {
	w.rewindAsked.Store(true)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// rewind goes back to the saved token as the database has it now, because positions read since
// can no longer be trusted (see the top of this file). Every delivery not acknowledged, and the
// floor, then hold the checkpoint at that token until acknowledged, and reading resumes after it:
// rows after it are delivered again. A client with no saved token (an ephemeral watcher, or a
// first save that was lost) starts again from the beginning of its table. Reader goroutine only.
func (w *Watcher) rewind(ctx context.Context, why string) error {
	if p := w.takePrefetch(); p != nil {
		w.spare = p.rows
	}
	w.ckMu.Lock()
	defer w.ckMu.Unlock()
	pos, err := w.loadPosition(ctx, true)
	if err != nil {
		return fmt.Errorf("go back to the saved token after a server recovery: %w", err)
	}
	w.rewindAsked.Store(false)
	w.saved, w.hasSaved, w.savedAt = pos, true, time.Now()
	func() {
		w.mu.Lock()
		defer w.mu.Unlock() // the ring's code runs under mu: a panic in it must not leave mu held
		w.ring.Rebase(pos)
		w.cursor = pos
		w.savedMirror = pos
	}()
	w.setMarked(pos)
	w.rewinds.Add(1)
	w.log.Warn("the server recovered since the last read: delivering again from the saved token",
		"why", why, "position", pos)
	return nil
}

// loadWithRetry loads the saved token into the cursor. It never guesses a position: while the
// token cannot be read it retries with backoff until it succeeds or ctx ends. A restored
// database is refused at once.
func (w *Watcher) loadWithRetry(ctx context.Context) error {
	retry := backoff.Backoff{Min: loadRetryMin, Max: loadRetryMax}
	failed := newRepeatLog(w.log, slog.LevelError, "cannot load the start position; retrying")
	for {
		err := w.load(ctx)
		if err == nil {
			failed.ok()
			w.health.ok(opLoad)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		op := opLoad
		if errors.As(err, new(changelogReadError)) {
			op = opRead
		}
		w.health.fail(op, err)
		if errors.Is(err, ErrRestoredDatabase) || errors.Is(err, ErrSharedSchema) { // retrying cannot help: an operator must act
			w.log.Error("refusing to start", "error", err)
			return err
		}
		wait := retry.Next()
		failed.fail("error", err, "retry_in", wait)
		if !backoff.Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// load reads the saved token, or picks and saves the start position of a new client, and
// starts reading there.
func (w *Watcher) load(ctx context.Context) error {
	w.ckMu.Lock()
	defer w.ckMu.Unlock()
	pos, err := w.loadPosition(ctx, false)
	if err != nil {
		return err
	}
	w.saved, w.hasSaved, w.savedAt = pos, true, time.Now()
	w.mu.Lock()
	w.cursor = pos
	w.savedMirror = pos
	w.loaded = true
	w.mu.Unlock()
	w.setMarked(pos)
	return nil
}

// loadPosition reads the saved token, or picks and saves the start position of a new client.
// It first finds out whether the changelog is upgraded (reads follow snapshot deltas) and, if
// so, checks the stored transaction ids against the database's counter. rewinding is set when
// the watcher goes back to the saved token after a server recovery: a client without one then
// starts from the beginning, since no start position taken before the recovery can be trusted.
// ckMu must be held; reader goroutine only.
func (w *Watcher) loadPosition(ctx context.Context, rewinding bool) (Position, error) {
	var skipFree, stats bool
	if err := w.cfg.DB.QueryRowContext(ctx, w.q.Detect, changelog.Quote(w.cfg.ChangelogTable),
		changelog.Quote(changelog.IncarnationTable(w.cfg.ChangelogTable))).Scan(&skipFree, &w.hasInc, &stats); err != nil {
		return Position{}, fmt.Errorf("inspect changelog %s: %w", w.cfg.ChangelogTable, err)
	}
	w.noteStats(stats)
	var (
		now position.Snapshot
		inc string
	)
	if skipFree {
		var err error
		if now, inc, err = w.transactionCounter(ctx); err != nil {
			return Position{}, err
		}
	} else {
		w.upgradeChecked = time.Now() // noticeUpgrade looks again upgradeCheckInterval later
	}
	if !skipFree && !w.legacyNoted {
		w.legacyNoted = true
		w.log.Warn("the changelog has no txid column: reads are not skip-free (a row whose transaction commits "+
			"behind the read position is found only through its NOTIFY); upgrade it with schema.Install, "+
			"or the statements it lists with DryRun; a running watcher then switches over by itself", "changelog", w.cfg.ChangelogTable)
	}
	if skipFree && !w.hasInc && !w.incNoted {
		w.incNoted = true
		w.log.Warn("the changelog has no incarnation table: after a server crash the watcher notices the "+
			"transaction counter going back only while it has not passed the ids seen before; run schema.Install to add it",
			"table", changelog.IncarnationTable(w.cfg.ChangelogTable))
	}
	if w.sh != nil {
		return w.loadShared(ctx, rewinding, skipFree, now, inc)
	}
	raw, found, err := w.claimToken(ctx, !rewinding)
	if err != nil {
		return Position{}, err
	}
	var (
		pos  Position
		save bool
	)
	switch {
	case !found && rewinding:
		if pos, err = w.beginning(ctx, skipFree, now); err != nil {
			return Position{}, err
		}
		save = true
	case !found:
		if pos, err = w.startPosition(ctx, skipFree, now); err != nil {
			return Position{}, err
		}
		save = true // so a restart before the first acknowledgement resumes here too
		w.log.Info("no saved token: starting", "position", pos, "from_beginning", w.cfg.StartFromBeginning)
	default:
		var table string
		pos, table, err = position.DecodeTableToken([]byte(raw))
		if table != "" && table != w.cfg.TableName && !rewinding {
			w.log.Warn("the saved token was written by a watcher of another table; Prune keeps this table's rows "+
				"for it only once it saves its own", "token_table", table)
		}
		if errors.Is(err, position.ErrTokenNeedsLookup) {
			pos, err = w.tokenRowPosition(ctx, pos.ID)
		}
		if err != nil {
			return Position{}, fmt.Errorf("load saved token of client %q: %w", w.cfg.ClientName, err)
		}
		if pos, save, err = w.resumePosition(ctx, pos, skipFree, now); err != nil {
			return Position{}, err
		}
		if !rewinding {
			w.log.Info("resuming after the saved token", "position", pos)
		}
	}
	if pos.Span != nil { // the snapshots were read in (or, for a saved token, survived into) inc
		s := *pos.Span
		s.Inc = inc
		pos.Span = &s
	}
	if save && !w.cfg.Ephemeral {
		if err := w.writeToken(ctx, pos, w.ackedSeq()); err != nil {
			return Position{}, fmt.Errorf("save start position to token table %s: %w", w.cfg.TokenTable, err)
		}
		w.ckWrites.Add(1)
	}
	w.skipFree.Store(skipFree)
	if skipFree {
		w.hints.Take() // noted before the load: snapshot deltas need no ids
	}
	return pos, nil
}

// changelogReadError is a failure to read the changelog while loading: health counts it as a
// read failure, not as one of the token table.
type changelogReadError struct{ error }

func (e changelogReadError) Unwrap() error { return e.error }

// transactionCounter returns the current snapshot of an upgraded changelog and the server's
// incarnation ("" without an incarnation table), after checking that no transaction id stored
// for the table is at or beyond it (a restored database).
func (r *reader) transactionCounter(ctx context.Context) (position.Snapshot, string, error) {
	var (
		text, inc string
		newest    sql.NullString
		err       error
	)
	if r.hasInc {
		err = r.queryIncarnation(ctx, r.q.DeltaStartInc, []any{r.cfg.TableName}, &text, &newest, &inc)
	} else {
		err = r.cfg.DB.QueryRowContext(ctx, r.q.DeltaStart, r.cfg.TableName).Scan(&text, &newest)
	}
	if err != nil {
		return position.Snapshot{}, "", changelogReadError{fmt.Errorf("read changelog: take snapshot: %w", err)}
	}
	now, err := position.ParseSnapshot(text)
	if err != nil {
		return position.Snapshot{}, "", err
	}
	if newest.Valid {
		x, err := strconv.ParseUint(newest.String, 10, 64)
		if err != nil {
			return position.Snapshot{}, "", fmt.Errorf("read changelog: newest txid %q: %w", newest.String, err)
		}
		if x >= now.Xmax {
			return position.Snapshot{}, "", fmt.Errorf("%w: the changelog holds txid %d, the current snapshot is %s",
				ErrRestoredDatabase, x, now)
		}
	}
	return now, inc, nil
}

// resumePosition adapts a saved token to the changelog: a legacy token on an upgraded changelog
// starts a switch-over at the current snapshot, cut by switchSnapshot (save reports that the new
// form must be saved at once, so a restart keeps the same switch-over snapshot); a token of an
// upgraded changelog on a legacy one resumes after its legacy position. now is a snapshot taken
// before the token was read (see notAhead).
func (s *saver) resumePosition(ctx context.Context, pos Position, skipFree bool, now position.Snapshot) (_ Position, save bool, err error) {
	switch {
	case skipFree && pos.Span == nil:
		snap, err := s.rd.switchSnapshot(ctx, pos, pos, now)
		if err != nil {
			return Position{}, false, err
		}
		pos.Span = &position.Span{Base: snap}
		s.log.Info("switching a legacy token over to snapshot deltas", "snapshot", snap)
		return pos, true, nil
	case skipFree:
		top := pos.Span.Base
		if pos.Span.HasEnd {
			top = pos.Span.End
		}
		return pos, false, s.notAhead(ctx, top, now)
	case pos.Span != nil:
		s.log.Warn("the saved token was written for a changelog with a txid column, which this one lacks; "+
			"resuming after its timestamp and eventID", "position", pos)
		return position.Make(pos.ChangedAt, pos.ID), false, nil
	}
	return pos, false, nil
}

// notAhead fails with ErrRestoredDatabase if top, the newest snapshot of a saved token, is ahead
// of the database's transaction counter. now was taken before the token was read, so a save that
// committed in between (another instance of the client, the previous owner of an exclusive
// client or of a Shared range, a transaction acknowledging with MarkProcessedTx) can hold a
// snapshot taken after now. Only a token still ahead of a snapshot taken after it was read is
// ahead of the counter: its snapshot was taken before its save committed, and on a running
// server a later snapshot's xmax is never below an earlier one's.
func (s *saver) notAhead(ctx context.Context, top, now position.Snapshot) error {
	if top.Xmax <= now.Xmax {
		return nil
	}
	after, _, err := s.rd.currentSnapshot(ctx)
	if err != nil {
		return changelogReadError{fmt.Errorf("read changelog: take snapshot: %w", err)}
	}
	if top.Xmax > after.Xmax {
		return fmt.Errorf("%w: the saved token's snapshot is %s, the current snapshot is %s",
			ErrRestoredDatabase, top, after)
	}
	return nil
}

// startPosition is where a client without a saved token starts: after the newest row of its
// table as the database sees it (on an upgraded changelog: after the current snapshot, so rows
// of transactions still open are ahead of it), or at the beginning.
func (s *saver) startPosition(ctx context.Context, skipFree bool, now position.Snapshot) (Position, error) {
	if s.cfg.StartFromBeginning {
		return s.beginning(ctx, skipFree, now)
	}
	var (
		ts  time.Time
		id  int64
		pos Position
	)
	err := s.cfg.DB.QueryRowContext(ctx, s.q.Newest, s.cfg.TableName).Scan(&ts, &id)
	switch {
	case errors.Is(err, sql.ErrNoRows): // nothing to skip
	case err != nil:
		return Position{}, changelogReadError{fmt.Errorf("read changelog: find newest position in %s: %w", s.cfg.ChangelogTable, err)}
	default:
		pos = position.Make(ts, id)
	}
	if skipFree {
		pos.Span = &position.Span{Seq: 1, Base: now}
	}
	return pos, nil
}

// beginning is the position before every row of the table: on an upgraded changelog, a
// switch-over from it (switchSnapshot): the rows without a txid in legacy order, then the rows
// with one in deltas.
func (s *saver) beginning(ctx context.Context, skipFree bool, now position.Snapshot) (Position, error) {
	if !skipFree {
		return Position{}, nil
	}
	snap, err := s.rd.switchSnapshot(ctx, Position{}, Position{}, now)
	if err != nil {
		return Position{}, err
	}
	return Position{Span: &position.Span{Base: snap}}, nil
}

// tokenRowPosition converts an id-only saved token by looking up its row's changed_at. If the
// row is gone, the position is placed before every row (replaying rather than skipping).
func (s *saver) tokenRowPosition(ctx context.Context, id int64) (Position, error) {
	var ts time.Time
	err := s.cfg.DB.QueryRowContext(ctx, s.q.RowTime, id).Scan(&ts)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		s.log.Warn("the saved token's changelog row no longer exists; replaying the table from the beginning", "id", id)
		return Position{ID: id}, nil
	case err != nil:
		return Position{}, fmt.Errorf("look up changelog %s row %d of an id-only token: %w", s.cfg.ChangelogTable, id, err)
	}
	return position.Make(ts, id), nil
}

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
func (s *saver) claimToken(ctx context.Context, claim bool) (raw string, found bool, err error) {
	if claim {
		s.fenced, s.epoch = false, 0
	}
	if claim && s.cfg.Exclusive && !s.cfg.Ephemeral {
		if err := s.cfg.DB.QueryRowContext(ctx, s.q.EpochColumn, changelog.Quote(s.cfg.TokenTable)).Scan(&s.fenced); err != nil {
			return "", false, fmt.Errorf("inspect token table %s: %w", s.cfg.TokenTable, err)
		}
		if s.fenced {
			return s.claimEpoch(ctx)
		}
		if !s.unfencedNoted {
			s.unfencedNoted = true
			s.log.Warn("the token table has no "+changelog.EpochColumn+" column: saves of exclusive watchers are not fenced, "+
				"so a watcher paused past the hand-over could overwrite its successor's token; upgrade it with "+
				"schema.Install, or the statements it lists with DryRun", "token_table", s.cfg.TokenTable)
		}
	}
	err = s.cfg.DB.QueryRowContext(ctx, s.q.LoadToken, s.cfg.ClientName).Scan(&raw)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("read token table %s: %w", s.cfg.TokenTable, err)
	}
	return raw, true, nil
}

// claimEpoch claims the client's next owner epoch on the lock session and returns the saved
// token. A client without a token row gets epoch 1 from its first save (claimNew).
func (s *saver) claimEpoch(ctx context.Context) (raw string, found bool, err error) {
	sess := s.excl.current()
	if sess == nil {
		return "", false, s.excl.lockLostErr()
	}
	c, o := lock.Halves(lock.Key(s.cfg.TokenTable, s.cfg.ClientName))
	row, err := sess.Query(ctx, s.q.ClaimEpoch, s.cfg.ClientName, string(itoa(c)), string(itoa(o)))
	if err != nil {
		return "", false, fmt.Errorf("claim an owner epoch in token table %s: %w", s.cfg.TokenTable, err)
	}
	if len(row) != 3 || row[0].String != "t" {
		s.loseLock(lock.ErrNotHeld)
		return "", false, s.excl.lockLostErr()
	}
	if !row[1].Valid {
		return "", false, nil
	}
	if s.epoch, err = strconv.ParseInt(row[1].String, 10, 64); err != nil {
		return "", false, fmt.Errorf("claim an owner epoch: %q: %w", row[1].String, err)
	}
	s.log.Info("claimed the client", "owner_epoch", s.epoch)
	return row[2].String, true, nil
}

// lockLostErr is why an exclusive watcher cannot claim or save: the error that stopped it.
func (x *exclusive) lockLostErr() error {
	if err := x.lostErr(); err != nil {
		return err
	}
	return fmt.Errorf("%w: the lock session was released", ErrExclusiveLost)
}
