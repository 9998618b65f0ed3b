package pgchangestream

import (
	"bufio"
	"database/sql"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// txAckChildDSN and txAckChildMode, set in the environment, make
// TestLiveTxAckExactlyOnceProcessKill run as the consumer: a child process killed by the test.
const (
	txAckChildDSN  = "PGCHANGESTREAM_TXACK_CHILD_DSN"
	txAckChildMode = "PGCHANGESTREAM_TXACK_CHILD_MODE"
)

// txAckPhase prefixes the lines in which the child consumer reports where it is.
const txAckPhase = "txack: "

// TestLiveTxAckExactlyOnceProcessKill: the same as [TestLiveTxAckExactlyOnce], the consumer
// running in a child process that is killed with SIGKILL at random moments (with a transaction
// open, or between a commit and the next event) and started again, while writers commit. No
// Close, no final save, no rollback by the client: the server ends the dead sessions.
func TestLiveTxAckExactlyOnceProcessKill(t *testing.T) {
	if dsn := os.Getenv(txAckChildDSN); dsn != "" {
		runTxAckChild(t, dsn, Mode(os.Getenv(txAckChildMode)))
		return
	}
	for _, mode := range []Mode{ModePolling, ModeNotify, ModeHybrid} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newLive(t)
			killedIn := map[string]int{} // the child's last reported phase → kills
			kills := 0
			round := func(rng *rand.Rand, drain bool) bool {
				run := 200*time.Millisecond + time.Duration(rng.IntN(800))*time.Millisecond
				if drain {
					run = 3 * time.Second
				}
				killedIn[runChildFor(t, e, "TestLiveTxAckExactlyOnceProcessKill", mode, run)]++
				kills++
				return true
			}
			runTxAckExactlyOnce(t, e, mode, func(int) bool { return kills >= 10 }, round)
			t.Logf("%s: %d kills by the child's last phase: %v", mode, kills, killedIn)
			require.Positive(t, killedIn["begin"]+killedIn["acked"], "no kill came with a transaction open")
			require.Positive(t, killedIn["commit"], "no kill came between a commit and the next event")
		})
	}
}

// runChildFor starts the child consumer (the test named test, run with the child's environment),
// kills it with SIGKILL after run, and returns the phase it last reported: "begin" or "acked" (a transaction open, before or after
// MarkProcessedTx wrote in it), "commit" (committed, before the next event) or "" (before its
// first transaction).
func runChildFor(t *testing.T, e *liveEnv, test string, mode Mode, run time.Duration) string {
	child := exec.Command(os.Args[0], "-test.run=^"+test+"$")
	child.Env = append(os.Environ(), txAckChildDSN+"="+e.dsn, txAckChildMode+"="+string(mode))
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	child.Stderr = os.Stderr
	require.NoError(t, child.Start())
	phase := make(chan string, 1)
	go func() {
		last := ""
		for lines := bufio.NewScanner(out); lines.Scan(); {
			if p, ok := strings.CutPrefix(lines.Text(), txAckPhase); ok {
				last = p
			} else {
				fmt.Fprintln(os.Stderr, lines.Text()) // the child's test output
			}
		}
		phase <- last
	}()
	time.Sleep(run)
	_ = child.Process.Kill() // fails only if the child has exited: the status below says so
	last := <-phase          // the pipe is read to its end before Wait closes it
	err = child.Wait()
	status, _ := child.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, status.Signaled() && status.Signal() == syscall.SIGKILL,
		"the child consumer ended by itself before it was killed: %v", err)
	return last
}

// runTxAckChild is the child's side: the consumer of [txAckConsume], reporting its phases on
// stdout and holding each transaction open and each pause after a commit for a random moment,
// so that the kill lands in either. It runs until it is killed.
func runTxAckChild(t *testing.T, dsn string, mode Mode) {
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	e := &liveEnv{t: t, db: db, dsn: dsn}
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 19))
	mark := func(phase string) {
		fmt.Println(txAckPhase + phase)
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
	}
	for {
		cfg := e.config(mode)
		cfg.StartFromBeginning = true
		c := e.startCrashable(cfg)
		for !txAckConsume(t, db, c, math.MaxInt, 2, rng, txAckFault{mark: mark}) && c.Err() == nil {
		}
		c.crash() // an error: start again from the saved token
	}
}

// A delivery replayed after a crash (no acknowledgement saved) has the key it had the first
// time: "<table>/<changelog id>".
func TestLiveIdempotencyKeyStableAcrossReplay(t *testing.T) {
	t.Parallel()
	e := newLive(t)
	cfg := e.config(ModeHybrid)
	cfg.StartFromBeginning = true
	ids := e.insert(3)
	keys := func() []string {
		c := e.startCrashable(cfg)
		defer c.crash()
		var got []string
		for range ids {
			select {
			case ev := <-c.Events():
				k, err := ev.IdempotencyKey()
				require.NoError(t, err)
				got = append(got, k)
			case <-time.After(liveWait):
				t.Fatalf("%d of %d events delivered", len(got), len(ids))
			}
		}
		return got
	}
	first := keys()
	require.Equal(t, []string{fmt.Sprintf("items/%d", ids[0]), fmt.Sprintf("items/%d", ids[1]), fmt.Sprintf("items/%d", ids[2])}, first)
	require.Equal(t, first, keys(), "the replayed deliveries have the same keys")
}
