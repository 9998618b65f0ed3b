package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unreachableDSN names a port where nothing listens: connecting fails at once.
const unreachableDSN = "postgres://postgres:secret@127.0.0.1:1/nowhere?sslmode=disable"

func TestHelpExitsZero(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		usage string
		flags []string
	}{
		{[]string{"--help"}, "Usage: pgchangestream <command>",
			[]string{"demo", "tail", "status", "token list", "token reset", "token delete", "prune", "schema install", "grants"}},
		{[]string{"help", "tail"}, "Usage: pgchangestream tail", []string{"--table"}},
		{[]string{"demo", "--help"}, "Usage: pgchangestream demo",
			[]string{"--dsn", "--writers", "--rate", "--duration", "--crashes", "--seed", "--progress", "--drain-timeout"}},
		{[]string{"tail", "-h"}, "Usage: pgchangestream tail",
			[]string{"--dsn", "--client", "--table", "--mode", "--from", "--from-beginning", "--no-ack", "--count", "-n",
				"--exit-at-end", "--format", "--changelog-table", "--token-table", "--channel"}},
		{[]string{"status", "--help"}, "Usage: pgchangestream status",
			[]string{"--dsn", "--format", "--table", "--client-table", "--changelog-table", "--token-table"}},
		{[]string{"token", "--help"}, "Usage: pgchangestream token list", nil},
		{[]string{"help", "token"}, "Usage: pgchangestream token list", nil},
		{[]string{"token", "list", "--help"}, "Usage: pgchangestream token list",
			[]string{"--dsn", "--format", "--changelog-table", "--token-table"}},
		{[]string{"token", "reset", "-h"}, "Usage: pgchangestream token reset",
			[]string{"--dsn", "--to", "--table", "--dry-run", "--yes"}},
		{[]string{"token", "delete", "--help"}, "Usage: pgchangestream token delete", []string{"--dsn", "--dry-run", "--yes"}},
		{[]string{"prune", "--help"}, "Usage: pgchangestream prune",
			[]string{"--dsn", "--older-than", "--dry-run", "--ignore-client", "--table", "--batch", "--format"}},
		{[]string{"schema", "--help"}, "Usage: pgchangestream schema install", nil},
		{[]string{"grants", "--help"}, "Usage: pgchangestream grants revoke-writers", nil},
		{[]string{"grants", "revoke-writers", "-h"}, "Usage: pgchangestream grants revoke-writers",
			[]string{"--dsn", "--changelog-table", "--function", "--ignore-replaceable"}},
		{[]string{"grants", "restrict-reads", "-h"}, "Usage: pgchangestream grants restrict-reads",
			[]string{"--dsn", "--print", "--changelog-table"}},
		{[]string{"grants", "restrict-tokens", "-h"}, "Usage: pgchangestream grants restrict-tokens",
			[]string{"--dsn", "--print", "--token-table"}},
		{[]string{"grants", "unrestrict", "-h"}, "Usage: pgchangestream grants unrestrict", []string{"--dsn"}},
		{[]string{"schema", "install", "-h"}, "Usage: pgchangestream schema install",
			[]string{"--dsn", "--print", "--changelog-table", "--token-table", "--channel", "--function"}},
		{[]string{"schema", "capture", "--help"}, "Usage: pgchangestream schema capture",
			[]string{"--dsn", "--print", "--changelog-table", "--function"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCmd(t, tc.args...)
			require.Equal(t, exitOK, code, stderr)
			assert.Empty(t, stderr)
			assert.True(t, strings.HasPrefix(stdout, tc.usage), stdout)
			for _, f := range tc.flags {
				assert.Contains(t, stdout, f)
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string // on the one line of stderr
	}{
		{"no command", nil, ""},
		{"unknown command", []string{"frobnicate"}, `pgchangestream: unknown command "frobnicate"`},
		{"unknown flag", []string{"status", "--bogus"}, "pgchangestream: status: flag provided but not defined: -bogus"},
		{"missing table", []string{"tail", "--dsn", unreachableDSN}, "pgchangestream: tail: --table is required"},
		{"missing dsn", []string{"tail", "--table", "items"}, "pgchangestream: tail: --dsn is required"},
		{"bad mode", []string{"tail", "--dsn", unreachableDSN, "--table", "items", "--mode", "fast"},
			`pgchangestream: tail: --mode "fast" is not one of polling, notify, hybrid`},
		{"bad format", []string{"tail", "--dsn", unreachableDSN, "--table", "items", "--format", "xml"},
			`pgchangestream: tail: --format "xml" is not one of json, pretty`},
		{"bad table name", []string{"tail", "--dsn", unreachableDSN, "--table", "items", "--changelog-table", "a b"},
			`pgchangestream: tail: --changelog-table "a b" is not a valid table name`},
		{"bad status format", []string{"status", "--dsn", unreachableDSN, "--format", "yaml"},
			`pgchangestream: status: --format "yaml" is not one of table, json`},
		{"schema without subcommand", []string{"schema"}, "pgchangestream: schema: missing subcommand"},
		{"capture without table", []string{"schema", "capture", "--print"}, "pgchangestream: schema capture: missing TABLE"},
		{"bad channel", []string{"schema", "install", "--print", "--channel", "a.b"}, "pgchangestream: schema install: --channel"},
		{"bad writers", []string{"demo", "--writers", "0"}, "pgchangestream: demo: --writers must be at least 1"},
		{"bad duration", []string{"demo", "--duration", "0s"}, "pgchangestream: demo: --duration must be positive"},
		{"extra argument", []string{"status", "--dsn", unreachableDSN, "extra"}, `pgchangestream: status: unexpected argument "extra"`},
		{"bad client table", []string{"status", "--dsn", unreachableDSN, "--client-table", "a"},
			`pgchangestream: status: --client-table "a": want CLIENT=TABLE`},
		{"bad from", []string{"tail", "--dsn", unreachableDSN, "--table", "items", "--from", "yesterday"},
			`pgchangestream: tail: --from "yesterday" is not beginning, newest or an RFC 3339 time`},
		{"negative count", []string{"tail", "--dsn", unreachableDSN, "--table", "items", "-n", "-1"},
			"pgchangestream: tail: --count must not be negative"},
		{"token without subcommand", []string{"token"}, "pgchangestream: token: missing subcommand"},
		{"unknown token subcommand", []string{"token", "show"}, `pgchangestream: token: unknown subcommand "show"`},
		{"reset without client", []string{"token", "reset", "--to", "newest", "--yes"}, "pgchangestream: token reset: missing CLIENT"},
		{"reset without to", []string{"token", "reset", "c", "--yes"}, "pgchangestream: token reset: --to is required"},
		{"reset bad to", []string{"token", "reset", "c", "--to", "soon", "--yes"}, `pgchangestream: token reset: --to "soon" is not`},
		{"reset without yes", []string{"token", "reset", "c", "--to", "newest", "--dsn", unreachableDSN},
			"pgchangestream: token reset: this changes the saved token: add --yes"},
		{"delete dry run and yes", []string{"token", "delete", "c", "--dry-run", "--yes"},
			"pgchangestream: token delete: --dry-run and --yes exclude each other"},
		{"bad token format", []string{"token", "list", "--format", "csv"}, `pgchangestream: token list: --format "csv" is not one of table, json`},
		{"bad batch", []string{"prune", "--batch", "0"}, "pgchangestream: prune: --batch must be positive"},
		{"bad older-than", []string{"prune", "--older-than", "-1h"}, "pgchangestream: prune: --older-than must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, tc.args...)
			assert.Equal(t, exitUsage, code)
			assert.Empty(t, stdout)
			if tc.want != "" {
				assert.True(t, strings.HasPrefix(stderr, tc.want), stderr)
				assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
			}
		})
	}
}

func TestUnreachableDSN(t *testing.T) {
	for _, args := range [][]string{
		{"tail", "--dsn", unreachableDSN, "--table", "items"},
		{"status", "--dsn", unreachableDSN},
		{"token", "list", "--dsn", unreachableDSN},
		{"prune", "--dsn", unreachableDSN},
		{"schema", "install", "--dsn", unreachableDSN},
	} {
		t.Run(args[0], func(t *testing.T) {
			code, stdout, stderr := runCmd(t, args...)
			assert.Equal(t, exitFailure, code)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, ": cannot connect to postgres@127.0.0.1:1/nowhere: ")
			assert.Contains(t, stderr, "connection refused")
			assert.NotContains(t, stderr, "secret", "the password is not printed")
			assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
		})
	}
}

func TestSchemaPrint(t *testing.T) {
	code, stdout, stderr := runCmd(t, "schema", "install", "--print")
	require.Equal(t, exitOK, code, stderr)
	for _, want := range []string{
		"BEGIN;\n",
		`CREATE TABLE "datastore_changelog"`,
		`CREATE TABLE IF NOT EXISTS "resume_tokens"`,
		`CREATE OR REPLACE FUNCTION "log_table_changes"()`,
		`pg_notify('nvsentinel_changes'`,
		"COMMIT;\n",
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "datastore_changelog_stream_idx" ON "datastore_changelog" (table_name, changed_at, id);`,
	} {
		assert.Contains(t, stdout, want)
	}

	code, stdout, stderr = runCmd(t, "schema", "install", "--print", "--changelog-table", "audit.changes",
		"--token-table", "audit.tokens", "--channel", "audit_changes", "--function", "audit.log_changes")
	require.Equal(t, exitOK, code, stderr)
	for _, want := range []string{`CREATE TABLE "audit"."changes"`, `"audit"."tokens"`, `pg_notify('audit_changes'`,
		`FUNCTION "audit"."log_changes"()`, `"changes_stream_idx" ON "audit"."changes"`} {
		assert.Contains(t, stdout, want)
	}

	code, stdout, stderr = runCmd(t, "schema", "capture", "orders", "--print", "--function", "f")
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stdout, `CREATE TRIGGER "orders_changes" AFTER INSERT OR UPDATE OR DELETE ON "orders"`)
	assert.Contains(t, stdout, `EXECUTE FUNCTION "f"('notify')`)
	assert.True(t, strings.HasSuffix(stdout, "$capture$;\n"), stdout)
}
