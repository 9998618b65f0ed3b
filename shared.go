package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/lease"
)

const (
	// SharedUnits is the number of units a row's key hashes to. A row's unit is fixed when the
	// row is written (see [UnitOf]).
	SharedUnits = changelog.Units
	// SharedRanges is the number of ranges the units are grouped in for [Config.Shared]: range
	// r holds the units r*16 to r*16+15. A range is the part of a client's rows that has one
	// saved position and one owner at a time; members divide the ranges between them.
	SharedRanges = 64
	// unitsPerRange is the number of units in a range.
	unitsPerRange = SharedUnits / SharedRanges
)

// UnitOf returns the unit of a row whose key is key: the first four bytes of the key's MD5
// digest, as a big-endian number, modulo [SharedUnits]. It is the Go twin of the changelog's
// SQL function <changelog>_unit(text), which the trigger function and the changelog's index use,
// and gives the same value on every PostgreSQL version.
func UnitOf(key string) int { return changelog.UnitOf(key) }

// A Shared watcher is a member of its client. Its membership lives in two tables beside the
// changelog: <changelog>_members, one row per member with a lease on the server's clock, and
// <changelog>_ranges, one row per range with its owner and its saved position (resume_token, as
// in the token table). There is no leader: every member renews its own lease, deletes the rows
// of members whose lease ran out, and computes from the live members the ranges it is to own
// (internal/lease), the same split on every member. It releases the ranges it is no longer to
// own only once its deliveries are acknowledged (the reader's hand-over, shared_read.go), and
// claims a range only while it is free or its owner's lease ran out. A member keeps delivering
// only until a local deadline that ends before its lease, counted from the start of its last
// successful renewal on its monotonic clock, and its Events channel has no buffer, so a member
// paused past its lease delivers nothing when it wakes but the one event it was offering (see
// Watcher.send); every save of a range is fenced to its owner, so its saves are then refused.

// errSharedTx refuses MarkProcessedTx in a Shared watcher: its ranges each have a saved
// position, which one write in the caller's transaction cannot move together.
var errSharedTx = errors.New("pgchangestream: MarkProcessedTx is not available to Shared watchers " +
	"(each of their ranges has a saved position of its own): use ProcessTx")

// sharedTick is the renewal period as a part of the lease: a member renews five times per lease,
// and looks at the split as often (faster while a hand-over is under way, see sharedBusyTick).
const (
	sharedTicksPerLease = 5
	sharedBusyTick      = 200 * time.Millisecond
	// sharedMargin is the part of the lease a member does not use: it stops delivering this much
	// before the server would let another member claim its ranges.
	sharedMarginParts = 5
)

// sharedQueries are the statements of membership. $1 is always the client name, $2 the member.
type sharedQueries struct {
	detect     string // $1 changelog, $2 ranges table (quoted): the unit column and the tables exist
	join       string // $2 the member's name, $3 the lease in ms: the new member's id
	renew      string // $3 the lease in ms
	expire     string // $3 the lease in ms: deletes the members whose lease ran out, while $2 is settled
	state      string // $3 the lease in ms: the live members, the owner (0: none) of each range, whether $2 is settled
	initRanges string // $2 the start token: one row per range, unless they exist
	claim      string // $3 ranges, $4 the lease in ms: those free, or, while $2 is settled, of members whose lease ran out (shared_read.go)
	release    string // $3 ranges owned by $2: free them
	leave      string // frees every range of $2 and deletes its row
	load       string // the ranges $2 owns and their tokens
	save       string // $3 the token, $4 ranges: only those $2 still owns
	saveInc    string // save, while the incarnation is still $5
	// claimAck, ackState and compactOwned are ProcessTx's (shared_read.go), with $2 the changelog
	// id: claimAck claims it while member $3 owns its range ($4 the idle timeout in ms);
	// ackState: whether its acknowledgement row and its changelog row exist; compactOwned,
	// followed by the member's placeholder, restricts compactAcks to the member's ranges.
	claimAck, ackState, compactOwned string
	// parkFence fences the insert of client $1's parked event $4 (deadletter.Store.Insert) to
	// member $9 owning its range, locking the range row FOR KEY SHARE.
	parkFence string
	// rerunOwned: the range of changelog row $3 and whether member $2 owns it (no row when the
	// changelog row is gone).
	rerunOwned string
	// releasedOwned restricts the parked events an operator released (client $1, limit $2) to
	// those of the ranges member $3 owns, so that one member runs each again, and those whose
	// changelog row is gone (their range is unknown: any member may run them).
	releasedOwned string
}

func buildSharedQueries(cfg Config) sharedQueries {
	cl := cfg.ChangelogTable
	mt, rt := changelog.Quote(changelog.MemberTable(cl)), changelog.Quote(changelog.RangeTable(cl))
	qcl, acks, parked := changelog.Quote(cl), changelog.Quote(changelog.AckTable(cl)), changelog.Quote(changelog.ParkedTable(cl))
	lease := `now() + $3 * interval '1 millisecond'`
	// rangeOf is the range of the changelog row whose id is the expression id.
	rangeOf := func(id string) string {
		return `(SELECT ` + changelog.UnitExpression(cl) + ` / ` + strconv.Itoa(unitsPerRange) + ` FROM ` + qcl + ` WHERE id = ` + id + `)`
	}
	// settled: member $2's lease holds and has held, without a lapse, for a lease ($3 ms, or the
	// placeholder given): only a settled member removes members whose lease ran out or claims
	// their ranges. It is checked when the statement runs, so one sent before an outage of the
	// server (or of the member) and run after it, when every lease has run out, does neither.
	settled := func(leaseMS string) string {
		return `EXISTS (SELECT FROM ` + mt + ` me WHERE me.client_name = $1 AND me.member = $2 AND me.lease_until > now()
		AND me.valid_since <= now() - ` + leaseMS + ` * interval '1 millisecond')`
	}
	incarnation := changelog.IncarnationSQL(cfg.ChangelogTable)
	save := `UPDATE ` + rt + ` SET resume_token = $3::jsonb, last_updated = now()
	WHERE client_name = $1 AND owner = $2 AND range_no = ANY($4::int2[])`
	return sharedQueries{
		detect: `SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'unit' AND NOT attisdropped)
		AND to_regclass($2) IS NOT NULL`,
		join: `INSERT INTO ` + mt + ` (client_name, member, name, lease_until)
	VALUES ($1, nextval(` + changelog.QuoteLiteral(changelog.Quote(changelog.MemberSequence(cl))) + `), $2, ` + lease + `) RETURNING member`,
		renew: `UPDATE ` + mt + ` SET lease_until = ` + lease + `,
		valid_since = CASE WHEN lease_until < now() THEN now() ELSE valid_since END WHERE client_name = $1 AND member = $2`,
		expire: `DELETE FROM ` + mt + ` WHERE client_name = $1 AND lease_until < now() AND ` + settled("$3"),
		state: `SELECT ARRAY(SELECT member FROM ` + mt + ` WHERE client_name = $1 AND lease_until > now() ORDER BY member)::text,
	ARRAY(SELECT COALESCE(owner, 0) FROM ` + rt + ` WHERE client_name = $1 ORDER BY range_no)::text, ` + settled("$3"),
		initRanges: `INSERT INTO ` + rt + ` (client_name, range_no, resume_token)
	SELECT $1, g, $2::jsonb FROM generate_series(0, ` + strconv.Itoa(SharedRanges-1) + `) AS g ON CONFLICT DO NOTHING`,
		claim: `UPDATE ` + rt + ` AS r SET owner = $2, last_updated = now()
	WHERE r.client_name = $1 AND r.range_no IN (SELECT f.range_no FROM ` + rt + ` AS f
		WHERE f.client_name = $1 AND f.range_no = ANY($3::int2[])
			AND EXISTS (SELECT FROM ` + mt + ` m WHERE m.client_name = $1 AND m.member = $2 AND m.lease_until > now())
			AND (f.owner IS NULL OR f.owner = $2 OR (` + settled("$4") + ` AND NOT EXISTS (
				SELECT FROM ` + mt + ` m WHERE m.client_name = $1 AND m.member = f.owner AND m.lease_until > now())))
		FOR UPDATE SKIP LOCKED)
	RETURNING r.range_no`,
		release: `UPDATE ` + rt + ` SET owner = NULL, last_updated = now() WHERE client_name = $1 AND owner = $2 AND range_no = ANY($3::int2[])`,
		leave: `WITH freed AS (UPDATE ` + rt + ` SET owner = NULL, last_updated = now() WHERE client_name = $1 AND owner = $2)
	DELETE FROM ` + mt + ` WHERE client_name = $1 AND member = $2`,
		load:    `SELECT range_no, resume_token::text FROM ` + rt + ` WHERE client_name = $1 AND owner = $2 ORDER BY range_no`,
		save:    save,
		saveInc: save + ` AND ` + incarnation + ` = $5`,
		// The unit expressions name the changelog's columns unqualified: in these statements
		// only the changelog's rows have them.
		claimAck: `INSERT INTO ` + acks + ` (client_name, changelog_id) SELECT r.client_name, $2::bigint
	FROM ` + rt + ` AS r, (SELECT set_config('idle_in_transaction_session_timeout', $4, true)) AS idle
	WHERE r.client_name = $1 AND r.owner = $3
		AND r.range_no = ` + rangeOf("$2::bigint") + `
	FOR KEY SHARE OF r ON CONFLICT DO NOTHING`,
		ackState: `SELECT EXISTS (SELECT FROM ` + acks + ` WHERE client_name = $1 AND changelog_id = $2),
	EXISTS (SELECT FROM ` + qcl + ` WHERE id = $2)`,
		parkFence: ` FROM ` + rt + ` AS r WHERE r.client_name = $1 AND r.owner = $9
		AND r.range_no = ` + rangeOf("$4::bigint") + `
	FOR KEY SHARE OF r`,
		rerunOwned: `SELECT r.range_no, r.owner IS NOT DISTINCT FROM $2 FROM ` + rt + ` AS r
	WHERE r.client_name = $1 AND r.range_no = ` + rangeOf("$3::bigint"),
		releasedOwned: ` AND (NOT EXISTS (SELECT FROM ` + qcl + ` c WHERE c.id = ` + parked + `.changelog_id)
		OR EXISTS (SELECT FROM ` + rt + ` AS r WHERE r.client_name = $1 AND r.owner = $3
			AND r.range_no = ` + rangeOf(parked+`.changelog_id`) + `))`,
		compactOwned: ` AND EXISTS (SELECT FROM ` + rt + ` AS r WHERE r.client_name = $1 AND r.range_no = ` +
			changelog.UnitExpression(cl) + ` / ` + strconv.Itoa(unitsPerRange) + ` AND r.owner = `,
	}
}

// sharedMember is the membership of a Shared watcher.
type sharedMember struct {
	// The watcher's database, client name, logger, health record and exclusive state: set by
	// newWatcher, immutable after.
	db     *sql.DB
	client string
	log    *slog.Logger
	health *health
	excl   *exclusive

	q     sharedQueries // immutable
	lease time.Duration // immutable
	name  string        // immutable: Config.MemberName or host:pid
	base  time.Time     // immutable: the monotonic origin of deadline

	// id is the member's id, 0 until the reader joins (once; read by the coordinator, saves and
	// Stats afterwards).
	id atomic.Int64
	// deadline is when deliveries must stop unless the lease is renewed, in nanoseconds since
	// base: written by the coordinator after each renewal, read before each delivery.
	deadline atomic.Int64
	// changeAsked: the coordinator found ranges to release or to claim; the reader hands over
	// at its next batch and clears it.
	changeAsked atomic.Bool
	// view is what the member owns and how its reads are filtered: replaced (never changed)
	// under ckMu, by the reader's hand-over and by saves dropping floors; read by the reader
	// and the saves.
	view atomic.Pointer[sharedView]

	handOvers atomic.Uint64 // added by the reader after each hand-over that changed its ranges
	// leaveWhenDrained: Close found deliveries not acknowledged; the save that acknowledges the
	// last of them leaves the members (set by Close, cleared once by that save).
	leaveWhenDrained atomic.Bool
	// lost is cancelled (once) when the member stops owning its ranges: fenced off, or its
	// membership gone; its handlers' contexts end with it.
	lost     context.Context
	markLost context.CancelFunc
	// closing is cancelled (by Close, before it waits for the goroutines) to end the renewals
	// that go on after Start's context ended while Process finishes (see renewWhileProcessing).
	closing      context.Context
	closeRenewal context.CancelFunc

	mu sync.Mutex // guards target and claimable
	// target: the ranges the split gives this member; claimable: those of them it may claim,
	// from the coordinator's last look.
	target, claimable []int

	rerunMu sync.Mutex // guards reruns and handing (parked.go)
	// reruns: the reruns of parked events running (from startRerun to its end); handing: a
	// hand-over is under way (set and cleared by the reader), so no rerun starts.
	reruns  int
	handing bool
}

func newSharedMember(cfg Config) *sharedMember {
	name := cfg.MemberName
	if name == "" {
		host, _ := os.Hostname()
		name = host + ":" + strconv.Itoa(os.Getpid())
	}
	s := &sharedMember{q: buildSharedQueries(cfg), lease: cfg.SharedLease, name: name, base: time.Now()}
	s.lost, s.markLost = context.WithCancel(context.Background())
	s.closing, s.closeRenewal = context.WithCancel(context.Background())
	s.view.Store(&sharedView{})
	return s
}

// leaseValid reports whether deliveries may go on: the local deadline has not passed.
func (s *sharedMember) leaseValid() bool { return s.leaseLeft() > 0 }

// leaseLeft is the time until the deadline (negative once passed).
func (s *sharedMember) leaseLeft() time.Duration {
	return time.Duration(s.deadline.Load() - time.Since(s.base).Nanoseconds())
}

// renewed moves the deadline to the lease, less its margin, after a renewal that started at
// start.
func (s *sharedMember) renewed(start time.Time) {
	s.deadline.Store((start.Sub(s.base) + s.lease - s.lease/sharedMarginParts).Nanoseconds())
}

// waitLease waits until deliveries may go on: the lease holds, or was renewed. It returns the
// error that stopped the watcher when it lost its membership, or ctx's.
func (s *sharedMember) waitLease(ctx context.Context) error {
	for !s.leaseValid() {
		if err := s.excl.lostErr(); err != nil {
			return err
		}
		if !backoff.Sleep(ctx, 20*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

// join makes the watcher a member of its client (once) and starts its coordinator. Reader
// goroutine only, from the load.
func (w *Watcher) join(ctx context.Context) error {
	if w.sh.id.Load() != 0 {
		return nil
	}
	var ok bool
	if err := w.cfg.DB.QueryRowContext(ctx, w.sh.q.detect, changelog.Quote(w.cfg.ChangelogTable),
		changelog.Quote(changelog.RangeTable(w.cfg.ChangelogTable))).Scan(&ok); err != nil {
		return fmt.Errorf("inspect changelog %s for shared members: %w", w.cfg.ChangelogTable, err)
	}
	if !ok {
		return ErrSharedSchema
	}
	start := time.Now()
	var id int64
	if err := w.cfg.DB.QueryRowContext(ctx, w.sh.q.join, w.cfg.ClientName, w.sh.name, w.sh.lease.Milliseconds()).Scan(&id); err != nil {
		return fmt.Errorf("join the members of client %q: %w", w.cfg.ClientName, err)
	}
	w.sh.renewed(start)
	w.sh.id.Store(id)
	w.log.Info("joined the shared members", "member", id, "name", w.sh.name)
	w.wg.Add(1)
	go w.coordinate(ctx)
	return nil
}

// coordinate is the member's coordinator goroutine: it renews the lease, deletes the rows of
// members whose lease ran out, and asks the reader to hand over when the split changed. It
// stops the watcher when its membership is gone (its lease ran out and another member deleted
// it). Renewals are paced from the start of the previous one, whatever the rest of a look
// took. Once ctx ends it only renews, while Process finishes (renewWhileProcessing).
func (w *Watcher) coordinate(ctx context.Context) {
	defer w.wg.Done()
	defer w.recoverPanic(opMember, "shared coordinator", w.stopWith)
	tick := w.sh.lease / sharedTicksPerLease
	wait := tick
	failed := newRepeatLog(w.log, slog.LevelWarn, "shared membership: cannot renew or look at the split; retrying")
	for {
		if !backoff.Sleep(ctx, wait) {
			w.renewWhileProcessing(failed)
			return
		}
		start := time.Now()
		busy, err := w.coordinateOnce(ctx)
		if ctx.Err() != nil {
			w.renewWhileProcessing(failed)
			return
		}
		if !w.coordinateFailed(err, failed) {
			return
		}
		next := tick
		if busy {
			next = min(tick, sharedBusyTick)
		}
		wait = next - time.Since(start)
	}
}

// coordinateFailed handles the error of a renewal or a look at the split: it stops the watcher
// when the membership is gone (false: the coordinator stops too), or reports the failure (logged
// through failed, once with a count while it repeats) and goes on (true).
func (w *Watcher) coordinateFailed(err error, failed *repeatLog) bool {
	switch {
	case errors.Is(err, ErrFenced):
		w.stopOwning(err, "the member's lease ran out and another member removed it; stopping")
		return false
	case err != nil:
		w.health.fail(opMember, err)
		failed.fail("error", err)
	default:
		failed.ok()
	}
	return true
}

// renewWhileProcessing keeps renewing the lease after Start's context ended while a Process
// still runs: it finishes the events it took (its grace period) and saves them, which needs the
// member to keep its ranges until then, however long a busy machine makes it; otherwise the
// lease could run out, another member take the ranges over and replay events whose handlers
// finished. It ends when Process returns, when the member lost its ranges, or at Close.
func (w *Watcher) renewWhileProcessing(failed *repeatLog) {
	tick := w.sh.lease / sharedTicksPerLease
	for w.processing.Load() && w.excl.lostErr() == nil {
		start := time.Now()
		renewCtx, cancel := context.WithTimeout(w.sh.closing, w.sh.lease)
		err := w.sh.renew(renewCtx)
		cancel()
		if w.sh.closing.Err() != nil || !w.coordinateFailed(err, failed) {
			return
		}
		if !backoff.Sleep(w.sh.closing, tick-time.Since(start)) {
			return
		}
	}
}

// renew renews the member's lease and moves its deadline.
func (s *sharedMember) renew(ctx context.Context) error {
	id := s.id.Load()
	start := time.Now()
	res, err := s.db.ExecContext(ctx, s.q.renew, s.client, id, s.lease.Milliseconds())
	if err != nil {
		return fmt.Errorf("renew the lease of member %d: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return fmt.Errorf("%w: member %d's lease ran out and its row was removed", ErrFenced, id)
	}
	s.renewed(start)
	s.health.ok(opMember)
	return nil
}

// coordinateOnce renews the lease and looks at the split; busy reports a hand-over under way
// (ranges to release or to claim).
func (w *Watcher) coordinateOnce(ctx context.Context) (busy bool, err error) {
	if err := w.sh.renew(ctx); err != nil {
		return false, err
	}
	id := w.sh.id.Load()
	if _, err := w.cfg.DB.ExecContext(ctx, w.sh.q.expire, w.cfg.ClientName, id, w.sh.lease.Milliseconds()); err != nil {
		return false, fmt.Errorf("remove expired members: %w", err)
	}
	var (
		membersText, ownersText string
		settled                 bool
	)
	if err := w.cfg.DB.QueryRowContext(ctx, w.sh.q.state, w.cfg.ClientName, id, w.sh.lease.Milliseconds()).Scan(&membersText, &ownersText, &settled); err != nil {
		return false, fmt.Errorf("read the members and ranges: %w", err)
	}
	members, err1 := parseIntArray(membersText)
	owners, err2 := parseIntArray(ownersText)
	if err := errors.Join(err1, err2); err != nil {
		return false, fmt.Errorf("read the members and ranges: %w", err)
	}
	target := lease.Target(members, id, SharedRanges)
	claimable := claimableRanges(id, target, owners, members, settled)
	w.sh.mu.Lock()
	w.sh.target, w.sh.claimable = target, claimable
	w.sh.mu.Unlock()
	if len(claimable) > 0 || mustRelease(id, target, owners) {
		w.sh.changeAsked.Store(true)
		select {
		case w.wake <- struct{}{}:
		default:
		}
		return true, nil
	}
	return false, nil
}

// mustRelease reports whether member id owns a range outside its target. owners holds each
// range's owner, 0 when free.
func mustRelease(id int64, target []int, owners []int64) bool {
	for r, o := range owners {
		if o == id && !slices.Contains(target, r) {
			return true
		}
	}
	return false
}

// claimableRanges returns the ranges of member id's target it may claim: those free, and,
// while it is settled (see buildSharedQueries), those of members no longer live (live is
// ascending).
func claimableRanges(id int64, target []int, owners, live []int64, settled bool) []int {
	var out []int
	for _, r := range target {
		if r >= len(owners) || owners[r] == id {
			continue
		}
		o := owners[r]
		if _, found := slices.BinarySearch(live, o); o == 0 || (settled && !found) {
			out = append(out, r)
		}
	}
	return out
}

// parseIntArray parses the text form of a PostgreSQL integer array ("{1,2,3}").
func parseIntArray(s string) ([]int64, error) {
	s = strings.TrimSuffix(strings.TrimPrefix(s, "{"), "}")
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	out := make([]int64, len(parts))
	for i, p := range parts {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("array %q: %w", s, err)
		}
		out[i] = n
	}
	return out, nil
}

// leaveAtClose leaves the members at Close when nothing delivered is unacknowledged. Otherwise
// the member keeps its ranges, so that acknowledgements after Close are still saved (contract
// rule 13), and leaves at the save that acknowledges the last of them; if none comes, its lease
// runs out (its coordinator has stopped) and the others take the ranges over.
func (w *Watcher) leaveAtClose(ctx context.Context) error {
	if _, _, _, busy := w.checkpoint(); busy {
		w.sh.leaveWhenDrained.Store(true)
		w.log.Info("closed with deliveries not acknowledged: the member keeps its ranges until they are, or until its lease runs out",
			"member", w.sh.id.Load())
		return nil
	}
	return w.sh.leave(ctx)
}

// leaveIfDrained leaves the members, once, after a save that left nothing unacknowledged by a
// member closed with deliveries pending.
func (w *Watcher) leaveIfDrained(ctx context.Context) error {
	if _, _, _, busy := w.checkpoint(); busy || !w.sh.leaveWhenDrained.CompareAndSwap(true, false) {
		return nil
	}
	return w.sh.leave(ctx)
}

// leave frees the member's ranges and deletes its row, at Close, so that other members take
// them over at once rather than after its lease.
func (s *sharedMember) leave(ctx context.Context) error {
	id := s.id.Load()
	if id == 0 {
		return nil
	}
	if _, err := s.db.ExecContext(ctx, s.q.leave, s.client, id); err != nil {
		return fmt.Errorf("pgchangestream: leave the shared members (the others take over after the lease): %w", err)
	}
	s.markLost() // the ranges are free: a handler still running (a rerun) finds its context done
	s.log.Info("left the shared members", "member", id)
	return nil
}

// leaseContext is the context of a Shared member's handler: it is done when its parent is, when
// the member stops owning its ranges, and as soon as it is asked (Done, Err) after the member's
// lease may have run out. The last is checked on the monotonic clock at each call, so a member
// frozen mid-handler (a pause, a stopped process) past its lease finds the context done at the
// handler's next database call when it wakes, before any goroutine could cancel it: the call
// fails instead of writing after another member took over the range.
type leaseContext struct {
	context.Context // the parent
	sh              *sharedMember
	once            sync.Once
	done            chan struct{}
	stop            [2]func() bool // the AfterFuncs on the parent and on the member's loss
}

// handlerContext returns the context for a handler run under parent, and its release.
func (s *sharedMember) handlerContext(parent context.Context) (*leaseContext, func()) {
	c := &leaseContext{Context: parent, sh: s, done: make(chan struct{})}
	c.stop[0] = context.AfterFunc(parent, c.close)
	c.stop[1] = context.AfterFunc(s.lost, c.close)
	return c, func() {
		c.stop[0]()
		c.stop[1]()
	}
}

func (c *leaseContext) close() { c.once.Do(func() { close(c.done) }) }

// Done returns the channel closed when the handler must stop; it closes it first if the lease
// may have run out.
func (c *leaseContext) Done() <-chan struct{} {
	if !c.sh.leaseValid() {
		c.close()
	}
	return c.done
}

// Err returns the parent's error, or DeadlineExceeded once the lease may have run out or the
// member stopped owning its ranges; nil while the handler may go on.
func (c *leaseContext) Err() error {
	select {
	case <-c.Done():
		if err := c.Context.Err(); err != nil {
			return err
		}
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// Deadline is the parent's: the lease's end moves with each renewal.
func (c *leaseContext) Deadline() (time.Time, bool) { return c.Context.Deadline() }
