package pgchangestream

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/pgchangestream/pgchangestream/internal/position"
)

// Acknowledgements in the caller's transaction (contract rule 19). MarkProcessedTx computes,
// under mu and changing nothing, the checkpoint that acknowledging a token would give, and
// writes it in the caller's transaction with a marker, "ack": {"w": <instance>, "seq": <s>}:
// this watcher (its random instance id) acknowledged every delivery up to seq s. Memory learns
// of the acknowledgement only from the database, once it is committed: while one may be
// outstanding, each save first reads the stored marker and acknowledges in memory the
// deliveries up to its seq (catchUpTxAcks).
//
// From the first MarkProcessedTx on, the watcher's own saves carry the marker too, and every
// marked statement is conditional: it writes nothing over a marker of this instance with a
// higher seq. So neither an own save nor an earlier transaction that commits after a later one
// moves the token back. An own save that wrote nothing for that reason applies the stored
// marker and computes again. Own saves take the row lock with NOWAIT: while a caller's
// transaction holds the token row they fail at once (errTokenLocked) and a later save tries
// again, so no watcher lock waits on a caller's transaction.

// errTokenLocked is wrapped by the error of a save that found the token row locked, by a
// transaction that acknowledged with MarkProcessedTx and has not ended yet.
var errTokenLocked = errors.New("the token row is locked by an open transaction (a MarkProcessedTx not yet " +
	"committed or rolled back); a later save tries again")

// errAckAhead is a save that wrote nothing because a later acknowledgement of this watcher was
// committed meanwhile; the save applied it and computes again.
var errAckAhead = errors.New("a later acknowledgement in a transaction was committed meanwhile")

// ackAheadTries bounds the saves computed again after errAckAhead: each try applies a marker
// committed after the previous one.
const ackAheadTries = 3

// MarkProcessedTx acknowledges token as [Watcher.MarkProcessed] does (cumulatively, in delivery
// order), but writes the checkpoint it gives in tx, the caller's transaction, so that the
// acknowledgement takes effect exactly when tx commits: effects written in the same transaction
// and the acknowledgement are kept or lost together. If tx commits, the acknowledgement holds: it
// is in the database at once, and in the watcher's memory (Stats, later saves) no later than its
// next save. If tx rolls back, nothing changed. Nothing is acknowledged in memory before the
// commit, and no later save of the watcher writes an older position over it.
//
// An empty token, or the token of no pending delivery, acknowledges nothing; tx then saves the
// current checkpoint, as MarkProcessed does. A token that is not a decimal int64 returns an
// error wrapping [ErrInvalidToken] and writes nothing.
//
// The write waits for the token row's lock, like any update in tx; while tx holds it, the
// watcher's own saves fail at once and are tried again later. An error means tx must not be
// committed as a processed event: roll it back. That includes an error wrapping [ErrFenced] (a
// later owner claimed the client: the write affected no row) or [ErrServerRecovered] (the
// server recovered since the position was read). An [Config.Ephemeral] watcher saves no token
// and refuses; so does a [Config.Shared] one, whose ranges have saved positions of their own
// ([Watcher.ProcessTx] works there). On a legacy changelog it refuses with
// [ErrLegacyChangelog] and writes nothing: a row committing behind the saved token would move the
// token back past acknowledgements already committed.
func (w *Watcher) MarkProcessedTx(ctx context.Context, tx *sql.Tx, token []byte) error {
	switch {
	case w.cfgErr != nil:
		return w.cfgErr
	case tx == nil:
		return errors.New("pgchangestream: MarkProcessedTx: the transaction is nil")
	case w.cfg.Ephemeral:
		return errors.New("pgchangestream: MarkProcessedTx: an ephemeral watcher saves no token; use MarkProcessed")
	case w.sh != nil:
		return errSharedTx
	case w.readsLegacy():
		return ErrLegacyChangelog
	}
	id, ok, err := position.ParseToken(token)
	if err != nil {
		return fmt.Errorf("pgchangestream: MarkProcessedTx: %w", err)
	}
	fenced, epoch, err := w.beginTxAck()
	if err != nil {
		return fmt.Errorf("pgchangestream: MarkProcessedTx: %w", err)
	}
	p, seq, err := w.peekCheckpoint(id, ok)
	if err != nil {
		return fmt.Errorf("pgchangestream: MarkProcessedTx: %w", err)
	}
	var inc string
	if p.Span != nil {
		inc = p.Span.Inc
	}
	tok := string(appendAck(position.EncodeToken(p, w.cfg.TableName), w.instance, seq))
	w.noteTxAck(seq)
	if err := w.writeInTx(ctx, tx, tok, seq, fenced, epoch, inc); err != nil {
		return fmt.Errorf("pgchangestream: MarkProcessedTx: save %s to token table %s: %w", p, w.cfg.TokenTable, err)
	}
	return nil
}

// beginTxAck switches the watcher's saves to marked ones (under ckMu, so no unmarked save is
// under way) and returns the fencing of the transactional write.
func (s *saver) beginTxAck() (fenced bool, epoch int64, _ error) {
	s.ckMu.Lock()
	defer s.ckMu.Unlock()
	fenced, epoch, err := s.txFenceLocked()
	if err == nil {
		s.txAcked = true
	}
	return fenced, epoch, err
}

// txFenceLocked returns the fencing of a write in a transaction: whether it is fenced, and by
// which owner epoch. ckMu must be held.
func (s *saver) txFenceLocked() (fenced bool, epoch int64, _ error) {
	if err := s.excl.lostErr(); err != nil {
		return false, 0, err
	}
	if s.fenced && s.epoch == 0 {
		return false, 0, errors.New("the client is not claimed yet: wait for the first event")
	}
	return s.fenced, s.epoch, nil
}

// noteTxAck records that a transaction may acknowledge up to seq, so that saves look for its
// marker. It acknowledges nothing.
func (s *saver) noteTxAck(seq uint64) {
	for {
		old := s.txSeq.Load()
		if seq <= old || s.txSeq.CompareAndSwap(old, seq) {
			return
		}
	}
}

// catchUpTxAcks acknowledges in memory what a committed MarkProcessedTx of this watcher
// acknowledged, while one may be outstanding. It reads the committed row, so it never waits for
// an open transaction. ckMu must be held.
func (s *saver) catchUpTxAcks(ctx context.Context) error {
	if !s.txAcked || s.txSeq.Load() <= s.rd.ackedSeq() {
		return nil
	}
	seq, mine, _, err := s.readAck(ctx, s.cfg.DB)
	if err != nil {
		return fmt.Errorf("read the acknowledgement in token table %s: %w", s.cfg.TokenTable, err)
	}
	if mine {
		s.rd.applyTxAck(seq)
	}
	return nil
}

// queryer is what reading the token row needs: a *sql.DB, or a caller's *sql.Tx.
type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// readAck reads the stored token's marker: mine when this watcher wrote it, with its seq;
// found is false when the client has no token row.
func (s *saver) readAck(ctx context.Context, q queryer) (seq uint64, mine, found bool, err error) {
	var instance, seqText sql.NullString
	err = q.QueryRowContext(ctx, s.q.ReadAck, s.cfg.ClientName).Scan(&instance, &seqText)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, false, false, nil
	case err != nil:
		return 0, false, false, err
	case instance.String != s.instance || !seqText.Valid:
		return 0, false, true, nil
	}
	seq, err = strconv.ParseUint(seqText.String, 10, 64)
	if err != nil {
		return 0, false, true, fmt.Errorf("acknowledgement seq %q: %w", seqText.String, err)
	}
	return seq, true, true, nil
}

// appendAck returns token JSON tok with the marker of instance's acknowledgements up to seq.
func appendAck(tok []byte, instance string, seq uint64) []byte {
	b := append(tok[:len(tok)-1:len(tok)-1], `,"ack":{"w":"`...)
	b = append(b, instance...)
	b = append(b, `","seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	return append(b, "}}"...)
}

// newInstanceID returns the random id that names a watcher's acknowledgement markers.
func newInstanceID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// saveArgs returns the parameters of a save statement (see changelog.SaveTokenSQL).
func saveArgs(client, tok string, fenced bool, epoch int64, inc string) []any {
	args := []any{client, tok}
	if fenced {
		args = append(args, epoch)
	}
	if inc != "" {
		args = append(args, inc)
	}
	return args
}
