// Package processcases is a table of Process scenarios with their specified outcomes. The root
// package's tests run each on a real watcher over the in-memory database, and the test kit's
// tests run each on its FakeWatcher, so the two are held to the same results. It knows neither:
// events are changelog ids 1..Events, keys and failures are functions of the id.
package processcases

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Always is a Fail count that fails every attempt.
const Always = 1 << 30

// Case is one scenario and what it must end with.
type Case struct {
	Name        string
	Events      int           // changelog ids 1..Events, in one table
	Keys        int           // the key of id is id % Keys
	Workers     int           // ProcessOptions.Workers
	MaxAttempts int           // ProcessOptions.MaxAttempts (0: the default, 5)
	Fail        map[int64]int // id → how many of its first attempts fail
	// Stops: Process returns by itself, with an error containing Err; otherwise it runs until
	// its ctx ends and returns nil.
	Stops bool
	Err   string

	Saved   int64  // the id of the saved checkpoint: the end of the finished prefix
	Handled uint64 // Stats().Process.Handled
	Retries uint64 // Stats().Process.Retries
}

// All are the scenarios.
var All = []Case{
	{Name: "every event succeeds", Events: 8, Keys: 3, Workers: 4, Saved: 8, Handled: 8},
	{Name: "one worker, one key", Events: 5, Keys: 1, Workers: 1, Saved: 5, Handled: 5},
	{Name: "a retried event finishes", Events: 6, Keys: 2, Workers: 2, MaxAttempts: 3, Fail: map[int64]int{3: 2},
		Saved: 6, Handled: 6, Retries: 2},
	{Name: "events of other keys pass a retrying one", Events: 6, Keys: 3, Workers: 3, Fail: map[int64]int{1: 4},
		Saved: 6, Handled: 6, Retries: 4},
	// 3 fails for good: 1 and 2 finished, 4 and 6 (key 0) run, 5 waits behind 3 in key 1.
	{Name: "a failure stops at the prefix before it", Events: 6, Keys: 2, Workers: 2, MaxAttempts: 2,
		Fail: map[int64]int{3: Always}, Stops: true, Err: `key "1", token 3`, Saved: 2, Handled: 4, Retries: 1},
}

// Key is the case's key of the event with changelog id.
func (c Case) Key(id int64) string { return strconv.FormatInt(id%int64(c.Keys), 10) }

// Run is one run of a case: the handler's step and what it saw. Safe for concurrent use.
type Run struct {
	c        Case
	mu       sync.Mutex
	attempts map[int64]int
	running  map[string]bool    // keys with a handler running
	order    map[string][]int64 // ids handled successfully, by key, in handling order
	problems []string
}

// NewRun starts a run of c.
func (c Case) NewRun() *Run {
	return &Run{c: c, attempts: map[int64]int{}, running: map[string]bool{}, order: map[string][]int64{}}
}

// Handle is the handler's step for the event with changelog id: it takes a millisecond (run
// the case under testing/synctest), fails the case's number of first attempts, and notes a
// handler running while another of its key runs.
func (r *Run) Handle(id int64) error {
	k := r.c.Key(id)
	r.mu.Lock()
	if r.running[k] {
		r.problems = append(r.problems, fmt.Sprintf("event %d ran while another of key %s ran", id, k))
	}
	r.running[k] = true
	r.mu.Unlock()
	time.Sleep(time.Millisecond)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running[k] = false
	r.attempts[id]++
	if r.attempts[id] <= r.c.Fail[id] {
		return fmt.Errorf("attempt %d of event %d fails", r.attempts[id], id)
	}
	r.order[k] = append(r.order[k], id)
	return nil
}

// Check returns what went against the contract: two handlers of one key at once, or a key's
// events handled out of delivery order or more than once.
func (r *Run) Check() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	problems := slices.Clone(r.problems)
	for k, ids := range r.order {
		if !slices.IsSorted(ids) || len(slices.Compact(slices.Clone(ids))) != len(ids) {
			problems = append(problems, fmt.Sprintf("key %s handled %v", k, ids))
		}
	}
	if len(problems) > 0 {
		return errors.New(fmt.Sprint(problems))
	}
	return nil
}
