package lock

import (
	"context"
	"database/sql"
	"hash/fnv"
	"time"
)

// ReleaseWait bounds the release of a lock session's locks when it closes.
const ReleaseWait = time.Second

// TryLock takes the advisory lock key on conn's session, unless another session holds it.
func TryLock(ctx context.Context, conn *sql.Conn, key int64) (bool, error) {
	var got bool
	err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&got)
	return got, err
}

// Key is the advisory lock of a client: a 64-bit hash of the token table and client name,
// the same for every watcher and for the admin package.
func Key(tokenTable, clientName string) int64 {
	h := fnv.New64a()
	h.Write([]byte("pgchangestream\x00" + tokenTable + "\x00" + clientName))
	return int64(h.Sum64())
}

// SessionResetSQL releases every advisory lock of a pooled lock session and undoes its
// keepalive settings (boundSessionSQL), before the connection goes back to the pool.
const SessionResetSQL = `SELECT pg_advisory_unlock_all(); RESET tcp_keepalives_idle; RESET tcp_keepalives_interval;
	RESET tcp_keepalives_count; RESET tcp_user_timeout`

// Release releases every advisory lock of conn's session and returns the connection to the pool; if
// that fails, it closes the connection itself so that no lock outlives the session.
func Release(conn *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), ReleaseWait)
	defer cancel()
	if _, err := conn.ExecContext(ctx, SessionResetSQL); err != nil {
		_ = conn.Raw(func(dc any) error {
			if c, ok := dc.(interface{ Close() error }); ok {
				return c.Close()
			}
			return nil
		})
	}
	_ = conn.Close()
}
