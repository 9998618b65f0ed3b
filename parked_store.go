package pgchangestream

import (
	"context"
	"errors"
)

// errNoDeadLetters is the error of every call of the dead-letter store of a build without one.
var errNoDeadLetters = errors.New("pgchangestream: dead-letter table not available")

// parkedStore returns the dead-letter table of the watcher's client.
func (w *Watcher) parkedStore() parkedStore { return noParkedStore{} }

// noParkedStore fails every call.
type noParkedStore struct{}

func (noParkedStore) park(context.Context, ParkedEvent) (int64, error) { return 0, errNoDeadLetters }
func (noParkedStore) blockedKeys(context.Context) ([]string, error)    { return nil, errNoDeadLetters }
func (noParkedStore) released(context.Context, int) ([]ParkedEvent, error) {
	return nil, errNoDeadLetters
}
func (noParkedStore) keyEvents(context.Context, string) ([]ParkedEvent, error) {
	return nil, errNoDeadLetters
}
func (noParkedStore) repark(context.Context, int64, int, string) error { return errNoDeadLetters }
func (noParkedStore) finish(context.Context, int64) error              { return errNoDeadLetters }
