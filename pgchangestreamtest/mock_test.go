package pgchangestreamtest

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream"
)

func mockConfig() pgchangestream.Config {
	return pgchangestream.Config{ClientName: "billing", TableName: "orders", Mode: pgchangestream.ModePolling}
}

func newWatcher(t *testing.T, m *Mock) *pgchangestream.Watcher {
	t.Helper()
	w, err := pgchangestream.New(m.Config())
	require.NoError(t, err)
	return w
}

func TestMockNewClientOnLegacyChangelog(t *testing.T) {
	ctx := t.Context()
	m := NewMock(t, mockConfig())
	m.ExpectStart(Start{Newest: pgchangestream.Position{ID: 10}})
	m.ExpectRead(Insert("o1", map[string]any{"total": 5}), Update("o1", map[string]any{"total": 5}, map[string]any{"total": 6}),
		Delete("o1", map[string]any{"total": 6}))
	m.ExpectSave(12)
	m.ExpectSave(13)
	w := newWatcher(t, m)
	m.StartWatcher(ctx, w)

	var ops []string
	for range 3 {
		ev := <-w.Events()
		ops = append(ops, fmt.Sprint(ev.Event["operationType"], " ", string(ev.ResumeToken)))
	}
	require.Equal(t, []string{"insert 11", "update 12", "delete 13"}, ops, "ids continue after the newest row")
	require.NoError(t, w.MarkProcessed(ctx, []byte("12")))
	require.NoError(t, w.MarkProcessed(ctx, []byte("13")))
	require.NoError(t, w.Close(ctx), "nothing changed since the last save: Close saves nothing")
	require.NoError(t, m.ExpectationsWereMet())
}

func TestMockResumeOnLegacyChangelog(t *testing.T) {
	ctx := t.Context()
	at := time.Date(2026, 2, 3, 4, 5, 6, 7000, time.UTC)
	m := NewMock(t, mockConfig())
	m.ExpectStart(Start{Saved: pgchangestream.Position{ChangedAt: at, ID: 5}})
	m.ExpectRead()
	later := Insert("o2", map[string]any{"total": 1})
	later.ChangedAt = at.Add(time.Second)
	m.ExpectRead(later)
	m.ExpectSaveFailure(6, errors.New("disk full"))
	m.ExpectSave(6)
	m.ExpectUnprocessedCount(6, 0)
	w := newWatcher(t, m)
	m.StartWatcher(ctx, w)

	ev := <-w.Events()
	require.Equal(t, "6", string(ev.ResumeToken))
	require.ErrorContains(t, w.MarkProcessed(ctx, ev.ResumeToken), "disk full")
	require.NoError(t, w.MarkProcessed(ctx, nil), "an empty token retries the save")
	n, err := w.GetUnprocessedEventCount(ctx, "6")
	require.NoError(t, err)
	require.Zero(t, n)
	require.NoError(t, w.Close(ctx))
	require.NoError(t, m.ExpectationsWereMet())
}

func TestMockStartFromBeginning(t *testing.T) {
	ctx := t.Context()
	cfg := mockConfig()
	cfg.StartFromBeginning = true
	cfg.DisableProcessedFlag = true
	m := NewMock(t, cfg)
	m.ExpectStart(Start{})
	m.ExpectRead(Insert("o1", nil), Insert("o2", nil))
	m.ExpectSave(1)
	w := newWatcher(t, m)
	m.StartWatcher(ctx, w)
	require.Equal(t, "1", string((<-w.Events()).ResumeToken))
	require.Equal(t, "2", string((<-w.Events()).ResumeToken))
	require.NoError(t, w.MarkProcessed(ctx, []byte("1")))
	require.NoError(t, w.Close(ctx), "delivery 2 stays pending: the checkpoint does not move")
	require.NoError(t, m.ExpectationsWereMet())
}

func TestMockUpgradedChangelog(t *testing.T) {
	for _, saved := range []bool{false, true} {
		t.Run(fmt.Sprintf("saved token %v", saved), func(t *testing.T) {
			m := NewMock(t, mockConfig())
			s := Start{Schema: Upgraded, Newest: pgchangestream.Position{ID: 7}}
			if saved {
				s = Start{Schema: Upgraded, Saved: pgchangestream.Position{ID: 7}}
			}
			m.ExpectStart(s)
			m.ExpectRead() // nothing committed since the start snapshot: no read
			m.ExpectRead(Insert("a", nil), Insert("b", nil))
			w := newWatcher(t, m)
			m.StartWatcher(t.Context(), w)
			require.Equal(t, "8", string((<-w.Events()).ResumeToken))
			require.Equal(t, "9", string((<-w.Events()).ResumeToken))
			require.NoError(t, m.ExpectationsWereMet())
		})
	}
}

// fatalRecorder records a Fatalf and ends the goroutine, as testing.T does.
type fatalRecorder struct {
	testing.TB
	msg chan string
}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg <- fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestMockWrongExpectationFailsFast(t *testing.T) {
	m := NewMock(t, mockConfig())
	m.Timeout = 300 * time.Millisecond
	m.ExpectStart(Start{Saved: pgchangestream.Position{ID: 5}})
	m.ExpectRead()
	cfg := m.Config()
	cfg.ClientName = "shipping" // not the client the expectations are for
	w, err := pgchangestream.New(cfg)
	require.NoError(t, err)

	rec := &fatalRecorder{TB: t, msg: make(chan string, 1)}
	m.t = rec
	go m.StartWatcher(t.Context(), w)
	msg := <-rec.msg
	require.Contains(t, msg, "first read is not done after 300ms")
	require.Contains(t, msg, "expectations: there is a remaining expectation")
	require.Contains(t, msg, "cannot load the start position")
	require.Contains(t, msg, "shipping")
}

// runTxAck has the watcher's first three deliveries processed in one transaction of the mock:
// an effect insert, then MarkProcessedTx of the second delivery, then the commit.
func runTxAck(t *testing.T, m *Mock) error {
	t.Helper()
	ctx := t.Context()
	w := newWatcher(t, m)
	m.StartWatcher(ctx, w)
	var toks [][]byte
	for range 3 {
		toks = append(toks, (<-w.Events()).ResumeToken)
	}
	tx, err := m.DB.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, "INSERT INTO effects VALUES ($1)", "12")
	require.NoError(t, err)
	if err := w.MarkProcessedTx(ctx, tx, toks[1]); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	return tx.Commit()
}

// expectTxAckStart expects the start of a new client on an upgraded changelog (MarkProcessedTx
// refuses a legacy one) whose first delta holds three changes, ids 11 to 13.
func expectTxAckStart(m *Mock) {
	m.ExpectStart(Start{Schema: Upgraded, Newest: pgchangestream.Position{ID: 10}})
	m.ExpectRead() // nothing committed since the start snapshot: no read
	m.ExpectRead(Insert("o1", nil), Insert("o2", nil), Insert("o3", nil))
}

func TestMockExpectTxAck(t *testing.T) {
	m := NewMock(t, mockConfig())
	expectTxAckStart(m)
	m.ExpectBegin()
	m.ExpectExec("INSERT INTO effects VALUES ($1)").WithArgs("12").WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectTxAck(12)
	m.ExpectCommit()
	require.NoError(t, runTxAck(t, m))
	require.NoError(t, m.ExpectationsWereMet())
}

// A token that certifies another row than the one expected does not match: the write fails
// (and so does the rollback, unexpected while the write is still expected).
func TestMockExpectTxAckChecksTheToken(t *testing.T) {
	m := NewMock(t, mockConfig())
	expectTxAckStart(m)
	m.ExpectBegin()
	m.ExpectExec("INSERT INTO effects VALUES ($1)").WithArgs("12").WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectTxAck(13)
	require.ErrorContains(t, runTxAck(t, m), "MarkProcessedTx")
	require.Error(t, m.ExpectationsWereMet(), "the write expected was not sent")
}
