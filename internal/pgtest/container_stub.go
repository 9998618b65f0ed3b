//go:build !testcontainers

package pgtest

import "context"

// startContainer reports that the container source is not compiled in.
func startContainer(context.Context, Options, func(string, ...any)) (*Server, error) {
	return nil, unavailable("containers need the build tag testcontainers")
}
