package lock

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Session is the dedicated session that holds a client's advisory lock. Its methods are safe
// for concurrent use: each serializes the session's use.
type Session interface {
	// TryLock takes the advisory lock key, unless another session holds it.
	TryLock(ctx context.Context, key int64) (bool, error)
	// Ping checks that the session is alive.
	Ping(ctx context.Context) error
	// Query runs a statement with text arguments and returns its first row as text (nil
	// when it returns none).
	Query(ctx context.Context, stmt string, args ...string) ([]sql.NullString, error)
	// Close ends the session, which releases its locks.
	Close()
}

// keepaliveProbes is the number of unanswered TCP keepalive probes that end a lock session.
const keepaliveProbes = 3

// keepalives returns the TCP keepalive idle time and probe interval, in seconds, after which
// keepaliveProbes unanswered probes end a session whose peer vanished: at most d in all.
// d is at least 4s (the watcher's MinLockSessionTimeout).
func keepalives(d time.Duration) (idle, interval int) {
	secs := int(d / time.Second)
	interval = max(1, secs/(2*keepaliveProbes))
	return max(1, secs-keepaliveProbes*interval), interval
}

// boundSessionSQL sets the server side of a lock session's keepalives and TCP user timeout.
const boundSessionSQL = `SELECT set_config('tcp_keepalives_idle', $1, false), set_config('tcp_keepalives_interval', $2, false),
	set_config('tcp_keepalives_count', $3, false), set_config('tcp_user_timeout', $4, false)`

// bound makes the server end the lock session within the elector's SessionTimeout once the
// watcher's host stops answering, so that a standby can take the lock. A server that refuses
// the settings (tcp_user_timeout is PostgreSQL 12 and later) is warned about once.
func (e *Elector) bound(ctx context.Context, s Session) {
	idle, interval := keepalives(e.cfg.SessionTimeout)
	_, err := s.Query(ctx, boundSessionSQL, strconv.Itoa(idle), strconv.Itoa(interval),
		strconv.Itoa(keepaliveProbes), strconv.FormatInt(e.cfg.SessionTimeout.Milliseconds(), 10))
	if err != nil && !e.boundWarned.Swap(true) {
		e.cfg.Logger.Warn("cannot bound the exclusive lock session: a host that vanishes keeps the lock until the "+
			"server's own TCP timeouts end its session", "error", err)
	}
}

// open connects with the elector's ConnString when set, else takes a connection from its DB,
// and bounds the session's life after its host vanished.
func (e *Elector) open(ctx context.Context) (Session, error) {
	var s Session
	if e.cfg.ConnString == "" {
		c, err := e.cfg.DB.Conn(ctx)
		if err != nil {
			return nil, err
		}
		s = &sqlSession{conn: c}
	} else {
		pc, err := pgconn.ParseConfig(e.cfg.ConnString)
		if err != nil {
			return nil, err
		}
		if _, ok := pc.RuntimeParams["application_name"]; !ok {
			pc.RuntimeParams["application_name"] = e.cfg.AppName
		}
		if pc.ConnectTimeout == 0 {
			pc.ConnectTimeout = e.cfg.ConnectTimeout
		}
		idle, interval := keepalives(e.cfg.SessionTimeout)
		pc.DialFunc = (&net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true,
			Idle: time.Duration(idle) * time.Second, Interval: time.Duration(interval) * time.Second,
			Count: keepaliveProbes}}).DialContext
		conn, err := pgconn.ConnectConfig(ctx, pc)
		if err != nil {
			return nil, fmt.Errorf("connect: %w", err)
		}
		s = &pgSession{conn: conn}
	}
	e.bound(ctx, s)
	return s, nil
}

// pgSession is a lock session on a connection of its own.
type pgSession struct {
	mu   sync.Mutex // serializes the connection's use: the lock check and the owner epoch claim
	conn *pgconn.PgConn
}

func (s *pgSession) TryLock(ctx context.Context, key int64) (bool, error) {
	row, err := s.Query(ctx, `SELECT pg_try_advisory_lock($1)`, strconv.FormatInt(key, 10))
	return len(row) == 1 && row[0].String == "t", err
}

func (s *pgSession) Ping(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn.Ping(ctx)
}

func (s *pgSession) Query(ctx context.Context, stmt string, args ...string) ([]sql.NullString, error) {
	params := make([][]byte, len(args))
	for i, a := range args {
		params[i] = []byte(a)
	}
	s.mu.Lock()
	res := s.conn.ExecParams(ctx, stmt, params, nil, nil, nil).Read()
	s.mu.Unlock()
	if res.Err != nil || len(res.Rows) == 0 {
		return nil, res.Err
	}
	row := make([]sql.NullString, len(res.Rows[0]))
	for i, v := range res.Rows[0] {
		row[i] = sql.NullString{String: string(v), Valid: v != nil}
	}
	return row, nil
}

// Close ends the session, which releases its locks.
func (s *pgSession) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), ReleaseWait)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.conn.Close(ctx)
}

// sqlSession is a lock session on a connection held out of the pool.
type sqlSession struct {
	mu   sync.Mutex // serializes the connection's use (a query's rows hold the connection)
	conn *sql.Conn
}

func (s *sqlSession) TryLock(ctx context.Context, key int64) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return TryLock(ctx, s.conn, key)
}

func (s *sqlSession) Ping(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn.PingContext(ctx)
}

func (s *sqlSession) Query(ctx context.Context, stmt string, args ...string) ([]sql.NullString, error) {
	vals := make([]any, len(args))
	for i, a := range args {
		vals[i] = a
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rows, err := s.conn.QueryContext(ctx, stmt, vals...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	if !rows.Next() {
		return nil, rows.Err()
	}
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	vals = make([]any, len(cols))
	dest := make([]any, len(cols))
	for i := range vals {
		dest[i] = &vals[i]
	}
	if err := rows.Scan(dest...); err != nil {
		return nil, err
	}
	row := make([]sql.NullString, len(cols))
	for i, v := range vals {
		row[i] = textValue(v)
	}
	return row, rows.Close()
}

// textValue is a column value of the driver in PostgreSQL's text format.
func textValue(v any) sql.NullString {
	switch v := v.(type) {
	case nil:
		return sql.NullString{}
	case bool:
		if v {
			return sql.NullString{String: "t", Valid: true}
		}
		return sql.NullString{String: "f", Valid: true}
	case []byte:
		return sql.NullString{String: string(v), Valid: true}
	}
	return sql.NullString{String: fmt.Sprint(v), Valid: true}
}

// Close releases every advisory lock of the session and returns the connection to the pool (see
// Release).
func (s *sqlSession) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	Release(s.conn)
}
