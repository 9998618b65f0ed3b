package listen

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bundle is a listener on a configuration that cannot connect, with what its hooks saw.
type bundle struct {
	l      *Listener
	hints  *Hints
	logs   *bytes.Buffer
	wakes  int
	noIDs  bool
	failed chan error // each failed connect, as Failed is told of it
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pc, err := pgconn.ParseConfig("postgres://u@127.0.0.1:1/db?sslmode=disable")
	require.NoError(t, err)
	b := &bundle{hints: &Hints{}, logs: &bytes.Buffer{}, failed: make(chan error, 100)}
	b.l = New(Config{
		Conn: pc, AppName: "pgchangestream", ConnectTimeout: time.Second, Channel: "datastore_changes",
		Table: "t", Hints: b.hints, Logger: slog.New(slog.NewTextHandler(b.logs, nil)),
		NoIDs: func() bool { return b.noIDs },
		Wake:  func() { b.wakes++ },
		Failed: func(err error, retryIn time.Duration) {
			assert.Positive(t, retryIn) // on the listener goroutine: no FailNow
			b.failed <- err
		},
		Connected: func() { t.Error("connected to a closed port") },
		Lost:      func(err error) { t.Error("lost a connection never made") },
	})
	return b
}

func TestNewDefaultsTheConnection(t *testing.T) {
	b := setup(t)
	require.Equal(t, "pgchangestream", b.l.cfg.Conn.RuntimeParams["application_name"])
	require.Equal(t, time.Second, b.l.cfg.Conn.ConnectTimeout)
	require.NotNil(t, b.l.cfg.Conn.OnNotification)

	pc, err := pgconn.ParseConfig("postgres://u@localhost/db?application_name=mine&connect_timeout=3")
	require.NoError(t, err)
	New(Config{Conn: pc, AppName: "pgchangestream", ConnectTimeout: time.Second})
	require.Equal(t, "mine", pc.RuntimeParams["application_name"], "the connection string's name is kept")
	require.Equal(t, 3*time.Second, pc.ConnectTimeout)
}

func TestNotifyNotesIDsAndWakes(t *testing.T) {
	b := setup(t)
	b.l.Notify(`{"id": 7, "table": "t", "operation": "UPDATE"}`)
	b.l.Notify(`{"id": 8, "operation": "INSERT"}`) // no table: kept
	require.Equal(t, 2, b.wakes)
	require.Equal(t, []int64{7, 8}, b.hints.Take())
	require.Empty(t, b.hints.Take(), "taken once")
}

func TestNotifyIgnoresOtherTables(t *testing.T) {
	b := setup(t)
	b.l.Notify(`{"id": 999, "table": "other", "operation": "INSERT"}`)
	require.Zero(t, b.wakes)
	require.Empty(t, b.hints.Take())
}

func TestNotifyWakesOnAMalformedPayload(t *testing.T) {
	b := setup(t)
	b.l.Notify(`garbage`)
	b.l.Notify(`{"table": "t"}`)
	require.Equal(t, 2, b.wakes, "a payload that cannot be parsed still wakes the reader")
	require.Empty(t, b.hints.Take())
	require.Equal(t, 2, strings.Count(b.logs.String(), "ignoring a malformed NOTIFY payload"))
	require.Contains(t, b.logs.String(), `no \"id\"`)
}

func TestNotifyWithoutIDsOnlyWakes(t *testing.T) {
	b := setup(t)
	b.noIDs = true
	b.l.Notify(`{"id": 7, "table": "t", "operation": "INSERT"}`)
	require.Equal(t, 1, b.wakes)
	require.Empty(t, b.hints.Take(), "snapshot deltas need no ids")
}

func TestNotifyDropsIDsPastTheBound(t *testing.T) {
	b := setup(t)
	for i := range maxHints + 2 {
		b.l.Notify(`{"id": ` + strconv.Itoa(i) + `, "table": "t"}`)
	}
	require.Equal(t, maxHints+2, b.wakes, "every notification wakes")
	require.Equal(t, 1, strings.Count(b.logs.String(), "too many NOTIFY ids"), "logged once")
	require.Len(t, b.hints.Take(), maxHints)

	b.l.Notify(`{"id": 1, "table": "t"}`)
	for range maxHints {
		b.l.Notify(`{"id": 1, "table": "t"}`)
	}
	require.Equal(t, 2, strings.Count(b.logs.String(), "too many NOTIFY ids"), "logged again after a Take")
}

func TestHintsReturnGoesAheadOfNewerIDs(t *testing.T) {
	var h Hints
	h.Return(nil)
	require.Empty(t, h.Take())
	h.add(3)
	h.Return([]int64{1, 2})
	require.Equal(t, []int64{1, 2, 3}, h.Take())

	for i := range maxHints {
		h.add(int64(i))
	}
	h.Return([]int64{-1, -2})
	got := h.Take()
	require.Len(t, got, maxHints, "returned ids do not pass the bound")
	require.Equal(t, []int64{-1, -2, 0}, got[:3], "the oldest ids are kept")
}

func TestRecentIDsForgetsTheOldest(t *testing.T) {
	r := NewRecentIDs(3)
	for _, id := range []int64{1, 2, 2} {
		r.Add(id)
	}
	require.True(t, r.Contains(1))
	require.True(t, r.Contains(2))
	require.False(t, r.Contains(3))
	r.Add(3) // forgets 1
	require.False(t, r.Contains(1))
	require.True(t, r.Contains(2))
	r.Add(4) // forgets one 2: the other is still remembered
	require.True(t, r.Contains(2))
	r.Add(5) // forgets the last 2
	require.False(t, r.Contains(2))
	require.True(t, r.Contains(3))
	require.True(t, r.Contains(4))
	require.True(t, r.Contains(5))
}

func TestRunRetriesAndIsReadyAfterTheFirstAttempt(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.l.Run(ctx)
	}()
	<-b.l.Ready()
	select {
	case err := <-b.failed:
		require.ErrorContains(t, err, "connect: ", "ready after the first failed attempt")
	default:
		t.Fatal("ready before the first attempt was reported")
	}
	require.ErrorContains(t, <-b.failed, "connect: ", "it retries")
	cancel()
	<-done
	require.Zero(t, b.wakes, "no catch-up read without a connection")
}

func TestRunIsReadyWhenStoppedFirst(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	b.l.Run(ctx)
	<-b.l.Ready()
}
