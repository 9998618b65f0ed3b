//go:build !unix

package pgtest

import (
	"context"
	"errors"
)

// cluster is not available on this system.
type cluster struct{ dir string }

// startLocal reports that local clusters need a Unix-like system.
func startLocal(context.Context, Options, func(string, ...any)) (*Server, error) {
	return nil, unavailable("local clusters need a Unix-like system")
}

var errNoCluster = errors.New("pgtest: local clusters need a Unix-like system")

func (*cluster) restart(context.Context) error { return errNoCluster }
func (*cluster) kill(context.Context) error    { return errNoCluster }
func (*cluster) stop() error                   { return errNoCluster }
