package pgchangestreamtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// txAck is a MarkProcessedTx of the fake whose transaction has not ended: the checkpoint the
// transaction wrote, and the seq of the last delivery it acknowledges.
type txAck struct {
	tx  *sql.Tx
	p   pgchangestream.Position
	seq uint64
}

// MarkProcessedTx acknowledges token in tx, as [pgchangestream.Watcher.MarkProcessedTx] does:
// the acknowledgement takes effect only when tx commits. database/sql cannot tell whether a
// transaction committed, so the test says so: [FakeWatcher.Committed] applies what tx
// acknowledged (in memory at once, where the watcher applies it at its next save) and
// [FakeWatcher.RolledBack] forgets it. Until then nothing is acknowledged, and
// [FakeWatcher.Acked], [FakeWatcher.Saved] and Stats are unchanged.
//
// The fake executes nothing in tx, so tx may be a sqlmock transaction without an expectation
// for the write (or a real one). It checks what the watcher checks before writing: a nil tx, an
// ephemeral configuration and a fake not started yet are errors, a malformed token is an error
// wrapping [pgchangestream.ErrInvalidToken]; an empty or unknown token acknowledges nothing.
// While [FakeWatcher.FailSaves] is in effect, the write fails with its error. A failed call
// records nothing.
func (f *FakeWatcher) MarkProcessedTx(_ context.Context, tx *sql.Tx, token []byte) error {
	switch {
	case tx == nil:
		return errors.New("pgchangestreamtest: MarkProcessedTx: the transaction is nil")
	case f.cfg.Ephemeral:
		return errors.New("pgchangestreamtest: MarkProcessedTx: an ephemeral watcher saves no token; use MarkProcessed")
	}
	id, ok, err := position.ParseToken(token)
	if err != nil {
		return fmt.Errorf("pgchangestreamtest: MarkProcessedTx: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.started {
		return errors.New("pgchangestreamtest: MarkProcessedTx: the fake is not started")
	}
	a := txAck{p: f.checkpointLocked(), seq: f.ring.AckedSeq()}
	if ok {
		if s, m, hasMin, found := f.ring.PeekAck(id); found {
			a.p, a.seq = f.cursor, max(a.seq, s)
			if hasMin && m.Before(a.p) {
				a.p = m
			}
		}
	}
	if f.saveErr != nil {
		return fmt.Errorf("pgchangestreamtest: MarkProcessedTx: save checkpoint %s: %w", a.p, f.saveErr)
	}
	a.tx = tx
	switch i := f.openTxLocked(tx); {
	case i < 0:
		f.txAcks = append(f.txAcks, a)
	case f.txAcks[i].seq <= a.seq: // the later write of tx is the one it keeps
		f.txAcks[i] = a
	}
	return nil
}

// openTxLocked returns the index in txAcks of tx, or -1. mu must be held.
func (f *FakeWatcher) openTxLocked(tx *sql.Tx) int {
	return slices.IndexFunc(f.txAcks, func(a txAck) bool { return a.tx == tx })
}

// removeTxLocked removes tx from txAcks and returns its acknowledgement; ok is false when tx
// has none. mu must be held.
func (f *FakeWatcher) removeTxLocked(tx *sql.Tx) (a txAck, ok bool) {
	i := f.openTxLocked(tx)
	if i < 0 {
		return txAck{}, false
	}
	a = f.txAcks[i]
	f.txAcks = slices.Delete(f.txAcks, i, i+1)
	return a, true
}

// OpenTxs returns the transactions MarkProcessedTx acknowledged in that the test has not
// resolved with Committed or RolledBack, in the order of their first acknowledgement. A test
// whose consumer begins its transactions itself resolves them with it:
//
//	for _, tx := range fake.OpenTxs() {
//		fake.Committed(tx) // the consumer committed: the mock expected the commit
//	}
func (f *FakeWatcher) OpenTxs() []*sql.Tx {
	f.mu.Lock()
	defer f.mu.Unlock()
	txs := make([]*sql.Tx, len(f.txAcks))
	for i, a := range f.txAcks {
		txs[i] = a.tx
	}
	return txs
}

// Committed tells the fake that tx committed: what MarkProcessedTx acknowledged in it is applied,
// as the watcher applies the committed marker. The checkpoint tx wrote becomes
// [FakeWatcher.Saved], unless a save acknowledging later deliveries was stored first (the
// watcher's conditional write then leaves that one). A tx without acknowledgements, or one
// already ended, changes nothing.
func (f *FakeWatcher) Committed(tx *sql.Tx) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.removeTxLocked(tx)
	if !ok {
		return
	}
	if n := f.ring.AckSeq(a.seq); n > 0 {
		f.stats.Acked += uint64(n)
	}
	f.certified = max(f.certified, int(a.seq))
	if a.seq >= f.savedSeq {
		f.storeLocked(a.p, a.seq)
	}
}

// RolledBack tells the fake that tx rolled back: what MarkProcessedTx acknowledged in it is
// forgotten, and the deliveries stay pending.
func (f *FakeWatcher) RolledBack(tx *sql.Tx) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removeTxLocked(tx)
}
