package pgchangestream

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/marker"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// fakeDB is an in-memory stand-in for the changelog and token tables that answers exactly the
// watcher's queries. It has no network I/O, so it works inside testing/synctest bubbles, and it
// can fail or delay statements on demand. SQL text is checked by the sqlmock tests; this fake
// checks behaviour.
type fakeDB struct {
	q     changelog.Statements
	mq    marker.Statements
	limit int

	mu             sync.Mutex
	rows           []fakeRow
	nextID         int64
	tokens         map[string]string
	saves          []Position // every checkpoint written, in commit order
	reads          []time.Time
	failReads      int // fail this many reads
	failSaves      int // fail this many saves
	saveDelay      time.Duration
	markDelay      time.Duration  // delays statements that set the processed flag
	markPanic      any            // while set, statements that set the processed flag panic with it
	readErr        error          // returned by failing reads and saves
	failLoads      int            // fail this many token loads
	failReadNumber int            // fail the read with this number (1 is the first)
	onSave         func(Position) // called, under the fake's lock, as each save commits
}

type fakeRow struct {
	changelogRow
	table   string
	visible bool
}

func newFakeDB(cfg Config) *fakeDB {
	cfg = cfg.WithDefaults()
	return &fakeDB{q: statements(cfg), mq: marker.NewStatements(cfg.ChangelogTable), limit: cfg.BatchSize, tokens: map[string]string{}, nextID: 1,
		readErr: errors.New("fake: connection refused")}
}

// open returns a *sql.DB on the fake, closed when the test ends.
func (f *fakeDB) open(t testing.TB) *sql.DB {
	db := sql.OpenDB(fakeConnector{f})
	t.Cleanup(func() { db.Close() })
	return db
}

// insert adds committed rows for table at changedAt and returns their ids.
func (f *fakeDB) insert(table string, changedAt time.Time, n int) []int64 {
	return f.insertRows(table, changedAt, n, true)
}

// insertRows adds n rows; invisible rows model a transaction that has not committed yet.
func (f *fakeDB) insertRows(table string, changedAt time.Time, n int, visible bool) []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []int64
	for range n {
		id := f.nextID
		f.nextID++
		f.rows = append(f.rows, fakeRow{
			changelogRow: changelogRow{ID: id, RecordID: "r" + strconv.FormatInt(id, 10), Operation: "INSERT",
				NewValues: []byte(`{"n":` + strconv.FormatInt(id, 10) + `}`), ChangedAt: changedAt.Truncate(time.Microsecond)},
			table: table, visible: visible,
		})
		ids = append(ids, id)
	}
	return ids
}

// commit makes a row inserted invisible visible.
func (f *fakeDB) commit(id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.rows {
		if f.rows[i].ID == id {
			f.rows[i].visible = true
		}
	}
}

// token returns the saved token of a client, decoded.
func (f *fakeDB) token(t testing.TB, client string) Position {
	t.Helper()
	f.mu.Lock()
	raw, ok := f.tokens[client]
	f.mu.Unlock()
	if !ok {
		t.Fatalf("no saved token for %q", client)
	}
	p, err := position.DecodeToken([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *fakeDB) savedPositions() []Position {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.saves)
}

func (f *fakeDB) readTimes() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reads)
}

// markFault applies markDelay and markPanic to a statement of the marker.
func (f *fakeDB) markFault(ctx context.Context) error {
	f.mu.Lock()
	delay, fault := f.markDelay, f.markPanic
	f.mu.Unlock()
	if fault != nil {
		panic(fault)
	}
	return sleepFor(ctx, delay)
}

// sleepFor waits for d (if positive), or for ctx to end.
func sleepFor(ctx context.Context, d time.Duration) error {
	if d > 0 && !backoff.Sleep(ctx, d) {
		return ctx.Err()
	}
	return nil
}

type fakeConnector struct{ f *fakeDB }

func (c fakeConnector) Connect(context.Context) (driver.Conn, error) { return fakeConn(c), nil }
func (c fakeConnector) Driver() driver.Driver                        { return nil }

type fakeConn struct{ f *fakeDB }

func (fakeConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("fake: no prepare") }
func (fakeConn) Close() error                        { return nil }
func (fakeConn) Begin() (driver.Tx, error)           { return nil, errors.New("fake: no transactions") }

func (c fakeConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	f := c.f
	if query == f.mq.Legacy || strings.HasPrefix(query, f.mq.CatchUp) { // the processed flag: not modelled, no rows to mark
		if err := f.markFault(ctx); err != nil {
			return nil, err
		}
		cols := []string{"id"}
		if query != f.mq.Legacy { // a page of the catch-up after a load
			cols = append(cols, "changed_at")
		}
		return &valueRows{cols: cols}, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	a := func(i int) any { return args[i].Value }
	switch query {
	case f.q.Read:
		f.reads = append(f.reads, time.Now())
		if len(f.reads) == f.failReadNumber {
			return nil, f.readErr
		}
		if f.failReads > 0 {
			f.failReads--
			return nil, f.readErr
		}
		after := position.Make(a(1).(time.Time), a(2).(int64))
		var out []fakeRow
		for _, r := range f.rows {
			if r.visible && r.table == a(0) && after.Before(position.Make(r.ChangedAt, r.ID)) {
				out = append(out, r)
			}
		}
		slices.SortFunc(out, func(x, y fakeRow) int {
			return position.Make(x.ChangedAt, x.ID).Compare(position.Make(y.ChangedAt, y.ID))
		})
		return changelogRows(out[:min(len(out), f.limit)]), nil
	case f.q.Detect: // a legacy changelog: snapshot deltas are tested with sqlmock and live
		return &valueRows{cols: []string{"skip_free", "incarnation", "stats"}, vals: [][]driver.Value{{false, false, true}}}, nil
	case f.q.ByID:
		for _, r := range f.rows {
			if r.visible && r.table == a(0) && r.ID == a(1) {
				return changelogRows([]fakeRow{r}), nil
			}
		}
		return changelogRows(nil), nil
	case f.q.LoadToken:
		if f.failLoads > 0 {
			f.failLoads--
			return nil, f.readErr
		}
		if raw, ok := f.tokens[a(0).(string)]; ok {
			return &valueRows{cols: []string{"resume_token"}, vals: [][]driver.Value{{raw}}}, nil
		}
		return &valueRows{cols: []string{"resume_token"}}, nil
	case f.q.Newest:
		var best *fakeRow
		for i, r := range f.rows {
			if r.visible && r.table == a(0) && (best == nil || position.Make(best.ChangedAt, best.ID).Before(position.Make(r.ChangedAt, r.ID))) {
				best = &f.rows[i]
			}
		}
		if best == nil {
			return &valueRows{cols: []string{"changed_at", "id"}}, nil
		}
		return &valueRows{cols: []string{"changed_at", "id"}, vals: [][]driver.Value{{best.ChangedAt, best.ID}}}, nil
	case f.q.RowTime:
		for _, r := range f.rows {
			if r.ID == a(0) {
				return &valueRows{cols: []string{"changed_at"}, vals: [][]driver.Value{{r.ChangedAt}}}, nil
			}
		}
		return &valueRows{cols: []string{"changed_at"}}, nil
	}
	return nil, fmt.Errorf("fake: unexpected query %q", query)
}

func (c fakeConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	f := c.f
	f.mu.Lock()
	delay := f.saveDelay
	f.mu.Unlock()
	if err := sleepFor(ctx, delay); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if query != f.q.SaveToken {
		return nil, fmt.Errorf("fake: unexpected exec %q", query)
	}
	if f.failSaves > 0 {
		f.failSaves--
		return nil, f.readErr
	}
	raw := args[1].Value.(string)
	p, err := position.DecodeToken([]byte(raw))
	if err != nil {
		return nil, fmt.Errorf("fake: bad token written: %w", err)
	}
	f.tokens[args[0].Value.(string)] = raw
	f.saves = append(f.saves, p)
	if f.onSave != nil {
		f.onSave(p)
	}
	return driver.RowsAffected(1), nil
}

func changelogRows(rows []fakeRow) driver.Rows {
	vr := &valueRows{cols: []string{"id", "record_id", "operation", "old_values", "new_values", "changed_at"}}
	for _, r := range rows {
		vr.vals = append(vr.vals, []driver.Value{r.ID, r.RecordID, r.Operation, nilIfEmpty(r.OldValues), nilIfEmpty(r.NewValues), r.ChangedAt})
	}
	return vr
}

func nilIfEmpty(b []byte) driver.Value {
	if b == nil {
		return nil
	}
	return b
}

type valueRows struct {
	cols []string
	vals [][]driver.Value
}

func (r *valueRows) Columns() []string { return r.cols }
func (r *valueRows) Close() error      { return nil }
func (r *valueRows) Next(dest []driver.Value) error {
	if len(r.vals) == 0 {
		return io.EOF
	}
	copy(dest, r.vals[0])
	r.vals = r.vals[1:]
	return nil
}
