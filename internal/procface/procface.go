package procface

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

// ErrPanic is wrapped by the error of a recovered panic (re-exported by the root package).
var ErrPanic = errors.New("pgchangestream: panic")

// ErrNilHandler is the refusal of a Process without a handler.
var ErrNilHandler = fmt.Errorf("%w: Process: the handler is nil", changelog.ErrInvalidConfig)

// The defaults of the options (the root package's Default… constants).
const (
	DefaultMaxInFlight        = 1000
	DefaultMaxAttempts        = 5
	DefaultRetryMinBackoff    = 100 * time.Millisecond
	DefaultRetryMaxBackoff    = 30 * time.Second
	DefaultGracePeriod        = 10 * time.Second
	DefaultParkedPollInterval = 5 * time.Second
	defaultWorkers            = 1
)

// Options mirror the root package's ProcessOptions field for field (see its comments), so that
// each converts to the other; E is the event type and P the failure policy.
type Options[E any, P ~int] struct {
	Workers                          int
	Key                              func(E) string
	MaxInFlight                      int
	MaxDeferred                      int
	MaxKeyQueue                      int
	MaxAttempts                      int
	RetryMinBackoff, RetryMaxBackoff time.Duration
	OnFailure                        P
	GracePeriod                      time.Duration
	ParkedPollInterval               time.Duration
}

// WithDefaults fills the zero options with their defaults; key is the default Key.
func (o Options[E, P]) WithDefaults(key func(E) string) Options[E, P] {
	o.Workers = cmpOr(o.Workers, defaultWorkers)
	o.MaxInFlight = cmpOr(o.MaxInFlight, max(DefaultMaxInFlight, o.Workers))
	if o.Workers > 0 {
		o.MaxKeyQueue = cmpOr(o.MaxKeyQueue, max(1, o.MaxInFlight/(2*o.Workers)))
	}
	o.MaxAttempts = cmpOr(o.MaxAttempts, DefaultMaxAttempts)
	o.RetryMinBackoff = cmpOr(o.RetryMinBackoff, DefaultRetryMinBackoff)
	o.RetryMaxBackoff = cmpOr(o.RetryMaxBackoff, max(DefaultRetryMaxBackoff, o.RetryMinBackoff))
	o.GracePeriod = cmpOr(o.GracePeriod, DefaultGracePeriod)
	o.ParkedPollInterval = cmpOr(o.ParkedPollInterval, DefaultParkedPollInterval)
	if o.Key == nil {
		o.Key = key
	}
	return o
}

// cmpOr is cmp.Or for a value that is invalid when negative: a negative v is kept, for Validate.
func cmpOr[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// Validate reports the first problem of defaulted options, naming the field.
func (o Options[E, P]) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: ProcessOptions.%s", changelog.ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case o.Workers < 0:
		return bad("Workers is negative (%d)", o.Workers)
	case o.MaxInFlight < o.Workers:
		return bad("MaxInFlight (%d) is less than Workers (%d)", o.MaxInFlight, o.Workers)
	case o.MaxKeyQueue < 0 || o.MaxDeferred < 0:
		return bad("MaxKeyQueue and MaxDeferred must not be negative")
	case o.MaxAttempts < 0:
		return bad("MaxAttempts is negative (%d)", o.MaxAttempts)
	case o.RetryMinBackoff < 0 || o.RetryMaxBackoff < 0:
		return bad("RetryMinBackoff and RetryMaxBackoff must not be negative")
	case o.RetryMaxBackoff < o.RetryMinBackoff:
		return bad("RetryMaxBackoff (%s) is less than RetryMinBackoff (%s)", o.RetryMaxBackoff, o.RetryMinBackoff)
	case o.GracePeriod < 0:
		return bad("GracePeriod is negative (%s)", o.GracePeriod)
	case o.ParkedPollInterval < 0:
		return bad("ParkedPollInterval is negative (%s)", o.ParkedPollInterval)
	case o.OnFailure < P(procrun.Stop) || o.OnFailure > P(procrun.Block):
		return bad("OnFailure is not a FailurePolicy (%d)", o.OnFailure)
	}
	return nil
}

// Check returns o with the defaults filled in (key: the default Key), or why Process refuses
// the call: refuse, the caller's own objection, if any, else the options' first problem.
func Check[E any, P ~int](o Options[E, P], refuse error, key func(E) string) (Options[E, P], error) {
	if refuse != nil {
		return o, refuse
	}
	o = o.WithDefaults(key)
	return o, o.Validate()
}

// engine returns the engine's options of defaulted options.
func (o Options[E, P]) engine() procrun.Options {
	return procrun.Options{Workers: o.Workers, MaxInFlight: o.MaxInFlight, MaxKeyQueue: o.MaxKeyQueue,
		MaxDeferred: o.MaxDeferred, MaxAttempts: o.MaxAttempts,
		Policy: procrun.Policy(o.OnFailure), Grace: o.GracePeriod, PollInterval: o.ParkedPollInterval,
		Delay: backoff.Delays(o.RetryMinBackoff, o.RetryMaxBackoff)}
}

// PanicError logs a recovered panic r in where with its stack, and returns it as an error
// wrapping ErrPanic.
func PanicError(log *slog.Logger, where string, r any) error {
	log.Error("recovered from a panic", "in", where, "panic", r, "stack", string(debug.Stack()))
	return fmt.Errorf("%w in the %s: %v", ErrPanic, where, r)
}

// RunHandler runs handle, recovering a panic into an error wrapping ErrPanic, logged to log.
func RunHandler[E any](ctx context.Context, log *slog.Logger, handle func(context.Context, E) error, ev E) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = PanicError(log, "handler", r)
		}
	}()
	return handle(ctx, ev)
}

// Run runs the engine over src with o (defaults filled in) and h, whose Key it sets: o.Key with
// a panic recovered, the event then falling back to fallback. token is an event's resume token,
// which names it in the error of a failure under StopOnFailure.
func Run[E any, P ~int](ctx context.Context, log *slog.Logger, src <-chan E, o Options[E, P], h procrun.Hooks[E],
	fallback func(E) string, token func(E) []byte) error {
	h.Key = safeKey(log, o.Key, fallback)
	err := procrun.Run(ctx, o.engine(), src, h)
	var f *procrun.Failure[E]
	if errors.As(err, &f) {
		err = fmt.Errorf("pgchangestream: process: event of key %q, token %s: %w", f.Key, token(f.Ev), err)
	}
	return err
}

// safeKey is key with a panic recovered: the event then falls back to fallback.
func safeKey[E any](log *slog.Logger, key, fallback func(E) string) func(E) string {
	return func(ev E) (k string) {
		defer func() {
			if r := recover(); r != nil {
				_ = PanicError(log, "ProcessOptions.Key", r)
				k = fallback(ev)
			}
		}()
		return key(ev)
	}
}

// Stats mirror the root package's ProcessStats field for field, so that one converts to the other.
type Stats struct {
	InFlight        int
	Deferred        int
	BusyWorkers     int
	Handled         uint64
	AlreadyDone     uint64
	Retries         uint64
	Parked          uint64
	HandlerTime     time.Duration
	LongestKeyQueue int
	LongestKey      string
}

// StatsOf reads the engine's counters p.
func StatsOf(p *procrun.Stats) Stats {
	n, key := p.Longest()
	return Stats{InFlight: int(p.InFlight.Load()), Deferred: int(p.Deferred.Load()), BusyWorkers: int(p.Busy.Load()), Handled: p.Handled.Load(), AlreadyDone: p.Done.Load(),
		Retries: p.Retries.Load(), Parked: p.Parked.Load(), HandlerTime: time.Duration(p.HandlerTime.Load()),
		LongestKeyQueue: n, LongestKey: key}
}
