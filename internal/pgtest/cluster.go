//go:build unix

package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
)

// cluster is a PostgreSQL cluster this package created with initdb and runs as a child process.
type cluster struct {
	dir     string              // temporary directory holding everything below; immutable
	dataDir string              // PGDATA; immutable
	sockDir string              // unix socket directory; immutable
	logPath string              // server log (and initdb output); immutable
	bin     binaries            // immutable
	cred    *syscall.Credential // run initdb and postgres as this user; nil: as this process
	fsync   bool                // immutable
	listen  string              // listen_addresses; immutable
	logf    func(format string, args ...any)

	mu      sync.Mutex  // serializes start, restart, kill and stop; guards the fields below
	port    int         // chosen at the first start, kept across restarts
	pm      *postmaster // the running postmaster; nil when not running
	stopped bool        // stop was called
}

// postmaster is one run of the postgres server process.
type postmaster struct {
	pid  int
	done chan struct{} // closed once the process has exited and been reaped
}

// live holds the pids of the postmasters this process runs, so that reaping orphans never
// touches them.
var live struct {
	sync.Mutex              // guards pids
	pids       map[int]bool // running postmasters
	spawns     sync.Mutex   // held across starting a postmaster and across reaping orphans
}

// startError is a failed start, with the end of the server log.
type startError struct {
	err error
	log string // the log lines written during this start
}

func (e *startError) Error() string {
	if e.log == "" {
		return e.err.Error()
	}
	return e.err.Error() + "; the server log ends with:\n" + e.log
}

func (e *startError) Unwrap() error { return e.err }

// retryable reports whether a start failed for a reason that goes away: the port is taken, or
// processes of a killed postmaster still hold its shared memory.
func (e *startError) retryable() bool {
	for _, s := range []string{"Address already in use", "could not create any TCP/IP sockets",
		"shared memory block is still in use", "lock file"} {
		if strings.Contains(e.log, s) {
			return true
		}
	}
	return false
}

// startLocal creates a cluster in a temporary directory and starts it.
func startLocal(ctx context.Context, opts Options, logf func(string, ...any)) (*Server, error) {
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	cred, err := serverUser()
	if err != nil {
		return nil, err
	}
	base, err := baseDir(cred)
	if err != nil {
		return nil, err
	}
	sweepStale(base, logf)
	dir, err := makeClusterDir(base, cred)
	if err != nil {
		return nil, err
	}
	c := &cluster{
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		sockDir: filepath.Join(dir, "sock"),
		logPath: filepath.Join(dir, "postgres.log"),
		bin:     bin,
		cred:    cred,
		fsync:   opts.Fsync,
		listen:  "127.0.0.1",
		logf:    logf,
	}
	if err := c.initdb(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if opts.ListenAddress != "" {
		c.listen += "," + opts.ListenAddress
		if err := c.trustEveryHost(); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := c.startFresh(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s := newServer(c.dsn(), logf)
	s.local = c
	logf("pgtest: started %s in %s on port %d", bin.postgres, dir, c.port)
	return s, nil
}

func (c *cluster) dsn() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// socketDSN is the DSN of the default database over the cluster's unix socket.
func (c *cluster) socketDSN() string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", c.sockDir, c.port)
}

// command returns a command running a server binary as the server user, its output appended
// to the log.
func (c *cluster) command(path string, args []string, log *os.File) *exec.Cmd {
	cmd := exec.Command(path, args...)
	cmd.Dir = c.dir
	cmd.Env = serverEnv()
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.SysProcAttr = serverProcAttr(c.cred)
	return cmd
}

func (c *cluster) openLog() (*os.File, int64, error) {
	f, err := os.OpenFile(c.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, 0, err
	}
	return f, st.Size(), nil
}

// initdb creates the data directory.
func (c *cluster) initdb(ctx context.Context) error {
	log, since, err := c.openLog()
	if err != nil {
		return fmt.Errorf("pgtest: initdb: %w", err)
	}
	cmd := c.command(c.bin.initdb, []string{"-D", c.dataDir, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "-N"}, log)
	err = cmd.Start()
	if err == nil {
		stop := context.AfterFunc(ctx, func() { _ = cmd.Process.Kill() })
		err = cmd.Wait()
		stop()
	}
	_ = log.Close()
	if err != nil {
		return &startError{err: fmt.Errorf("pgtest: initdb: %w", err), log: c.logTail(since)}
	}
	return nil
}

// trustEveryHost lets clients from any address connect without a password, for a server that
// also listens on a test network's address.
func (c *cluster) trustEveryHost() error {
	f, err := os.OpenFile(filepath.Join(c.dataDir, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgtest: pg_hba.conf: %w", err)
	}
	_, err = f.WriteString("host all all 0.0.0.0/0 trust\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgtest: pg_hba.conf: %w", err)
	}
	return nil
}

// args are the postgres command-line arguments; settings given here win over postgresql.conf.
// synchronous_commit keeps its default (on) even without fsync: with it off, a commit returns
// before its WAL is written, and a killed server loses it.
func (c *cluster) args() []string {
	durable := "off"
	if c.fsync {
		durable = "on"
	}
	return []string{"-D", c.dataDir, "-p", strconv.Itoa(c.port), "-k", c.sockDir,
		"-c", "listen_addresses=" + c.listen,
		"-c", "max_connections=200",
		"-c", "shared_buffers=128MB",
		"-c", "fsync=" + durable,
		"-c", "full_page_writes=" + durable,
		"-c", "max_prepared_transactions=10", // for tests of two-phase commit
	}
}

// startFresh starts the cluster the first time, on a free port, trying another port when the
// chosen one is taken before the server binds it.
func (c *cluster) startFresh(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return fmt.Errorf("pgtest: find a free port: %w", err)
		}
		c.port = port
		err = c.startLocked(ctx)
		var se *startError
		if err == nil || attempt == 5 || !errors.As(err, &se) || !se.retryable() {
			return err
		}
		c.logf("pgtest: port %d: %v; trying another port", port, err)
	}
}

// startSamePortLocked starts the cluster on its port, retrying for a while when the port or
// the shared memory of a killed postmaster is still held.
func (c *cluster) startSamePortLocked(ctx context.Context) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.startLocked(ctx)
		var se *startError
		if err == nil || !errors.As(err, &se) || !se.retryable() || time.Now().After(deadline) {
			return err
		}
		c.logf("pgtest: start: %v; retrying", err)
		if !backoff.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// startLocked starts postgres and waits until it accepts connections. On failure no process
// is left running.
func (c *cluster) startLocked(ctx context.Context) error {
	if c.stopped {
		return errors.New("pgtest: start: server stopped")
	}
	log, since, err := c.openLog()
	if err != nil {
		return fmt.Errorf("pgtest: start: %w", err)
	}
	pm, err := spawn(c.command(c.bin.postgres, c.args(), log))
	_ = log.Close() // the child has its own descriptor
	if err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	// Over the socket in the cluster's own directory: the TCP port might be answered by
	// another server that took it first.
	if err := waitReady(ctx, c.socketDSN(), pm); err != nil {
		_ = syscall.Kill(pm.pid, syscall.SIGQUIT)
		select {
		case <-pm.done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(pm.pid, syscall.SIGKILL)
			<-pm.done
		}
		return &startError{err: fmt.Errorf("pgtest: start postgres on port %d: %w", c.port, err), log: c.logTail(since)}
	}
	c.pm = pm
	return nil
}

// spawn starts cmd and reaps it in a goroutine locked to its OS thread: on Linux the parent
// death signal fires when the thread that started the child exits, so that thread must live
// as long as the child.
func spawn(cmd *exec.Cmd) (*postmaster, error) {
	live.spawns.Lock()
	defer live.spawns.Unlock()
	pm := &postmaster{done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		pid := cmd.Process.Pid
		live.Lock()
		if live.pids == nil {
			live.pids = map[int]bool{}
		}
		live.pids[pid] = true
		live.Unlock()
		started <- nil
		_ = cmd.Wait()
		live.Lock()
		delete(live.pids, pid)
		live.Unlock()
		close(pm.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	pm.pid = cmd.Process.Pid
	return pm, nil
}

// waitReady polls until the server accepts a connection, the process exits, or ctx (bounded by
// readyTimeout) ends.
func waitReady(ctx context.Context, dsn string, pm *postmaster) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		conn, err := connect(ctx, dsn)
		if err == nil {
			return conn.Close(ctx)
		}
		t := time.NewTimer(pollInterval)
		select {
		case <-pm.done:
			t.Stop()
			return errors.New("postgres exited")
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("not accepting connections: %w (last error: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// shutdown stops the postmaster: fast shutdown, then immediate, then SIGKILL.
func shutdown(pm *postmaster) error {
	for _, step := range []struct {
		sig  syscall.Signal
		wait time.Duration
	}{{syscall.SIGINT, readyTimeout}, {syscall.SIGQUIT, 5 * time.Second}, {syscall.SIGKILL, 5 * time.Second}} {
		select {
		case <-pm.done:
			return nil
		default:
		}
		if err := syscall.Kill(pm.pid, step.sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("signal postmaster %d: %w", pm.pid, err)
		}
		t := time.NewTimer(step.wait)
		select {
		case <-pm.done:
			t.Stop()
			return nil
		case <-t.C:
		}
	}
	return fmt.Errorf("postmaster %d did not exit", pm.pid)
}

// restart shuts the server down (fast) and starts it again on the same port.
func (c *cluster) restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pm != nil {
		if err := shutdown(c.pm); err != nil {
			return fmt.Errorf("pgtest: restart: %w", err)
		}
		c.pm = nil
	}
	if err := c.startSamePortLocked(ctx); err != nil {
		return fmt.Errorf("pgtest: restart: %w", err)
	}
	c.logf("pgtest: restarted the server on port %d", c.port)
	return nil
}

// kill sends SIGKILL to the postmaster and its children, then starts the server again.
func (c *cluster) kill(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if pm := c.pm; pm != nil {
		pid, err := readPostmasterPid(c.dataDir)
		if err != nil || pid != pm.pid {
			c.logf("pgtest: postmaster.pid: pid %d, %v; killing the process started, %d", pid, err, pm.pid)
			pid = pm.pid
		}
		children := childrenOf(pid)
		restore := becomeSubreaper() // the children come to this process when the postmaster dies
		err = syscall.Kill(pid, syscall.SIGKILL)
		if err == nil {
			select {
			case <-pm.done:
			case <-time.After(readyTimeout):
				err = errors.New("did not exit")
			}
		}
		restore()
		if err != nil {
			return fmt.Errorf("pgtest: kill postmaster %d: %w", pid, err)
		}
		c.pm = nil
		reapOrphans(children)
	}
	if err := c.startSamePortLocked(ctx); err != nil {
		return fmt.Errorf("pgtest: start after kill: %w", err)
	}
	c.logf("pgtest: killed the server and started it again on port %d", c.port)
	return nil
}

// reapOrphans kills the given children of a killed postmaster and any postgres process that
// became a child of this process, and waits until they are gone.
func reapOrphans(children []int) {
	live.spawns.Lock()
	defer live.spawns.Unlock()
	live.Lock()
	targets := map[int]bool{}
	for _, pid := range append(children, orphans()...) {
		if !live.pids[pid] {
			targets[pid] = true
		}
	}
	live.Unlock()
	for pid := range targets {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(5 * time.Second)
	for pid := range targets {
		if isChild(pid) {
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, 0, nil)
			continue
		}
		for !gone(pid) && time.Now().Before(deadline) {
			time.Sleep(pollInterval)
		}
	}
}

// stop shuts the server down and removes its directory.
func (c *cluster) stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	var err error
	if c.pm != nil {
		err = shutdown(c.pm)
		c.pm = nil
	}
	if rmErr := os.RemoveAll(c.dir); rmErr != nil && err == nil {
		err = rmErr
	}
	if err != nil {
		return fmt.Errorf("pgtest: stop: %w", err)
	}
	c.logf("pgtest: stopped the server and removed %s", c.dir)
	return nil
}

// readPostmasterPid reads the postmaster's pid from the first line of postmaster.pid.
func readPostmasterPid(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// logTail returns the last lines the server log got after offset since.
func (c *cluster) logTail(since int64) string {
	const maxBytes, maxLines = 4096, 20
	f, err := os.Open(c.logPath)
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	if since >= st.Size() {
		return ""
	}
	since = max(since, st.Size()-maxBytes)
	b := make([]byte, st.Size()-since)
	n, _ := f.ReadAt(b, since)
	lines := strings.Split(strings.TrimRight(string(b[:n]), "\n"), "\n")
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	return strings.Join(lines, "\n")
}
