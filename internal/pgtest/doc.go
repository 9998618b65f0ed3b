// Package pgtest gives tests, benchmarks and the demo command a real, throwaway PostgreSQL.
//
// # Where the server comes from
//
// [Start], [Shared] and [NewServer] look for a server in this order:
//
//  1. The environment variable PGCHANGESTREAM_TEST_DSN: an existing server, used as is. Fault
//     controls ([Server.Restart], [Server.Kill]) are not available; [Server.Stop] leaves the
//     server running.
//  2. Local PostgreSQL server binaries (initdb and postgres) on PATH or under
//     /usr/lib/postgresql/*/bin (the highest version wins; /usr/pgsql-*/bin and
//     /usr/local/pgsql/bin are tried too). A fresh cluster is created in a temporary directory and
//     started on a free 127.0.0.1 port with trust authentication and the superuser "postgres".
//     When the process runs as root, initdb and postgres run as the OS user "postgres", which must
//     exist. The postmaster is a child of the Go process; on Linux it is asked to shut down
//     (SIGQUIT) if the Go process dies.
//  3. None: [Start] returns an error wrapping [ErrNoServer] whose text says how to provide a
//     server, and [Shared], [NewServer] and [NewDatabase] skip the test with that text, unless
//     PGCHANGESTREAM_REQUIRE_POSTGRES=1, where they fail it. CI sets that variable.
//
// # Containers
//
// With a Docker engine but no server binaries, run the tests through the command in
// internal/pgtest/containers (make test-container): it starts PostgreSQL in a container with
// github.com/testcontainers/testcontainers-go, runs the given command with
// PGCHANGESTREAM_TEST_DSN set to it (source 1), and removes the container. The command is a
// module of its own, so that neither this module nor any module that imports the library
// requires container tooling; make lint vets it. Fault tests need a local cluster and fail
// against a container.
//
// # Tests
//
// A test binary shares one server, started on first use by [Shared] (or [NewDatabase]) with
// fsync off. Each test takes a fresh database with [NewDatabase]; a schema installed once with
// [Server.CreateTemplate] is copied into a new database in a fraction of a second. Stop the
// shared server from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.RunMain(m)) }
//
// Tests that restart or kill the server should take their own with [NewServer], so that they do
// not break the connections of tests running in parallel.
//
// # Cleanup
//
// [Server.Stop] (and [RunMain], also on SIGINT and SIGTERM) shuts the cluster down and removes
// its directory. A process that ends without stopping it (a panic, a test timeout, SIGKILL)
// leaves the directory behind; on Linux the postmaster is shut down by the kernel's parent
// death signal, and the next start removes directories whose creating process is gone.
//
// The server needs PostgreSQL 13 or newer (databases are dropped WITH (FORCE)).
package pgtest
