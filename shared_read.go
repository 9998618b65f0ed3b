package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/lease"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// A Shared member reads with one cursor over all the ranges it owns. Ranges it took over may
// have been saved at other positions (their former owners read with cursors of their own, over
// other snapshots): the member then starts at a position behind all of them (the intersection
// of their snapshots) and skips, in each range, the rows that range's own saved position
// certifies (its floor). A floor is dropped once the member's checkpoint certifies all it did;
// until then the range's saved position is left as it is, so it never goes back.
//
// Hand-overs run on the reader goroutine between batches: the member stops delivering, waits
// until every delivery is acknowledged, saves, releases the ranges the split no longer gives it,
// claims those it gives it that are free (or whose owner's lease ran out), and reads on from
// its ranges' saved positions. A hand-over waits while floors remain (the checkpoint has not yet
// passed what a range's former owner certified), so that each range's saved position is exact
// when it is released.

// sharedView is what a member owns and how its reads are filtered. Never changed once made.
type sharedView struct {
	owned  []int // ascending
	mine   [SharedRanges]bool
	floors map[int]Position // the saved positions of the ranges ahead of the reads' start
}

func newSharedView(owned []int, floors map[int]Position) *sharedView {
	v := &sharedView{owned: owned, floors: floors}
	for _, r := range owned {
		v.mine[r] = true
	}
	return v
}

// sharedReadQueries returns the row reads of a member that owns ranges (ascending, at least
// one): they ask for the units from the first range's to the last range's, one condition the
// index checks; rows of ranges between them that the member does not own are skipped when read.
func sharedReadQueries(cfg Config, ranges []int) *changelog.Reads {
	iv := lease.Cover(ranges, unitsPerRange)
	cl := cfg.ChangelogTable
	u := &changelog.UnitReads{
		Cond: ` AND ` + changelog.UnitExpression(cl) + ` BETWEEN ` + strconv.Itoa(iv.Lo) + ` AND ` + strconv.Itoa(iv.Hi),
		Expr: changelog.UnitExpression(cl),
	}
	rq := changelog.NewReads(changelog.Quote(cl), strconv.Itoa(cfg.BatchSize), strconv.Itoa(cfg.BatchSize+1), u)
	return &rq
}

// skipShared reports whether a member skips the row read at pos: its range is not the
// member's, or the range's floor certifies it. Reader goroutine only.
func (s *sharedMember) skipShared(row *changelogRow, pos Position) bool {
	v := s.view.Load()
	r := int(row.Unit) / unitsPerRange
	if r < 0 || r >= SharedRanges || !v.mine[r] {
		return true
	}
	f, ok := v.floors[r]
	return ok && rowCertified(f, pos, row.Xid)
}

// rowCertified reports whether saved position p certifies the row read at pos, written by
// transaction xid: resuming after p would not read it again. p and pos may come from different
// readers of the same client (their deltas start at different snapshots); the legacy part of a
// switch-over is the same for all of them (the client's ranges start from one token).
func rowCertified(p, pos Position, xid uint64) bool {
	switch {
	case !pos.InDelta(): // a row of the legacy part, which every delta position has passed
		return p.InDelta() || !p.Before(pos)
	case !p.InDelta():
		return false
	case !p.Span.Base.Running(xid):
		return true
	}
	return p.InRows && !p.Span.End.Running(xid) && pos.ID <= p.ID
}

// covers reports whether position c certifies every row p certifies (it may say no when it
// does: a floor then stays a little longer).
func covers(c, p Position) bool {
	switch {
	case !p.InDelta():
		return c.InDelta() || !c.Before(p)
	case !c.InDelta():
		return false
	}
	return samePosition(c, p) || p.Top().Within(c.Span.Base)
}

// samePosition reports whether p and q are the same position in the same form.
func samePosition(p, q Position) bool {
	switch {
	case p.Compare(q) != 0 || (p.Span == nil) != (q.Span == nil) || p.InRows != q.InRows:
		return false
	case p.Span == nil:
		return true
	case !p.Span.Base.Equal(q.Span.Base):
		return false
	}
	return !p.InRows || p.Span.End.Equal(q.Span.End)
}

// sharedStart returns where a member that owns ranges (ascending) saved at ps starts reading,
// and the floors of the ranges saved ahead of it. With no range it is the start of the delta
// after now (nothing is read or saved).
func sharedStart(ranges []int, ps []Position, now position.Snapshot) (Position, map[int]Position) {
	if len(ps) == 0 {
		return Position{Span: &position.Span{Seq: 1, Base: now}}, nil
	}
	x := ps[0]
	for _, p := range ps[1:] {
		if p.Before(x) {
			x = p
		}
	}
	if x.InDelta() {
		base := ps[0].Span.Base
		for _, p := range ps[1:] {
			base = position.Intersect(base, p.Span.Base)
		}
		x = Position{ChangedAt: x.ChangedAt, ID: x.ID, Span: &position.Span{Seq: 1, Base: base}}
	}
	var floors map[int]Position
	for i, p := range ps {
		if !samePosition(p, x) {
			if floors == nil {
				floors = make(map[int]Position)
			}
			floors[ranges[i]] = p
		}
	}
	return x, floors
}

// loadShared is loadPosition for a Shared member: it joins (once), gives the client's ranges
// their start token if they have none, claims its ranges of the split and returns where it
// starts reading. A rewind only reads its ranges' saved positions again. ckMu must be held;
// reader goroutine only.
func (w *Watcher) loadShared(ctx context.Context, rewinding bool, skipFree bool, now position.Snapshot, inc string) (Position, error) {
	if !skipFree {
		return Position{}, fmt.Errorf("%w: changelog %s has no txid column", ErrSharedSchema, w.cfg.ChangelogTable)
	}
	if !rewinding {
		if err := w.join(ctx); err != nil {
			return Position{}, err
		}
		if err := w.initRanges(ctx, now, inc); err != nil {
			return Position{}, err
		}
		if _, err := w.coordinateOnce(ctx); err != nil {
			return Position{}, err
		}
		w.sh.mu.Lock()
		claimable := w.sh.claimable
		w.sh.mu.Unlock()
		if err := w.sh.claimRanges(ctx, claimable); err != nil {
			return Position{}, err
		}
		// Ranges claimed from other members may have been saved at snapshots taken after now:
		// check them against a snapshot taken after the claim.
		var err error
		if now, inc, err = w.currentSnapshot(ctx); err != nil {
			return Position{}, fmt.Errorf("take snapshot: %w", err)
		}
	}
	w.skipFree.Store(true)
	w.hints.Take()
	return w.loadOwned(ctx, now, inc)
}

// initRanges gives the client's ranges, if they have no rows yet, the start token: the client's
// saved token (a client that ran unshared before), else the start of a new client.
func (w *Watcher) initRanges(ctx context.Context, now position.Snapshot, inc string) error {
	raw, found, err := w.claimToken(ctx, false)
	if err != nil {
		return err
	}
	var pos Position
	if found {
		if pos, err = position.DecodeToken([]byte(raw)); errors.Is(err, position.ErrTokenNeedsLookup) {
			pos, err = w.tokenRowPosition(ctx, pos.ID)
		}
		if err != nil {
			return fmt.Errorf("load saved token of client %q: %w", w.cfg.ClientName, err)
		}
		if pos, _, err = w.resumePosition(ctx, pos, true, now); err != nil {
			return err
		}
	} else if pos, err = w.startPosition(ctx, true, now); err != nil {
		return err
	}
	res, err := w.cfg.DB.ExecContext(ctx, w.sh.q.initRanges, w.cfg.ClientName, string(position.EncodeToken(pos, w.cfg.TableName)))
	if err != nil {
		return fmt.Errorf("create the ranges of client %q: %w", w.cfg.ClientName, err)
	}
	if n, _ := res.RowsAffected(); n > 0 {
		w.log.Info("created the client's ranges", "position", pos, "ranges", n)
	}
	return nil
}

// claimRanges claims the ranges of want that are free or whose owner's lease ran out.
func (s *sharedMember) claimRanges(ctx context.Context, want []int) error {
	if len(want) == 0 {
		return nil
	}
	rows, err := s.db.QueryContext(ctx, s.q.claim, s.client, s.id.Load(), changelog.Array(int64s(want)), s.lease.Milliseconds())
	if err != nil {
		return fmt.Errorf("claim ranges: %w", err)
	}
	defer rows.Close()
	var got []int64
	for rows.Next() {
		var r int64
		if err := rows.Scan(&r); err != nil {
			return err
		}
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("claim ranges: %w", err)
	}
	if len(got) > 0 {
		s.log.Info("claimed ranges", "member", s.id.Load(), "ranges", got)
	}
	return nil
}

// loadOwned reads the saved positions of the ranges the member owns, and sets the view and the
// reads from them; it returns where reading starts. ckMu must be held; reader goroutine only.
func (w *Watcher) loadOwned(ctx context.Context, now position.Snapshot, inc string) (Position, error) {
	rows, err := w.cfg.DB.QueryContext(ctx, w.sh.q.load, w.cfg.ClientName, w.sh.id.Load())
	if err != nil {
		return Position{}, fmt.Errorf("load the ranges' saved positions: %w", err)
	}
	var (
		owned []int
		ps    []Position
	)
	err = func() error {
		defer rows.Close()
		for rows.Next() {
			var (
				r   int
				raw string
			)
			if err := rows.Scan(&r, &raw); err != nil {
				return err
			}
			p, err := position.DecodeToken([]byte(raw))
			if err != nil {
				return fmt.Errorf("client %q range %d: %w", w.cfg.ClientName, r, err)
			}
			owned, ps = append(owned, r), append(ps, p)
		}
		return rows.Err()
	}()
	if err == nil { // with the rows closed: the checks query
		err = w.switchLegacyRanges(ctx, ps, now)
	}
	for i := 0; err == nil && i < len(ps); i++ {
		if ps[i], _, err = w.resumePosition(ctx, ps[i], true, now); err != nil {
			err = fmt.Errorf("range %d: %w", owned[i], err)
		}
	}
	if err != nil {
		return Position{}, fmt.Errorf("load the ranges' saved positions: %w", err)
	}
	x, floors := sharedStart(owned, ps, now)
	if x.Span != nil {
		s := *x.Span
		s.Inc = inc
		x.Span = &s
	}
	w.sh.view.Store(newSharedView(owned, floors))
	w.ownGen.Add(1)
	if len(owned) > 0 {
		w.rq = sharedReadQueries(w.cfg, owned)
	}
	w.pager.drop()
	w.log.Info("reading the member's ranges", "member", w.sh.id.Load(), "ranges", owned, "position", x, "floors", len(floors))
	return x, nil
}

// switchLegacyRanges switches the ranges saved at legacy positions (a reset) over at one
// snapshot, cut for all of them (switchSnapshot from the lowest to the highest): the legacy part
// of a switch-over is the same for every range of the client (see rowCertified).
func (w *Watcher) switchLegacyRanges(ctx context.Context, ps []Position, now position.Snapshot) error {
	var lo, hi *Position
	for i := range ps {
		if ps[i].Span == nil {
			if lo == nil || ps[i].Before(*lo) {
				lo = &ps[i]
			}
			if hi == nil || hi.Before(ps[i]) {
				hi = &ps[i]
			}
		}
	}
	if lo == nil {
		return nil
	}
	s, err := w.switchSnapshot(ctx, *lo, *hi, now)
	if err != nil {
		return err
	}
	for i := range ps {
		if ps[i].Span == nil {
			ps[i].Span = &position.Span{Base: s}
		}
	}
	w.log.Info("switching the ranges' legacy tokens over to snapshot deltas", "snapshot", s)
	return nil
}

// handOver releases and claims ranges as the split asks, between two batches: it waits until
// every delivery is acknowledged and no rerun of a parked event runs (none starts until it
// returns), saves, and reads on from the saved positions of the ranges it then owns. It does
// nothing yet while floors remain after the save. Reader goroutine only.
func (w *Watcher) handOver(ctx context.Context) error {
	if p := w.takePrefetch(); p != nil {
		w.spare = p.rows
	}
	w.sh.holdReruns(true)
	defer w.sh.holdReruns(false)
	for {
		if _, _, _, busy := w.checkpoint(); !busy && w.sh.rerunsIdle() {
			break
		}
		if err := w.excl.lostErr(); err != nil {
			return err
		}
		if !backoff.Sleep(ctx, 5*time.Millisecond) {
			return ctx.Err()
		}
	}
	w.ckMu.Lock()
	defer w.ckMu.Unlock()
	var obs SaveObservation
	if _, err := w.writeCheckpointOnce(ctx, saveChanged, &obs); err != nil {
		return err
	}
	v := w.sh.view.Load()
	if len(v.floors) > 0 {
		return nil // asked again at the next batch, once the reads passed the floors
	}
	w.sh.changeAsked.Store(false) // before looking at the target: a later change asks again
	w.sh.mu.Lock()
	target, claimable := w.sh.target, w.sh.claimable
	w.sh.mu.Unlock()
	var release []int
	for _, r := range v.owned {
		if !slices.Contains(target, r) {
			release = append(release, r)
		}
	}
	if len(release) > 0 {
		if _, err := w.cfg.DB.ExecContext(ctx, w.sh.q.release, w.cfg.ClientName, w.sh.id.Load(), changelog.Array(int64s(release))); err != nil {
			w.sh.changeAsked.Store(true)
			return fmt.Errorf("release ranges: %w", err)
		}
		w.log.Info("released ranges", "member", w.sh.id.Load(), "ranges", release)
	}
	if err := w.sh.claimRanges(ctx, claimable); err != nil {
		w.sh.changeAsked.Store(true)
		return err
	}
	now, inc, err := w.currentSnapshot(ctx)
	if err != nil {
		w.sh.changeAsked.Store(true)
		return fmt.Errorf("hand over: take snapshot: %w", err)
	}
	x, err := w.loadOwned(ctx, now, inc)
	if err != nil {
		w.sh.changeAsked.Store(true)
		return err
	}
	w.saved, w.hasSaved, w.savedAt = x, true, time.Now()
	w.mu.Lock()
	w.cursor, w.savedMirror = x, x
	w.mu.Unlock()
	w.sh.handOvers.Add(1)
	return nil
}

// int64s converts ranges for changelog.Array.
func int64s(xs []int) []int64 {
	out := make([]int64, len(xs))
	for i, x := range xs {
		out[i] = int64(x)
	}
	return out
}

// ProcessTx in a Shared member. The transactional claim of an event (ackrows.go) is fenced by
// the event's range, the unit of its changelog row divided by 16: it inserts the
// acknowledgement row only while the range row names this member as its owner, and locks that
// row FOR KEY SHARE until the handler's transaction ends. The member's own saves and releases
// update the row without changing a key column, so they take FOR NO KEY UPDATE, which does not
// conflict with KEY SHARE: nothing of the member waits for its own handlers.
//
// Another member claims a range with FOR UPDATE, which conflicts with KEY SHARE, and with SKIP
// LOCKED: a range whose former owner (dead, paused, or past its lease) still has a claim in an
// open transaction is skipped, not waited for, so a claim never blocks the member's reader.
// Its coordinator still sees the range free or of a member not live (claimableRanges), so it
// asks again at its next look and claims the range once those transactions ended: committed
// (their acknowledgement rows then tell the new owner that the events are done), rolled back,
// or ended by the server after Config.LockSessionTimeout idle (the idle timeout the claim sets).
// Once the range is claimed, every later claim of the former owner inserts nothing and finds no
// acknowledgement row: it fails with ErrFenced and the former owner stops. So each event's
// effects commit once across members, whatever their pauses and crashes.
//
// A member deletes the acknowledgement rows of the ranges it owns that its saved checkpoint
// certifies, except in ranges with a floor (their saved position is not the member's yet), and
// the rows of changelog rows that are gone. The ranges and the checkpoint are read together
// under ckMu, and the statement checks, holding the range rows FOR KEY SHARE, that the member
// still owns them; a range it gained since is not in the list.

// claimAckShared is claimAck for a Shared member: it claims event id in tx while the member owns
// the event's range (idle is the transaction's idle timeout, in ms).
func (w *Watcher) claimAckShared(ctx context.Context, tx *sql.Tx, id int64, idle string) (bool, error) {
	member := w.sh.id.Load()
	claimed, err := w.insertClaim(ctx, tx, id, w.sh.q.claimAck, w.cfg.ClientName, id, member, idle)
	if err != nil || claimed {
		return claimed, err
	}
	var acked, exists bool
	if err := tx.QueryRowContext(ctx, w.sh.q.ackState, w.cfg.ClientName, id).Scan(&acked, &exists); err != nil {
		return false, fmt.Errorf("claim event %d wrote nothing; checking why: %w", id, err)
	}
	switch {
	case acked:
		return false, nil
	case !exists:
		return false, fmt.Errorf("claim event %d: its changelog row is gone, so its range (and its owner) is unknown", id)
	}
	return false, w.rangeFenced(member, id, "processed")
}

// rangeFenced stops a Shared member whose write for event id (a claim, a park) was refused
// because it no longer owns the event's range, and returns the error wrapping ErrFenced. what
// says what was being done with the event.
func (w *Watcher) rangeFenced(member, id int64, what string) error {
	err := fmt.Errorf("%w: member %d no longer owns the range of event %d", ErrFenced, member, id)
	w.stopOwning(err, "fenced off: another member took over the range of an event being "+what+"; stopping")
	return err
}

// sharedCompaction returns the condition, after compactAcks' certification predicate, that
// restricts it to the ranges the member owns without a floor, and adds its parameters. ckMu
// must be held, so that the view and saved (the checkpoint the caller read) go together.
func (s *sharedMember) sharedCompaction(arg func(any) string) string {
	v := s.view.Load()
	ranges := make([]int64, 0, len(v.owned))
	for _, r := range v.owned {
		if _, ok := v.floors[r]; !ok {
			ranges = append(ranges, int64(r))
		}
	}
	return s.q.compactOwned + arg(s.id.Load()) + ` AND r.range_no = ANY(` + arg(changelog.Array(ranges)) + `::int2[]) FOR KEY SHARE)`
}
