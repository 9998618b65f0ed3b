package lock

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLockHalves(t *testing.T) {
	c, o := Halves(-1)
	require.Equal(t, [2]int64{0xffffffff, 0xffffffff}, [2]int64{c, o}, "pg_locks shows both halves unsigned")
	c, o = Halves(0x0000000100000002)
	require.Equal(t, [2]int64{1, 2}, [2]int64{c, o})
}

// fakeSession is a lock session whose pings fail once ping is set, and whose lock check
// answers held. It counts its pings.
type fakeSession struct {
	mu     sync.Mutex
	pings  int
	ping   error
	held   bool
	closed bool
}

func (s *fakeSession) TryLock(context.Context, int64) (bool, error) { return true, nil }

func (s *fakeSession) Ping(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pings++
	return s.ping
}

func (s *fakeSession) Query(_ context.Context, stmt string, args ...string) ([]sql.NullString, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !strings.Contains(stmt, "pg_backend_pid()") || len(args) != 2 {
		return nil, errors.New("unexpected statement")
	}
	return []sql.NullString{{String: map[bool]string{true: "t", false: "f"}[s.held], Valid: true}}, nil
}

func (s *fakeSession) Close() { s.closed = true }

func (s *fakeSession) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ping = err
}

func TestSettleWaitsAndChecksTheLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := NewElector(ElectorConfig{Key: Key("resume_tokens", "c")})
		s := &fakeSession{held: true}
		start := time.Now()
		require.NoError(t, e.Settle(t.Context(), s))
		require.Equal(t, SettleTime, time.Since(start))
		require.Equal(t, int(SettleTime/checkInterval), s.pings, "the session is checked meanwhile")

		s.held = false
		require.ErrorIs(t, e.Settle(t.Context(), s), ErrNotHeld, "the session must still hold the lock at the end")
	})
}

func TestSettleEndsAtTheFirstFailedCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := NewElector(ElectorConfig{Key: 1})
		s := &fakeSession{held: true}
		time.AfterFunc(checkInterval+checkInterval/2, func() { s.fail(errors.New("terminated")) })
		start := time.Now()
		require.ErrorContains(t, e.Settle(t.Context(), s), "terminated")
		require.Equal(t, 2*checkInterval, time.Since(start))

		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		require.ErrorIs(t, e.Settle(ctx, &fakeSession{held: true}), context.Canceled)
	})
}

func TestKeepReportsALostSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := NewElector(ElectorConfig{Key: 1})
		s := &fakeSession{}
		time.AfterFunc(10*checkInterval+checkInterval/2, func() { s.fail(errors.New("connection reset")) })
		start := time.Now()
		require.ErrorContains(t, e.Keep(t.Context(), s), "connection reset")
		require.Equal(t, 11*checkInterval, time.Since(start), "found at the next check")
		require.Equal(t, 11, s.pings)
	})
}

func TestKeepEndsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := NewElector(ElectorConfig{Key: 1})
		s := &fakeSession{}
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(3*checkInterval+checkInterval/2, func() {
			s.fail(context.Canceled) // a check cut short by the end is not a loss
			cancel()
		})
		require.NoError(t, e.Keep(ctx, s))
		require.Equal(t, 3, s.pings)
		require.False(t, s.closed, "the watcher releases the session")
	})
}
