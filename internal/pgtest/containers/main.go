// Command containers runs a command against PostgreSQL in a throwaway container, for developers
// without the PostgreSQL server binaries but with a Docker engine. It starts the container with
// github.com/testcontainers/testcontainers-go, runs the command with PGCHANGESTREAM_TEST_DSN set
// to the container's address (the first source internal/pgtest uses), removes the container,
// and exits with the command's status. From the repository root:
//
//	make test-container
//	cd internal/pgtest/containers && go run . -dir ../../.. -- go test ./...
//
// Without a command it prints the variable and keeps the container until interrupted:
//
//	cd internal/pgtest/containers && go run .
//
// It is a module of its own so that the library's module graph, and with it every consumer's,
// stays free of container tooling.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"
)

// envDSN is the variable internal/pgtest reads first.
const envDSN = "PGCHANGESTREAM_TEST_DSN"

func main() {
	os.Exit(run())
}

func run() int {
	image := flag.String("image", "postgres:17-alpine", "PostgreSQL image")
	fsync := flag.Bool("fsync", false, "keep fsync, synchronous_commit and full_page_writes on (for benchmarks)")
	dir := flag.String("dir", "", "working directory of the command (default: the current one)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [flags] [-- command [args...]]\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctr, dsn, err := start(ctx, *image, *fsync)
	if err != nil {
		fmt.Fprintln(os.Stderr, "containers:", err)
		return 1
	}
	defer func() {
		if err := testcontainers.TerminateContainer(ctr); err != nil {
			fmt.Fprintln(os.Stderr, "containers: remove the container:", err)
		}
	}()

	if flag.NArg() == 0 {
		fmt.Printf("%s=%s\n", envDSN, dsn)
		fmt.Fprintln(os.Stderr, "containers: running until interrupted")
		<-ctx.Done()
		return 0
	}
	cmd := exec.Command(flag.Arg(0), flag.Args()[1:]...)
	cmd.Dir = *dir
	cmd.Env = append(os.Environ(), envDSN+"="+dsn)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode()
	case err != nil:
		fmt.Fprintln(os.Stderr, "containers:", err)
		return 1
	}
	return 0
}

// start runs the PostgreSQL container and returns it with its connection string.
func start(ctx context.Context, image string, fsync bool) (*postgres.PostgresContainer, string, error) {
	durable := "off"
	if fsync {
		durable = "on"
	}
	ctr, err := postgres.Run(ctx, image,
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
		return nil, "", fmt.Errorf("start %s: %w", image, err)
	}
	dsn, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = testcontainers.TerminateContainer(ctr)
		return nil, "", fmt.Errorf("container address: %w", err)
	}
	return ctr, dsn, nil
}
