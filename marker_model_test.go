package pgchangestream

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/marker"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/stretchr/testify/require"
)

// markWorld is a changelog in memory for the marker's model test: legacy rows (no txid), then,
// once upgraded, rows of transactions that begin, write, commit and abort in any order
// (deltaModel). As a database driver it answers the load, the switch-over's statements (its
// snapshot's cut among them), the token saves, and the marking statements, which it evaluates as
// PostgreSQL would and checks against the saved token: every row flagged must be one the token
// certifies (rule 12).
type markWorld struct {
	t        testing.TB
	q        changelog.Statements
	mq       marker.Statements
	m        *deltaModel
	ts       map[int64]time.Time  // changed_at of each row
	begun    map[uint64]time.Time // changed_at of each transaction's rows
	clock    time.Time
	upgraded bool
	token    string
	flagged  map[int64]bool
	loaded   Position // the position of the watcher's last load, set by the test
}

func newMarkWorld(t testing.TB, cfg Config) *markWorld {
	start := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	cfg = cfg.WithDefaults()
	return &markWorld{t: t, q: statements(cfg), mq: marker.NewStatements(cfg.ChangelogTable), m: newDeltaModel(0, 0), ts: map[int64]time.Time{},
		begun: map[uint64]time.Time{}, clock: start, token: string(position.EncodeToken(position.Make(start, 0), "t")),
		flagged: map[int64]bool{}}
}

func (mw *markWorld) tick() time.Time {
	mw.clock = mw.clock.Add(time.Millisecond)
	return mw.clock
}

// writeLegacy adds a committed row without a txid (before the upgrade).
func (mw *markWorld) writeLegacy() {
	id := mw.m.nextID
	mw.m.nextID++
	mw.m.rows = append(mw.m.rows, modelRow{id: id})
	mw.ts[id] = mw.tick()
}

func (mw *markWorld) begin() {
	mw.begun[mw.m.nextXid] = mw.tick()
	mw.m.begin()
}

func (mw *markWorld) write(i int) {
	n := len(mw.m.rows)
	mw.m.write(i, int(mw.m.nextID)) // a key of its own: no row locks here
	if len(mw.m.rows) > n {
		r := mw.m.rows[n]
		mw.ts[r.id] = mw.begun[r.xid]
	}
}

func (mw *markWorld) committed(r modelRow) bool { return r.xid == 0 || mw.m.committed[r.xid] != 0 }

func (mw *markWorld) legacyPos(r modelRow) Position { return position.Make(mw.ts[r.id], r.id) }

// sees is "txid IS NULL OR pg_visible_in_snapshot(txid, s)".
func sees(s position.Snapshot, x uint64) bool { return x == 0 || !s.Running(x) }

// certified reports whether a saved token at p certifies row r, as certifiedBy says in SQL.
func (mw *markWorld) certified(p Position, r modelRow) bool {
	legacy := !position.Make(p.ChangedAt, p.ID).Before(mw.legacyPos(r))
	switch {
	case p.Span == nil:
		return legacy
	case !p.InDelta():
		return legacy && sees(p.Span.Base, r.xid)
	}
	return r.xid == 0 || certifies(p, r)
}

// readRow is the changelog row of r as a read returns it.
func (mw *markWorld) readRow(r modelRow) changelogRow {
	return changelogRow{ID: r.id, RecordID: "r" + strconv.FormatInt(r.id, 10), Operation: "INSERT",
		NewValues: []byte(`{}`), ChangedAt: mw.ts[r.id], Xid: r.xid}
}

// read reads one page after the watcher's cursor as readBatch does (legacy order, the legacy
// part of a switch-over, or a delta) and registers the rows as deliveries. It returns their ids.
func (mw *markWorld) read(w *Watcher, limit int) []int64 {
	w.mu.Lock()
	from := w.cursor
	w.mu.Unlock()
	var (
		rows []modelRow
		more bool
	)
	if from.InDelta() {
		if from.AtDeltaStart() {
			end := mw.m.snapshot()
			if position.EmptyDelta(from.Span.Base, end) {
				return nil
			}
			from = from.WithEnd(end, "")
		}
		rows = mw.m.delta(from, from.AfterID()) // then in id order, as the reader delivers a delta
		slices.SortFunc(rows, func(a, b modelRow) int { return cmp.Compare(a.id, b.id) })
		more = len(rows) > limit
		rows = rows[:min(len(rows), limit)]
	} else {
		after := position.Make(from.ChangedAt, from.ID)
		for _, r := range mw.m.rows {
			if mw.committed(r) && after.Before(mw.legacyPos(r)) && (from.Span == nil || sees(from.Span.Base, r.xid)) {
				rows = append(rows, r)
			}
		}
		slices.SortFunc(rows, func(a, b modelRow) int { return mw.legacyPos(a).Compare(mw.legacyPos(b)) })
		more = len(rows) > limit
		rows = rows[:min(len(rows), limit)]
	}
	var ids []int64
	for _, r := range rows {
		row := mw.readRow(r)
		w.register(&row, rowPosition(from, &row), false)
		ids = append(ids, r.id)
	}
	if !more && from.Span != nil {
		w.endSpan(from)
	}
	return ids
}

// markRows evaluates a marking statement: the committed rows it flags.
func (mw *markWorld) markRows(query string, a []any) []modelRow {
	snap := func(i int) position.Snapshot {
		s, err := position.ParseSnapshot(a[i].(string))
		require.NoError(mw.t, err)
		return s
	}
	legacyAfter := func(i int) func(modelRow) bool {
		after := position.Make(a[i].(time.Time), a[i+1].(int64))
		return func(r modelRow) bool { return after.Before(mw.legacyPos(r)) }
	}
	var match func(modelRow) bool
	switch query {
	case mw.mq.Legacy, mw.mq.Phase:
		after, upTo := legacyAfter(1), position.Make(a[3].(time.Time), a[4].(int64))
		match = func(r modelRow) bool { return after(r) && !upTo.Before(mw.legacyPos(r)) }
		if query == mw.mq.Phase {
			legacy, base := match, snap(5)
			match = func(r modelRow) bool { return legacy(r) && sees(base, r.xid) }
		}
	case mw.mq.Delta, mw.mq.Switch:
		lo, loID, hi, hiID := uintArray(mw.t, a[1]), intArray(mw.t, a[2]), uintArray(mw.t, a[3]), intArray(mw.t, a[4])
		base, end, id := snap(5), snap(6), a[7].(int64)
		inRanges := func(r modelRow) bool {
			for i := range lo {
				if keyAfter(r, lo[i], loID[i]) && !keyAfter(r, hi[i], hiID[i]) {
					return true
				}
			}
			return false
		}
		match = func(r modelRow) bool {
			return r.xid != 0 && inRanges(r) && (sees(base, r.xid) || (sees(end, r.xid) && r.id <= id))
		}
		if query == mw.mq.Switch {
			delta, after := match, legacyAfter(8)
			match = func(r modelRow) bool { return delta(r) || (after(r) && sees(base, r.xid)) }
		}
	case mw.mq.InDelta:
		above, upTo, end := a[1].(int64), a[2].(int64), snap(3)
		match = func(r modelRow) bool { return r.id > above && r.id <= upTo && r.xid != 0 && sees(end, r.xid) }
	default:
		mw.t.Fatalf("unexpected statement %q", query)
	}
	var out []modelRow
	for _, r := range mw.m.rows {
		if mw.committed(r) && match(r) {
			out = append(out, r)
		}
	}
	return out
}

func uintArray(t testing.TB, v any) []uint64 {
	return parseArray(t, v, func(f string) (uint64, error) { return strconv.ParseUint(f, 10, 64) })
}

func intArray(t testing.TB, v any) []int64 {
	return parseArray(t, v, func(f string) (int64, error) { return strconv.ParseInt(f, 10, 64) })
}

// parseArray parses a PostgreSQL array literal of numbers ("{1,2,3}").
func parseArray[T any](t testing.TB, v any, parse func(string) (T, error)) []T {
	var out []T
	for _, f := range strings.FieldsFunc(strings.Trim(v.(string), "{}"), func(r rune) bool { return r == ',' }) {
		x, err := parse(f)
		require.NoError(t, err)
		out = append(out, x)
	}
	return out
}

func (mw *markWorld) savedToken() Position {
	p, err := position.DecodeToken([]byte(mw.token))
	require.NoError(mw.t, err)
	return p
}

func (mw *markWorld) Connect(context.Context) (driver.Conn, error) { return markConn{mw}, nil }
func (mw *markWorld) Driver() driver.Driver                        { return nil }

type markConn struct{ mw *markWorld }

func (markConn) Prepare(string) (driver.Stmt, error) { return nil, fmt.Errorf("no prepare") }
func (markConn) Close() error                        { return nil }
func (markConn) Begin() (driver.Tx, error)           { return nil, fmt.Errorf("no transactions") }

func (c markConn) QueryContext(_ context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	mw := c.mw
	if strings.HasPrefix(query, mw.mq.CatchUp) {
		return mw.catchUpRows(values(args)), nil
	}
	switch query {
	case mw.q.Detect:
		return &valueRows{cols: []string{"skip_free", "incarnation", "stats"}, vals: [][]driver.Value{{mw.upgraded, false, true}}}, nil
	case mw.q.LoadToken:
		return &valueRows{cols: []string{"resume_token"}, vals: [][]driver.Value{{mw.token}}}, nil
	case mw.mq.Legacy, mw.mq.Phase, mw.mq.Delta, mw.mq.Switch, mw.mq.InDelta:
		rows := &valueRows{cols: []string{"id"}}
		for _, r := range mw.markRows(query, values(args)) {
			rows.vals = append(rows.vals, []driver.Value{r.id})
		}
		return rows, nil
	case mw.q.SwitchCut:
		return mw.switchCutRows(values(args)), nil
	case mw.q.DeltaStart:
		var newest driver.Value
		for _, r := range mw.m.rows {
			if r.xid != 0 && mw.committed(r) {
				newest = strconv.FormatUint(max(r.xid, parseXid(newest)), 10)
			}
		}
		return &valueRows{cols: []string{"snapshot", "newest"}, vals: [][]driver.Value{{mw.m.snapshot().String(), newest}}}, nil
	}
	return nil, fmt.Errorf("unexpected query %q", query)
}

// switchCutRows evaluates the switch-over's cut: the lowest txid, of the committed rows after
// the legacy position a[1], a[2] that snapshot a[5] sees, above every txid it sees of a row at or
// before the legacy position a[3], a[4] (when a[6]).
func (mw *markWorld) switchCutRows(a []any) driver.Rows {
	lo, hi, s := position.Make(a[1].(time.Time), a[2].(int64)), position.Make(a[3].(time.Time), a[4].(int64)), mustSnapshot(mw.t, a[5].(string))
	seen := func(r modelRow) bool { return r.xid != 0 && mw.committed(r) && sees(s, r.xid) }
	var below uint64
	for _, r := range mw.m.rows {
		if a[6].(bool) && seen(r) && !hi.Before(mw.legacyPos(r)) {
			below = max(below, r.xid)
		}
	}
	var cut driver.Value
	for _, r := range mw.m.rows {
		if seen(r) && r.xid > below && lo.Before(mw.legacyPos(r)) && (cut == nil || r.xid < parseXid(cut)) {
			cut = strconv.FormatUint(r.xid, 10)
		}
	}
	return &valueRows{cols: []string{"txid"}, vals: [][]driver.Value{{cut}}}
}

// catchUpRows evaluates a page of the catch-up after a load: the committed rows not flagged,
// after the legacy key a[1], a[2], that the loaded position and the saved token both certify, in
// legacy order.
func (mw *markWorld) catchUpRows(a []any) driver.Rows {
	after, saved := position.Make(a[1].(time.Time), a[2].(int64)), mw.savedToken()
	var out []modelRow
	for _, r := range mw.m.rows {
		if mw.committed(r) && !mw.flagged[r.id] && after.Before(mw.legacyPos(r)) &&
			mw.certified(mw.loaded, r) && mw.certified(saved, r) {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(x, y modelRow) int { return mw.legacyPos(x).Compare(mw.legacyPos(y)) })
	rows := &valueRows{cols: []string{"id", "changed_at"}}
	for _, r := range out[:min(len(out), marker.CatchUpPage)] {
		rows.vals = append(rows.vals, []driver.Value{r.id, mw.ts[r.id]})
	}
	return rows
}

// values are the values of a statement's arguments.
func values(args []driver.NamedValue) []any {
	a := make([]any, len(args))
	for i, v := range args {
		a[i] = v.Value
	}
	return a
}

func parseXid(v driver.Value) uint64 {
	if v == nil {
		return 0
	}
	x, _ := strconv.ParseUint(v.(string), 10, 64)
	return x
}

func (c markConn) ExecContext(_ context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	mw := c.mw
	if query == mw.q.SaveToken {
		mw.token = args[1].Value.(string)
		return driver.RowsAffected(1), nil
	}
	if query != mw.mq.MarkIDs {
		return nil, fmt.Errorf("unexpected exec %q", query)
	}
	saved := mw.savedToken()
	for _, id := range intArray(mw.t, args[0].Value) {
		i := slices.IndexFunc(mw.m.rows, func(r modelRow) bool { return r.id == id })
		require.GreaterOrEqual(mw.t, i, 0, "flagged row %d does not exist", id)
		r := mw.m.rows[i]
		require.True(mw.t, mw.certified(saved, r), "row %d (txid %d, changed_at %s) flagged, but the saved token %v does not certify it",
			r.id, r.xid, mw.ts[r.id].Format(time.StampMicro), saved)
		mw.flagged[r.id] = true
	}
	return driver.RowsAffected(0), nil
}

// FuzzMarker drives the processed-flag marker through a legacy changelog, its upgrade, an
// in-place switch-over and snapshot deltas, with reads, acknowledgements, saves and marker passes
// in random order (a pass may be delayed across any number of saves, as a row lock holds it
// back). It checks that nothing panics, that every statement flags only rows the saved token
// certifies, that the marked position never passes the saved token, and that once everything is
// acknowledged and the marker catches up, every delivered row is flagged. The statement for any
// two saved positions, in any form (legacy, switch-over, delta), flags only rows the later one
// certifies.
func FuzzMarker(f *testing.F) {
	for _, seed := range []uint64{1, 2, 3, 7, 42, 916, 1 << 33} {
		f.Add(seed, uint8(0xab))
	}
	f.Fuzz(func(t *testing.T, seed uint64, limit uint8) {
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b9))
		pageSize := int(limit%6) + 1
		mw := newMarkWorld(t, testConfig(Config{}))
		cfg := testConfig(Config{DB: sql.OpenDB(mw), ProcessedFlag: true})
		defer cfg.DB.Close()
		ctx := context.Background()
		var w *Watcher
		start := func() { // a restart, as after a crash: what was not marked yet is caught up on
			var err error
			w, err = New(cfg)
			require.NoError(t, err)
			require.NoError(t, w.load(ctx))
			w.mark.HoldPasses() // saves only wake the marker: the test runs its passes
			mw.loaded = w.Stats().Checkpoint
		}
		start()
		initial := mw.savedToken()

		var delivered []int64
		pass := func() {
			require.NoError(t, w.markPass(ctx))
			w.mu.Lock()
			saved := w.savedMirror // a decoded token's delta order is its own, so compare the watcher's
			w.mu.Unlock()
			marked := w.mark.Marked()
			require.False(t, saved.Before(marked), "marked %v passes the saved token %v", marked, saved)
		}
		step := func(op int) {
			switch {
			case op < 3 && !mw.upgraded:
				mw.writeLegacy()
			case op < 1:
				mw.begin()
			case op < 3:
				mw.write(rng.IntN(8))
			case op < 4:
				mw.m.finish(rng.IntN(8), rng.IntN(4) > 0)
			case op < 7:
				delivered = append(delivered, mw.read(w, pageSize)...)
			case op < 9 && len(delivered) > 0:
				require.NoError(t, w.MarkProcessed(ctx, position.FormatToken(delivered[rng.IntN(len(delivered))])))
			case op < 10:
				require.NoError(t, w.Flush(ctx))
			case op < 11:
				if !mw.upgraded && rng.IntN(4) == 0 {
					mw.upgraded = true
				}
			case op < 12:
				if mw.upgraded && !w.skipFree.Load() {
					w.upgradeChecked = time.Now().Add(-upgradeCheckInterval)
					require.NoError(t, w.noticeUpgrade(ctx))
				}
			case op < 13:
				if rng.IntN(3) == 0 { // the marker is often held back
					pass()
				}
			default:
				if rng.IntN(4) == 0 {
					start() // rows delivered before are delivered again after the saved token
				}
			}
		}
		var saves []Position // the positions saved, in order
		for range 400 {
			step(rng.IntN(14))
			w.mu.Lock()
			if p := w.savedMirror; len(saves) == 0 || p.Compare(saves[len(saves)-1]) != 0 || (p.Span == nil) != (saves[len(saves)-1].Span == nil) {
				saves = append(saves, p)
			}
			w.mu.Unlock()
		}
		for len(mw.m.running) > 0 {
			mw.m.finish(0, true)
		}
		for range 200 {
			delivered = append(delivered, mw.read(w, pageSize)...)
		}
		if len(delivered) > 0 {
			require.NoError(t, w.MarkProcessed(ctx, position.FormatToken(delivered[len(delivered)-1])))
		}
		pass()
		for range 50 {
			i, j := rng.IntN(len(saves)), rng.IntN(len(saves))
			prev, p := saves[min(i, j)], saves[max(i, j)]
			if !prev.Before(p) {
				continue
			}
			q, args := mw.mq.MarkStatement(cfg.TableName, prev, p)
			for _, r := range mw.markRows(q, args) {
				require.True(t, mw.certified(p, r), "marking from %v to %v flags row %d (txid %d), which %v does not certify", prev, p, r.id, r.xid, p)
			}
		}
		saved := mw.savedToken()
		for _, r := range mw.m.rows {
			if slices.Contains(delivered, r.id) && mw.certified(saved, r) && !mw.certified(initial, r) {
				require.True(t, mw.flagged[r.id], "row %d (txid %d), delivered and certified by %v, is not flagged", r.id, r.xid, saved)
			}
		}
	})
}
