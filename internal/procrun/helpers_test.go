package procrun

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tev is a test event: its key and its number in delivery order (1, 2, ...).
type tev struct {
	key string
	n   int
}

var errBoom = errors.New("boom")

// failOn returns a fail function that fails every attempt of event n with err.
func failOn(n int, err error) func(tev, int) error {
	return func(e tev, _ int) error {
		if e.n == n {
			return err
		}
		return nil
	}
}

func opts(workers, maxInFlight int) Options {
	return Options{Workers: workers, MaxInFlight: maxInFlight, MaxAttempts: 3, Grace: 10 * time.Second,
		PollInterval: 5 * time.Second, Delay: func(n int) time.Duration { return time.Duration(n) * time.Second }}
}

// rig runs the engine over a source the test feeds, and records what it did.
type rig struct {
	t     *testing.T
	src   chan tev
	stats Stats

	mu       sync.Mutex
	running  map[string]int   // handlers of a key running now
	ran      map[string][]int // per key, the events whose handler succeeded, in order
	attempts map[int]int      // per event, handler calls
	advanced []int            // every Advance, in order
	fail     func(ev tev, attempt int) error
	handle   func(ctx context.Context, ev tev) // extra work inside the handler
	owner    func() (uint64, bool)             // Hooks.Owner; set before start
}

func newRig(t *testing.T) *rig {
	return &rig{t: t, src: make(chan tev), running: map[string]int{}, ran: map[string][]int{}, attempts: map[int]int{}}
}

func (r *rig) hooks(store Store[tev]) Hooks[tev] {
	return Hooks[tev]{
		Key:   func(e tev) string { return e.key },
		Run:   r.run,
		Store: store,
		Stats: &r.stats,
		Owner: r.owner,
		Advance: func(last tev) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.advanced = append(r.advanced, last.n)
		},
	}
}

// run is the handler: it checks that no other handler of the key runs, then records the event.
func (r *rig) run(ctx context.Context, j *Job[tev]) error {
	r.mu.Lock()
	r.running[j.Key]++
	if r.running[j.Key] != 1 {
		r.t.Errorf("two handlers of key %q at once", j.Key)
	}
	r.attempts[j.Ev.n]++
	attempt := r.attempts[j.Ev.n]
	fail, handle := r.fail, r.handle
	r.mu.Unlock()
	if handle != nil {
		handle(ctx, j.Ev)
	}
	var err error
	if fail != nil {
		err = fail(j.Ev, attempt)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running[j.Key]--
	if err == nil {
		r.ran[j.Key] = append(r.ran[j.Key], j.Ev.n)
	}
	return err
}

// start runs the engine in the background; the returned function stops it (cancels) and
// returns its error.
func (r *rig) start(o Options, store Store[tev]) (errc <-chan error, cancel context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- Run(ctx, o, r.src, r.hooks(store)) }()
	return ch, cancel
}

// feed sends evs on the source, in order.
func (r *rig) feed(evs ...tev) {
	for _, e := range evs {
		r.src <- e
	}
}

func (r *rig) lastAdvanced() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.advanced) == 0 {
		return 0
	}
	return r.advanced[len(r.advanced)-1]
}

func (r *rig) advancedAll() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.advanced)
}

func (r *rig) attemptsOf(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts[n]
}

func (r *rig) ranOf(key string) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ran[key])
}

// events returns n events numbered from first, keyed by key(i).
func events(first, n int, key func(i int) string) []tev {
	evs := make([]tev, n)
	for i := range evs {
		evs[i] = tev{key: key(first + i), n: first + i}
	}
	return evs
}

func requireStopped(t *testing.T, errc <-chan error) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	default:
		require.FailNow(t, "the run did not return")
		return nil
	}
}

// requireFailure requires that the run stopped with a *Failure of event n caused by cause, and
// returns it.
func requireFailure(t *testing.T, errc <-chan error, cause error, n int) *Failure[tev] {
	t.Helper()
	err := requireStopped(t, errc)
	require.ErrorIs(t, err, cause)
	var f *Failure[tev]
	require.ErrorAs(t, err, &f)
	require.Equal(t, n, f.Ev.n)
	return f
}

// fakeStore is an in-memory dead-letter table.
type fakeStore struct {
	mu       sync.Mutex
	rows     []*fakeRow
	nextID   int64
	failPark int           // the next failPark Park calls fail
	parkErr  error         // if set, every Park call fails with it
	parkGate chan struct{} // if set, Park waits for it first
	calls    []string
}

type fakeRow struct {
	Parked[tev]
	retry    bool
	attempts int
	err      string
}

func (s *fakeStore) Park(_ context.Context, j *Job[tev], blocking bool) error {
	s.mu.Lock()
	gate := s.parkGate
	s.mu.Unlock()
	if gate != nil {
		<-gate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, "park")
	if s.parkErr != nil {
		return s.parkErr
	}
	if s.failPark > 0 {
		s.failPark--
		return errors.New("database down")
	}
	s.nextID++
	errText := ""
	if j.LastErr != nil {
		errText = j.LastErr.Error()
	}
	s.rows = append(s.rows, &fakeRow{Parked: Parked[tev]{ID: s.nextID, Key: j.Key, Ev: j.Ev, Blocking: blocking},
		attempts: j.Attempts, err: errText})
	return nil
}

// callList returns the Park calls made so far.
func (s *fakeStore) callList() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

func (s *fakeStore) BlockedKeys(context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []string
	for _, r := range s.rows {
		if r.Blocking && !slices.Contains(keys, r.Key) {
			keys = append(keys, r.Key)
		}
	}
	return keys, nil
}

func (s *fakeStore) Released(_ context.Context, limit int) ([]Parked[tev], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Parked[tev]
	for _, r := range s.rows {
		if r.retry && len(out) < limit {
			out = append(out, r.Parked)
		}
	}
	return out, nil
}

func (s *fakeStore) KeyEvents(_ context.Context, key string) ([]Parked[tev], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Parked[tev]
	for _, r := range s.rows {
		if r.Key == key {
			out = append(out, r.Parked)
		}
	}
	return out, nil
}

func (s *fakeStore) Repark(_ context.Context, j *Job[tev]) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rows {
		if r.ID == j.Parked {
			r.retry, r.attempts, r.err = false, j.Attempts, j.LastErr.Error()
		}
	}
	return nil
}

func (s *fakeStore) Finish(_ context.Context, id int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rows = slices.DeleteFunc(s.rows, func(r *fakeRow) bool { return r.ID == id })
	return nil
}

// release is an operator asking to run parked event n again.
func (s *fakeStore) release(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rows {
		if r.Ev.n == n {
			r.retry = true
		}
	}
}

// parked returns the numbers of the parked events, oldest first.
func (s *fakeStore) parked() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ns []int
	for _, r := range s.rows {
		ns = append(ns, r.Ev.n)
	}
	return ns
}
