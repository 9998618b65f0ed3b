package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTailRefusesATableItCannotStream(t *testing.T) {
	t.Parallel()
	db, dsn := newItemsDB(t)
	execSQL(t, db, `CREATE TABLE keyless (name text PRIMARY KEY)`)
	for _, c := range []struct{ table, want string }{
		{"nosuch", `pgchangestream: tail: table "nosuch" does not exist (--table is the table's name, without schema)` + "\n"},
		{"keyless", `pgchangestream: tail: table "keyless" has no "id" column: changes are recorded by its id, ` +
			"so it cannot be captured\n"},
	} {
		code, stdout, stderr := runCmd(t, "tail", "--dsn", dsn, "--table", c.table, "--client", "typo", "--mode", "polling")
		assert.Equal(t, exitFailure, code, c.table)
		assert.Empty(t, stdout, c.table)
		assert.Equal(t, c.want, stderr, c.table)
	}
	assert.Zero(t, savedTokens(t, db), "no token for a table tail cannot stream")
}

// tailWaitMessage runs tail on table until it has written its first stderr line, stops it and
// returns its stderr.
func tailWaitMessage(t *testing.T, dsn, table string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"tail", "--dsn", dsn, "--table", table}, &out, &errb) }()
	require.Eventually(t, func() bool { return strings.Contains(errb.String(), "\n") }, 20*time.Second, 10*time.Millisecond)
	time.Sleep(200 * time.Millisecond) // a second message would come at the watcher's start
	cancel()
	require.Equal(t, exitOK, <-done, errb.String())
	return errb.String()
}

func TestTailWaitsWithOneMessageForATableWithoutRows(t *testing.T) {
	t.Parallel()
	db, dsn := newItemsDB(t)
	execSQL(t, db, `CREATE TABLE plain (id int PRIMARY KEY)`)
	assert.Equal(t, `pgchangestream: tail: warning: table "plain" is not captured: no change of it is recorded `+
		`(capture it with 'pgchangestream schema capture plain'); waiting for changes`+"\n", tailWaitMessage(t, dsn, "plain"))
	assert.Equal(t, `pgchangestream: tail: warning: table "items" has no recorded change yet; waiting for changes`+"\n",
		tailWaitMessage(t, dsn, "items"))
}
