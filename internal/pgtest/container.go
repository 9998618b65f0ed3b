//go:build testcontainers

package pgtest

import (
	"context"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"
)

// containerImage is the image of the container source.
const containerImage = "postgres:17-alpine"

// startContainer runs PostgreSQL in a container when a Docker engine answers. Testcontainers
// panics in some setups without an engine; a panic is reported as the source being
// unavailable.
func startContainer(ctx context.Context, opts Options, logf func(string, ...any)) (s *Server, err error) {
	defer func() {
		if r := recover(); r != nil {
			s, err = nil, unavailable(fmt.Sprintf("testcontainers: %v", r))
		}
	}()
	if err := dockerAnswers(ctx); err != nil {
		return nil, unavailable("no Docker engine answers: " + err.Error())
	}
	durable := "off"
	if opts.Fsync {
		durable = "on"
	}
	ctr, err := postgres.Run(ctx, containerImage,
		postgres.WithUsername("postgres"),
		postgres.WithPassword("postgres"),
		postgres.WithDatabase("postgres"),
		postgres.BasicWaitStrategies(),
		testcontainers.WithCmd("postgres",
			"-c", "max_connections=200",
			"-c", "shared_buffers=128MB",
			"-c", "fsync="+durable,
			"-c", "synchronous_commit="+durable,
			"-c", "full_page_writes="+durable),
	)
	if err != nil {
		if ctr != nil {
			_ = testcontainers.TerminateContainer(ctr)
		}
		return nil, fmt.Errorf("pgtest: start container: %w", err)
	}
	dsn, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(ctr)
		return nil, fmt.Errorf("pgtest: container address: %w", err)
	}
	s = newServer(dsn, logf)
	s.stopC = func() error {
		if err := testcontainers.TerminateContainer(ctr); err != nil {
			return fmt.Errorf("pgtest: stop container: %w", err)
		}
		return nil
	}
	logf("pgtest: started %s in container %s", containerImage, ctr.GetContainerID())
	return s, nil
}

// dockerAnswers checks that a Docker engine answers within a few seconds.
func dockerAnswers(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	provider, err := testcontainers.ProviderDocker.GetProvider()
	if err != nil {
		return err
	}
	defer func() { _ = provider.Close() }()
	return provider.Health(ctx)
}
