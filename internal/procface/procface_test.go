package procface

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/procrun"
)

type opts = Options[string, int]

func keyOf(ev string) string { return "k/" + ev }

func TestOptionsDefaults(t *testing.T) {
	o := opts{}.WithDefaults(keyOf)
	require.Equal(t, 1, o.Workers)
	require.Equal(t, DefaultMaxInFlight, o.MaxInFlight)
	require.Equal(t, DefaultMaxInFlight/2, o.MaxKeyQueue)
	require.Equal(t, DefaultMaxAttempts, o.MaxAttempts)
	require.Equal(t, DefaultRetryMinBackoff, o.RetryMinBackoff)
	require.Equal(t, DefaultRetryMaxBackoff, o.RetryMaxBackoff)
	require.Equal(t, DefaultGracePeriod, o.GracePeriod)
	require.Equal(t, DefaultParkedPollInterval, o.ParkedPollInterval)
	require.Equal(t, "k/a", o.Key("a"))

	o = opts{Workers: 2000, RetryMinBackoff: time.Minute}.WithDefaults(keyOf)
	require.Equal(t, 2000, o.MaxInFlight, "at least Workers")
	require.Equal(t, time.Minute, o.RetryMaxBackoff, "at least RetryMinBackoff")
	require.Equal(t, -1, opts{Workers: -1}.WithDefaults(keyOf).Workers, "a negative value is kept for Validate")
}

func TestCheck(t *testing.T) {
	refused := errors.New("refused")
	_, err := Check(opts{}, refused, keyOf)
	require.ErrorIs(t, err, refused)
	_, err = Check(opts{Workers: 3, MaxInFlight: 2}, nil, keyOf)
	require.ErrorIs(t, err, changelog.ErrInvalidConfig)
	require.ErrorContains(t, err, "ProcessOptions.MaxInFlight (2) is less than Workers (3)")
	_, err = Check(opts{OnFailure: 3}, nil, keyOf)
	require.ErrorContains(t, err, "OnFailure is not a FailurePolicy (3)")
	o, err := Check(opts{}, nil, keyOf)
	require.NoError(t, err)
	require.Equal(t, 1, o.Workers)
}

func TestRunHandlerRecoversAPanic(t *testing.T) {
	err := RunHandler(t.Context(), slog.New(slog.DiscardHandler), func(context.Context, string) error { panic("boom") }, "a")
	require.ErrorIs(t, err, ErrPanic)
	require.ErrorContains(t, err, "in the handler: boom")
}

func TestRunWrapsAFailureAndRecoversTheKey(t *testing.T) {
	src := make(chan string, 1)
	src <- "a"
	var keys []string
	o, err := Check(opts{MaxAttempts: 1, Key: func(string) string { panic("key") }}, nil, keyOf)
	require.NoError(t, err)
	h := procrun.Hooks[string]{
		Run: func(_ context.Context, j *procrun.Job[string]) error {
			keys = append(keys, j.Key)
			return errors.New("failed")
		},
		Advance: func(string) {},
		Stats:   &procrun.Stats{},
	}
	err = Run(t.Context(), slog.New(slog.DiscardHandler), src, o, h, keyOf, func(ev string) []byte { return []byte("tok-" + ev) })
	require.ErrorContains(t, err, `pgchangestream: process: event of key "k/a", token tok-a: `)
	require.Equal(t, []string{"k/a"}, keys, "the key's panic falls back")
}
