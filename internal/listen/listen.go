package listen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// LISTEN connection timing: reconnect backoff, and how long the connection may stay silent
// before it is pinged.
const (
	RetryMax     = 5 * time.Second // the longest wait before a reconnect
	retryMin     = 100 * time.Millisecond
	pingInterval = 5 * time.Second
	pingTimeout  = 5 * time.Second
)

// Config is what a [Listener] needs. Every function must be set, except OnConnect; none may
// block for long, since they run on the listener's goroutine.
type Config struct {
	// Conn is the connection's configuration. New sets its OnNotification, and fills
	// application_name and ConnectTimeout when they are unset.
	Conn           *pgconn.Config
	AppName        string        // application_name unless Conn sets one
	ConnectTimeout time.Duration // Conn.ConnectTimeout unless Conn sets one
	Channel        string        // the channel to LISTEN on
	Table          string        // notifications that name another table are ignored
	Hints          *Hints        // where the ids of notified rows go
	Logger         *slog.Logger

	// NoIDs reports that the reader needs no ids (snapshot deltas find every row): a
	// notification then only wakes it.
	NoIDs func() bool
	// Wake asks the reader for a read; it must not block (a coalescing channel of capacity 1).
	Wake func()
	// OnConnect, if set, runs on each new connection after its LISTEN.
	OnConnect func(ctx context.Context, conn *pgconn.PgConn)

	// Failed is told of each failed connect (or LISTEN) and of the wait before the next one;
	// Connected of each connect that listens; Lost of the error that ended an open connection,
	// after which the listener reconnects at once.
	Failed    func(err error, retryIn time.Duration)
	Connected func()
	Lost      func(err error)
}

// Listener is the LISTEN service: it owns one connection, reconnects it, and turns its
// notifications into wake-ups and id hints for the reader. It never reads the changelog.
type Listener struct {
	cfg   Config        // immutable after New
	ready chan struct{} // closed by Run after its first connect attempt
}

// New returns a listener for cfg. It does not connect: [Listener.Run] does.
func New(cfg Config) *Listener {
	pc := cfg.Conn
	if _, ok := pc.RuntimeParams["application_name"]; !ok {
		pc.RuntimeParams["application_name"] = cfg.AppName
	}
	l := &Listener{cfg: cfg, ready: make(chan struct{})}
	pc.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		l.Notify(n.Payload)
	}
	if pc.ConnectTimeout == 0 {
		pc.ConnectTimeout = cfg.ConnectTimeout
	}
	return l
}

// Ready is closed after Run's first connect attempt, whether it succeeded or not, or when Run
// returns before one: the reader waits for it before its first read, so that nothing committed
// in between goes unnoticed.
func (l *Listener) Ready() <-chan struct{} { return l.ready }

// Run owns the LISTEN connection until ctx ends: it reconnects with capped exponential backoff
// and jitter, pings when idle, and wakes the reader after every (re)connect for a catch-up
// read, since notifications sent while disconnected are lost. Call it once, on a goroutine of
// its own.
func (l *Listener) Run(ctx context.Context) {
	first := true
	firstAttemptDone := func() {
		if first {
			first = false
			close(l.ready)
		}
	}
	defer firstAttemptDone()
	retry := backoff.Backoff{Min: retryMin, Max: RetryMax}
	for {
		conn, err := l.connect(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			wait := retry.Next()
			l.cfg.Failed(err, wait)
			firstAttemptDone()
			if !backoff.Sleep(ctx, wait) {
				return
			}
			continue
		}
		retry.Reset()
		l.cfg.Connected()
		firstAttemptDone()
		l.cfg.Wake()
		err = l.receive(ctx, conn)
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = conn.Close(closeCtx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		l.cfg.Lost(err)
		l.cfg.Logger.Warn("LISTEN connection lost; reconnecting", "error", err)
	}
}

// connect opens the connection and runs LISTEN.
func (l *Listener) connect(ctx context.Context) (*pgconn.PgConn, error) {
	conn, err := pgconn.ConnectConfig(ctx, l.cfg.Conn)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+changelog.Quote(l.cfg.Channel)).ReadAll(); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("listen %q: %w", l.cfg.Channel, err)
	}
	l.cfg.Logger.Info("listening", "channel", l.cfg.Channel)
	if l.cfg.OnConnect != nil {
		l.cfg.OnConnect(ctx, conn)
	}
	return conn, nil
}

// receive waits for notifications in short slices, pinging the server when it has been silent,
// until the connection fails or ctx ends.
func (l *Listener) receive(ctx context.Context, conn *pgconn.PgConn) error {
	for {
		waitCtx, cancel := context.WithTimeout(ctx, pingInterval)
		err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case err == nil:
			continue
		case ctx.Err() != nil:
			return ctx.Err()
		case !pgconn.Timeout(err) || conn.IsClosed():
			return err
		}
		pingCtx, cancel := context.WithTimeout(ctx, pingTimeout)
		err = conn.Ping(pingCtx)
		cancel()
		if err != nil {
			return fmt.Errorf("ping: %w", err)
		}
	}
}

// payload is the trigger's NOTIFY payload.
type payload struct {
	ID        *int64 `json:"id"`
	Table     string `json:"table"`
	Operation string `json:"operation"`
}

// Notify handles one notification's payload, as the connection's notifications are: a NOTIFY
// for the table becomes a wake-up and, unless NoIDs, an id hint. A payload that cannot be
// parsed is logged and still wakes the reader.
func (l *Listener) Notify(text string) {
	var p payload
	if err := json.Unmarshal([]byte(text), &p); err != nil || p.ID == nil {
		if err == nil {
			err = errors.New(`no "id"`)
		}
		l.cfg.Logger.Warn("ignoring a malformed NOTIFY payload", "payload", text, "error", err)
		l.cfg.Wake()
		return
	}
	if p.Table != "" && p.Table != l.cfg.Table {
		return
	}
	if l.cfg.NoIDs() { // snapshot deltas find every row: the id is not needed
		l.cfg.Wake()
		return
	}
	if l.cfg.Hints.add(*p.ID) {
		l.cfg.Logger.Warn("too many NOTIFY ids waiting for the reader; dropping ids (a late row may be missed)", "max", maxHints)
	}
	l.cfg.Wake()
}
