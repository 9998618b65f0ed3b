package pgchangestream

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgchangestream/pgchangestream/schema"
	"github.com/stretchr/testify/require"
)

// prepareInsert runs insert in a transaction and prepares it (PREPARE TRANSACTION gid) on a
// connection of its own, returning the error of the PREPARE.
func (e *liveEnv) prepareInsert(insert, gid string) error {
	e.t.Helper()
	ctx := context.Background()
	conn, err := e.db.Conn(ctx)
	require.NoError(e.t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, `BEGIN`)
	require.NoError(e.t, err)
	_, err = conn.ExecContext(ctx, insert)
	require.NoError(e.t, err)
	_, err = conn.ExecContext(ctx, `PREPARE TRANSACTION '`+gid+`'`)
	if err != nil {
		_, _ = conn.ExecContext(ctx, `ROLLBACK`)
	}
	return err
}

// A table captured without NOTIFY can be written by a prepared transaction; its rows are read
// by polling and by hybrid's fallback poll. The notifying capture makes PREPARE fail.
func TestLivePreparedTransactionOnATableCapturedWithoutNotify(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLive(t)
	var maxPrepared int
	require.NoError(t, e.db.QueryRow(`SELECT current_setting('max_prepared_transactions')::int`).Scan(&maxPrepared))
	require.Positive(t, maxPrepared, "the test server must allow prepared transactions")

	err := e.prepareInsert(`INSERT INTO items (n) VALUES (1)`, "notifying")
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "PREPARE of a notifying capture: %v", err)
	require.Equal(t, "0A000", pgErr.Code)
	require.Equal(t, "cannot PREPARE a transaction that has executed LISTEN, UNLISTEN, or NOTIFY", pgErr.Message)

	_, err = e.db.Exec(`CREATE TABLE ledger (id uuid PRIMARY KEY DEFAULT gen_random_uuid())`)
	require.NoError(t, err)
	require.NoError(t, errOf(schema.Capture(ctx, e.db, "ledger", schema.Options{WithoutNotify: true})))
	require.NoError(t, errOf(schema.Capture(ctx, e.db, "ledger", schema.Options{WithoutNotify: true})), "idempotent")
	require.ErrorContains(t, errOf(schema.Capture(ctx, e.db, "ledger", schema.Options{})),
		`trigger ledger_changes on ledger exists and does not notify: drop it to capture changes with NOTIFY`)
	require.ErrorContains(t, errOf(schema.Capture(ctx, e.db, liveTable, schema.Options{WithoutNotify: true})),
		`trigger items_changes on items exists and notifies: drop it to capture changes without NOTIFY`)

	for _, mode := range []Mode{ModePolling, ModeHybrid} {
		t.Run(string(mode), func(t *testing.T) {
			cfg := e.config(mode)
			cfg.ClientName, cfg.TableName = "ledger-"+string(mode), "ledger"
			w := e.start(cfg)
			waitStartSaved(t, w)
			gid := "ledger-" + string(mode)
			require.NoError(t, e.prepareInsert(`INSERT INTO ledger DEFAULT VALUES`, gid))
			_, err := e.db.Exec(`COMMIT PREPARED '` + gid + `'`)
			require.NoError(t, err)
			var id int64
			require.NoError(t, e.db.QueryRow(`SELECT max(id) FROM datastore_changelog WHERE table_name = 'ledger'`).Scan(&id))
			require.Equal(t, []int64{id}, receiveWithin(t, w, 1, liveWait))
			require.NoError(t, w.Close(ctx))
		})
	}
}
