package pgchangestreamtest

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/position"
)

// Schema is the state of the changelog a watcher finds at start-up.
type Schema int

const (
	// Legacy is a changelog without the txid column: reads follow (changed_at, id) positions.
	Legacy Schema = iota
	// Upgraded is a changelog with the txid column schema.Install adds: reads follow snapshot
	// deltas.
	Upgraded
)

// Start is what a watcher finds at start-up.
type Start struct {
	Schema Schema
	// Saved is the position of the client's saved token: the watcher resumes after it. A zero
	// ID means a new client, which starts after Newest and saves that position at once.
	Saved pgchangestream.Position
	// Newest is the newest changelog row of the table, where a new client starts (unless
	// Config.StartFromBeginning). A zero ID means the table has no row yet.
	Newest pgchangestream.Position
}

// StartTimeout is the default [Mock.Timeout].
const StartTimeout = 10 * time.Second

// firstXid is the first transaction id of the snapshots an upgraded changelog reports.
const firstXid = 1000

// deltaSpan is how many transaction ids each snapshot of an upgraded changelog moves on.
const deltaSpan = 1 << 20

var (
	changelogColumns = []string{"id", "record_id", "operation", "old_values", "new_values", "changed_at"}
	deltaColumns     = append(append([]string{}, changelogColumns...), "txid")
)

// Mock is a sqlmock database with expectations built from the watcher's own statements, so a
// test of a service that runs a [pgchangestream.Watcher] never copies SQL. Expectations are
// matched in order, statements exactly. The embedded Sqlmock takes further expectations and
// checks them (ExpectationsWereMet).
//
// The Mock follows the positions the watcher will read from and save: expect the start-up
// first ([Mock.ExpectStart]), then the reads ([Mock.ExpectRead]) and saves ([Mock.ExpectSave])
// in the order the watcher runs them, and start the watcher with [Mock.StartWatcher]. Reads
// the watcher runs beyond those expected fail and are retried with backoff, which changes
// nothing.
//
// Which saves happen is deterministic when the rows read have consecutive ids and one
// changed_at (the defaults of [Change]): the checkpoint after one row is then the same position
// whether or not the next row was already delivered when the row was acknowledged. Saves are
// expected on a legacy changelog only: on an upgraded one their number depends on when the
// reader ends each snapshot delta. [Mock.ExpectTxAck] is expected on an upgraded one only.
type Mock struct {
	sqlmock.Sqlmock
	// DB is the mock database.
	DB *sql.DB
	// Timeout bounds StartWatcher's wait for the first read. NewMock sets [StartTimeout].
	Timeout time.Duration

	t   TB
	cfg pgchangestream.Config // the defaults the kit reads filled, with DB and Logger set
	st  changelog.Statements
	log *lockedBuffer

	ids      ids
	upgraded bool
	xmax     uint64                    // the last snapshot's xmax (upgraded)
	nextXid  uint64                    // the txid of the next row of the delta (upgraded)
	read     []pgchangestream.Position // the start position, then every row read, in order
}

// TB is what the Mock needs of a test; *testing.T and *testing.B have it.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

var _ TB = testing.TB(nil)

// NewMock returns a mock database for a watcher configured as cfg, closed when the test ends.
// Use [Mock.Config] to create the watcher. The watcher must not need a LISTEN connection:
// use polling mode, or leave ConnString empty.
func NewMock(t TB, cfg pgchangestream.Config) *Mock {
	t.Helper()
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatalf("pgchangestreamtest: sqlmock: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	m := &Mock{Sqlmock: mock, DB: db, Timeout: StartTimeout, t: t, log: &lockedBuffer{}}
	cfg.DB = db
	cfg.Logger = slog.New(slog.NewTextHandler(m.log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if cfg.IdleCheckpointInterval == 0 {
		cfg.IdleCheckpointInterval = time.Hour
	}
	cfg.ProcessedFlag = false // its marker runs in the background, at times a mock cannot expect
	m.cfg = cfg.WithDefaults()
	m.st = changelog.NewStatements(changelog.StatementParams{ChangelogTable: m.cfg.ChangelogTable,
		TokenTable: m.cfg.TokenTable, BatchSize: m.cfg.BatchSize}) // ProcessedFlag is cleared
	return m
}

// Config returns the configuration given to NewMock, with DB set to the mock, Logger set to a
// log the Mock reports on failure (warnings and errors), ProcessedFlag cleared (the legacy
// processed flag is set by a background marker, at times a mock cannot expect), and, unless set,
// an IdleCheckpointInterval of an hour, so the watcher saves only when the consumer
// acknowledges and at Close, as the test expects.
func (m *Mock) Config() pgchangestream.Config { return m.cfg }

// ExpectStart expects the watcher's start-up: the inspection of the changelog (answered as
// s.Schema), the token load and, for a new client, its start position and the save of it, then
// the check of the table name.
func (m *Mock) ExpectStart(s Start) {
	m.t.Helper()
	m.upgraded = s.Schema == Upgraded
	m.xmax = firstXid
	m.ExpectQuery(m.st.Detect).WithArgs(changelog.Quote(m.cfg.ChangelogTable), changelog.Quote(changelog.IncarnationTable(m.cfg.ChangelogTable))). // no incarnation table
																			WillReturnRows(sqlmock.NewRows([]string{"skip_free", "incarnation", "stats"}).AddRow(m.upgraded, false, true))
	if m.upgraded {
		m.ExpectQuery(m.st.DeltaStart).WithArgs(m.cfg.TableName).
			WillReturnRows(sqlmock.NewRows([]string{"snapshot", "newest_txid"}).AddRow(m.snapshot(), nil))
	}
	load := m.ExpectQuery(m.st.LoadToken).WithArgs(m.cfg.ClientName)
	tokens := sqlmock.NewRows([]string{"resume_token"})
	var start pgchangestream.Position
	switch {
	case s.Saved.ID != 0:
		start = at(s.Saved)
		load.WillReturnRows(tokens.AddRow(m.token(start)))
	case m.cfg.StartFromBeginning && m.upgraded:
		m.t.Fatalf("pgchangestreamtest: ExpectStart: a new client starting from the beginning of an upgraded changelog is not supported")
	case m.cfg.StartFromBeginning:
		load.WillReturnRows(tokens)
		m.ExpectExec(m.st.SaveToken).WithArgs(m.cfg.ClientName, certifies{through: 0, read: []pgchangestream.Position{start}}).
			WillReturnResult(sqlmock.NewResult(0, 1))
	default:
		load.WillReturnRows(tokens)
		newest := sqlmock.NewRows([]string{"changed_at", "id"})
		if s.Newest.ID != 0 {
			start = at(s.Newest)
			newest.AddRow(start.ChangedAt, start.ID)
		}
		m.ExpectQuery(m.st.Newest).WithArgs(m.cfg.TableName).WillReturnRows(newest)
		m.ExpectExec(m.st.SaveToken).WithArgs(m.cfg.ClientName, certifies{through: 0, read: []pgchangestream.Position{start}}).
			WillReturnResult(sqlmock.NewResult(0, 1))
	}
	m.read = []pgchangestream.Position{start}
	m.ids.next = start.ID + 1
	m.ExpectQuery(changelog.TableCheckSQL(m.cfg.ChangelogTable)).WithArgs(m.cfg.TableName).
		WillReturnRows(sqlmock.NewRows([]string{"exists"}).AddRow(true))
}

// at returns p with DefaultChangedAt for a zero time, as the watcher reads it.
func at(p pgchangestream.Position) pgchangestream.Position {
	if p.ChangedAt.IsZero() {
		p.ChangedAt = DefaultChangedAt
	}
	return position.Make(p.ChangedAt, p.ID)
}

// snapshot returns the current snapshot: every transaction below xmax has finished.
func (m *Mock) snapshot() string { return fmt.Sprintf("%d:%d:", m.xmax, m.xmax) }

// token returns the saved-token JSON of start, in the documented format: legacy, or on an
// upgraded changelog at the start of the delta after the current snapshot.
func (m *Mock) token(start pgchangestream.Position) string {
	tok := `{"timestamp":"` + start.ChangedAt.Format(time.RFC3339Nano) + `","eventID":` + strconv.FormatInt(start.ID, 10)
	if m.upgraded {
		tok += `,"snapshot":"` + m.snapshot() + `"`
	}
	return tok + "}"
}

// ExpectRead expects one read of the changelog that returns changes (none: nothing new).
// Changes without an ID or time get the next id and [DefaultChangedAt]. A read of
// Config.BatchSize changes is followed at once by the next read: expect it too. On an upgraded
// changelog each read is a snapshot delta of its own, and the changes of one read must fit a
// batch.
func (m *Mock) ExpectRead(changes ...Change) {
	m.t.Helper()
	if m.read == nil {
		m.t.Fatalf("pgchangestreamtest: ExpectRead before ExpectStart")
	}
	if !m.upgraded {
		from := m.read[len(m.read)-1]
		rows := sqlmock.NewRows(changelogColumns)
		for _, c := range changes {
			c = m.ids.fill(c)
			rows.AddRow(c.ID, c.RecordID, c.Operation, value(c.OldValues), value(c.NewValues), c.ChangedAt)
			m.read = append(m.read, c.position())
		}
		m.ExpectQuery(m.st.Read).WithArgs(m.cfg.TableName, from.ChangedAt, from.ID).WillReturnRows(rows)
		return
	}
	if len(changes) > m.cfg.BatchSize {
		m.t.Fatalf("pgchangestreamtest: ExpectRead: %d changes in one delta, more than Config.BatchSize", len(changes))
	}
	if len(changes) > 0 { // a new delta: its end snapshot first
		m.nextXid = m.xmax
		m.xmax += deltaSpan
	}
	m.ExpectQuery(m.st.Snapshot).WillReturnRows(sqlmock.NewRows([]string{"snapshot"}).AddRow(m.snapshot()))
	if len(changes) == 0 { // nothing finished: the watcher reads nothing
		return
	}
	rows := sqlmock.NewRows(deltaColumns)
	for _, c := range changes {
		c = m.ids.fill(c)
		rows.AddRow(c.ID, c.RecordID, c.Operation, value(c.OldValues), value(c.NewValues), c.ChangedAt,
			strconv.FormatUint(m.nextXid, 10))
		m.nextXid++
		m.read = append(m.read, c.position())
	}
	anyArg := sqlmock.AnyArg()
	m.ExpectQuery(m.st.DeltaRange).WithArgs(m.cfg.TableName, anyArg, anyArg, anyArg, anyArg, m.snapshot(), anyArg).WillReturnRows(rows)
}

// value returns a JSON column's value: nil for NULL.
func value(b []byte) driver.Value {
	if b == nil {
		return nil
	}
	return []byte(b)
}

// ExpectSave expects a save of the checkpoint that certifies every row read up to the one with
// id throughID, and no row read after it: what the watcher saves once the consumer has
// acknowledged throughID (and, with acknowledgements in delivery order, everything before it).
// The token is checked by what it certifies, not by its text.
func (m *Mock) ExpectSave(throughID int64) {
	m.t.Helper()
	m.expectSave(throughID).WillReturnResult(sqlmock.NewResult(0, 1))
}

// ExpectSaveFailure expects the same save as ExpectSave, and fails it with err, as a database
// error would. The watcher keeps the acknowledgement; its next save is expected as if this one
// had not happened.
func (m *Mock) ExpectSaveFailure(throughID int64, err error) {
	m.t.Helper()
	m.expectSave(throughID).WillReturnError(err)
}

// ExpectTxAck expects the write of [pgchangestream.Watcher.MarkProcessedTx] in the caller's
// transaction: the token of the checkpoint that certifies every row read up to the one with id
// throughID, as ExpectSave, with the watcher's acknowledgement marker. Expect it between the
// transaction's begin and its commit or rollback, after the consumer's own statements before
// it. From the first MarkProcessedTx on, the watcher's own saves are conditional on the marker
// and read it first; ExpectSave does not expect those, so a test of MarkProcessedTx expects no
// save after it. MarkProcessedTx refuses a legacy changelog
// ([pgchangestream.ErrLegacyChangelog]): expect it on an upgraded one (Start.Schema Upgraded).
func (m *Mock) ExpectTxAck(throughID int64) {
	m.t.Helper()
	m.expectWrite("ExpectTxAck", m.st.AckTx[changelog.AckIndex(false, "")], throughID).WillReturnResult(sqlmock.NewResult(0, 1))
}

// expectSave expects the token save of ExpectSave.
func (m *Mock) expectSave(throughID int64) *sqlmock.ExpectedExec {
	m.t.Helper()
	if m.upgraded {
		m.t.Fatalf("pgchangestreamtest: ExpectSave: saves are expected on a legacy changelog only (see Mock)")
	}
	return m.expectWrite("ExpectSave", m.st.SaveToken, throughID)
}

// expectWrite expects the token write stmt of the checkpoint that certifies the rows read
// through throughID. name is the helper that expects it, for its errors.
func (m *Mock) expectWrite(name, stmt string, throughID int64) *sqlmock.ExpectedExec {
	m.t.Helper()
	i := -1
	for k, p := range m.read {
		if p.ID == throughID {
			i = k
		}
	}
	if i < 0 {
		m.t.Fatalf("pgchangestreamtest: %s(%d): no row with this id was read", name, throughID)
	}
	tok := certifies{through: i, read: slices.Clone(m.read)}
	return m.ExpectExec(stmt).WithArgs(m.cfg.ClientName, tok)
}

// certifies matches a saved token that certifies the rows of read up to index through (the
// start position is index 0) and none after.
type certifies struct {
	through int
	read    []pgchangestream.Position
}

// Match implements sqlmock.Argument.
func (c certifies) Match(v driver.Value) bool {
	s, ok := v.(string)
	if !ok {
		return false
	}
	p, err := position.DecodeToken([]byte(s))
	if err != nil {
		return false
	}
	q := position.Make(p.ChangedAt, p.ID) // the last row it passes, in read order
	for k, r := range c.read[1:] {
		if !q.Before(r) != (k+1 <= c.through) {
			return false
		}
	}
	return c.through > 0 || q.Compare(c.read[0]) == 0
}

// StartWatcher starts w and waits for its first read ([pgchangestream.Watcher.Ready]). A wrong
// expectation makes the watcher retry for ever instead of failing, so if the first read is not
// done within [Mock.Timeout], or the watcher stopped, the test fails at once with the
// expectations not met and the watcher's warnings and errors. w must use [Mock.Config]'s
// Logger for those to be reported. The watcher is closed when the test ends.
func (m *Mock) StartWatcher(ctx context.Context, w *pgchangestream.Watcher) {
	m.t.Helper()
	w.Start(ctx)
	m.t.Cleanup(func() { _ = w.Close(context.Background()) })
	select {
	case <-w.Ready():
		if err := w.Err(); err != nil {
			m.t.Fatalf("pgchangestreamtest: the watcher stopped before its first read: %v%s", err, m.report())
		}
	case <-time.After(m.Timeout):
		m.t.Fatalf("pgchangestreamtest: the watcher's first read is not done after %v%s", m.Timeout, m.report())
	}
}

// report describes the expectations not met and the watcher's log.
func (m *Mock) report() string {
	var b bytes.Buffer
	if err := m.ExpectationsWereMet(); err != nil {
		fmt.Fprintf(&b, "\nexpectations: %v", err)
	}
	if log := m.log.String(); log != "" {
		fmt.Fprintf(&b, "\nwatcher log:\n%s", log)
	}
	return b.String()
}

// lockedBuffer is a log buffer the watcher's goroutines write concurrently.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// ExpectUnprocessedCount expects GetUnprocessedEventCount to count the rows after afterID, and
// answers n.
func (m *Mock) ExpectUnprocessedCount(afterID, n int64) {
	m.ExpectQuery(m.st.Unprocessed).WithArgs(m.cfg.TableName, afterID).
		WillReturnRows(sqlmock.NewRows([]string{"count"}).AddRow(n))
}
