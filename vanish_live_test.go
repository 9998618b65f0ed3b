package pgchangestream

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/lock"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
)

// vanishDSN, set in the environment, makes TestLiveExclusiveVanishedHostIsReplaced run as the
// watcher on the host that vanishes: a child process inside a network namespace.
const vanishDSN = "PGCHANGESTREAM_VANISH_DSN"

// TestLiveExclusiveVanishedHostIsReplaced: an exclusive watcher's host vanishes without closing
// its connections (its network link is cut, so no FIN or RST ever reaches the server). The
// server ends its lock session within Config.LockSessionTimeout, through the keepalives the
// watcher set on it, and a standby takes over within that bound plus a standby poll and the
// settle wait. Without those settings the session would hold the lock for the operating
// system's keepalive time (two hours by default).
//
// The vanishing watcher runs in a child process inside a network namespace of the test's own,
// connected to the server through a veth pair; the standby runs here, over the loopback.
func TestLiveExclusiveVanishedHostIsReplaced(t *testing.T) {
	if dsn := os.Getenv(vanishDSN); dsn != "" {
		runVanishingWatcher(t, dsn)
		return
	}
	ns, peerDev, hostAddr := newTestNetwork(t)
	srv := pgtest.NewServer(t, pgtest.Options{ListenAddress: hostAddr})
	e := newLiveOn(t, srv)
	peerDSN := dsnWithHost(t, e.dsn, hostAddr)

	child := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestLiveExclusiveVanishedHostIsReplaced$")
	child.Env = append(os.Environ(), vanishDSN+"="+peerDSN)
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	child.Stderr = os.Stderr
	require.NoError(t, child.Start())
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	active := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(out)
		for lines.Scan() {
			if strings.HasPrefix(lines.Text(), "vanish: active") {
				active <- lines.Text()
			}
		}
		close(active)
	}()
	select {
	case _, ok := <-active:
		require.True(t, ok, "the watcher in the namespace exited before it was active")
	case <-time.After(30 * time.Second):
		t.Fatal("the watcher in the namespace did not become active")
	}

	cfg := e.config(ModeHybrid)
	cfg.Exclusive, cfg.LockSessionTimeout = true, MinLockSessionTimeout
	standby := e.start(cfg)
	time.Sleep(2 * lock.StandbyPoll)
	require.False(t, standby.Stats().Active, "the standby waits while the other watcher holds the lock")

	cut := time.Now()
	out2, err := exec.Command("ip", "netns", "exec", ns, "ip", "link", "set", peerDev, "down").CombinedOutput()
	require.NoError(t, err, "cut the link: %s", out2)
	bound := cfg.LockSessionTimeout + 2*lock.StandbyPoll + lock.SettleTime + time.Second
	require.Eventually(t, func() bool { return standby.Stats().Active }, bound+10*time.Second, 20*time.Millisecond,
		"the standby never took over from the vanished watcher")
	took := time.Since(cut)
	t.Logf("the standby took over %v after the link was cut (LockSessionTimeout %v, bound %v)",
		took.Round(10*time.Millisecond), cfg.LockSessionTimeout, bound)
	require.LessOrEqual(t, took, bound, "the vanished watcher's lock session outlived the bound")
}

// runVanishingWatcher is the child's side: an exclusive watcher that becomes active, says so,
// and runs until it is killed.
func runVanishingWatcher(t *testing.T, dsn string) {
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	w, err := New(Config{DB: db, ConnString: dsn, ClientName: "c", TableName: liveTable, Mode: ModeHybrid,
		Exclusive: true, LockSessionTimeout: MinLockSessionTimeout, Logger: quietLogger})
	require.NoError(t, err)
	w.Start(context.Background())
	require.Eventually(t, func() bool { return w.Stats().Active }, 30*time.Second, 10*time.Millisecond)
	fmt.Println("vanish: active")
	time.Sleep(5 * time.Minute) // killed by the test long before
}

// newTestNetwork creates a network namespace linked to this one by a veth pair, removed when the
// test ends, and returns its name, the name of its end of the pair and this end's address.
func newTestNetwork(t *testing.T) (ns, peerDev, hostAddr string) {
	t.Helper()
	ns = fmt.Sprintf("pgcs%d", os.Getpid())
	hostDev, peerDev := fmt.Sprintf("pgcsa%d", os.Getpid()%10000000), fmt.Sprintf("pgcsb%d", os.Getpid()%10000000)
	sub := os.Getpid()%250 + 1
	hostAddr, peerAddr := fmt.Sprintf("10.213.%d.1", sub), fmt.Sprintf("10.213.%d.2", sub)
	run := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %s: %s (the test needs root and iproute2)", strings.Join(args, " "), out)
	}
	run("netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() }) // deletes the veth pair too
	run("link", "add", hostDev, "type", "veth", "peer", "name", peerDev)
	run("link", "set", peerDev, "netns", ns)
	run("addr", "add", hostAddr+"/30", "dev", hostDev)
	run("link", "set", hostDev, "up")
	run("netns", "exec", ns, "ip", "addr", "add", peerAddr+"/30", "dev", peerDev)
	run("netns", "exec", ns, "ip", "link", "set", peerDev, "up")
	run("netns", "exec", ns, "ip", "link", "set", "lo", "up")
	return ns, peerDev, hostAddr
}

// dsnWithHost returns dsn with its host replaced by host.
func dsnWithHost(t *testing.T, dsn, host string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.Host = host + ":" + u.Port()
	return u.String()
}
