package pgchangestream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
)

// TestLiveRestoredDatabaseRefused proves the restored-database edge of skip-free reads: after a
// logical restore the server's transaction counter is below the stored transaction ids. When a
// stored row's transaction id, or the saved token's snapshot, is ahead of the counter, Start
// delivers nothing: Events closes and Err returns an error wrapping ErrRestoredDatabase that says
// which id is ahead and where the fix is described.
func TestLiveRestoredDatabaseRefused(t *testing.T) {
	runModes(t, liveModes, newLive, func(t *testing.T, e *liveEnv, mode Mode) {
		ids := e.insert(3)
		for _, tc := range []struct{ client, setup string }{
			{"stored-txid", fmt.Sprintf(`UPDATE datastore_changelog SET txid = '9999999999' WHERE id = %d`, ids[1])},
			{"token-snapshot", fmt.Sprintf(`INSERT INTO resume_tokens (client_name, resume_token) VALUES ('token-snapshot',
				jsonb_build_object('timestamp', (SELECT changed_at FROM datastore_changelog WHERE id = %d),
					'eventID', %d, 'snapshot', '9999999990:9999999999:'))`, ids[0], ids[0])},
		} {
			_, err := e.db.Exec(tc.setup)
			require.NoError(t, err, tc.client)
			cfg := e.fromBeginning(mode)
			cfg.ClientName = tc.client
			w := e.start(cfg)
			requireClosed(t, w)
			err = w.Err()
			require.ErrorIs(t, err, ErrRestoredDatabase, tc.client)
			require.Greater(t, len(err.Error()), len(ErrRestoredDatabase.Error()), "%s: the error says which id is ahead: %v", tc.client, err)
			require.ErrorContains(t, err, `"Restoring a database"`, "%s: the error names the fix", tc.client)
			require.Zero(t, w.Stats().Delivered, tc.client)
			_, err = e.db.Exec(`UPDATE datastore_changelog SET txid = NULL WHERE txid = '9999999999'`)
			require.NoError(t, err)
		}
	})
}

// TestLiveTokenSavedDuringStartIsNotARestore: a second instance of a client starts while the
// first one saves. Its load takes the database's snapshot, then reads the token; a save that
// commits in between holds a snapshot taken after the load's. The second instance must take that
// for what it is and resume after the token, not refuse to start as on a restored database.
// Every start here has such a save in between: a statement hook on the second instance's pool
// runs, right before its token read, a write that the first instance delivers and acknowledges
// (with MarkProcessed, or with MarkProcessedTx in a transaction committed there). The second
// instance is another watcher of the client, or a Shared member taking the client over (its
// ranges start at the client's token).
func TestLiveTokenSavedDuringStartIsNotARestore(t *testing.T) {
	runModes(t, liveModes, newLive, func(t *testing.T, e *liveEnv, mode Mode) {
		ctx := context.Background()
		cfg := e.config(mode)
		first := e.start(cfg)
		waitStartSaved(t, first)
		byTx := func(token []byte) error {
			tx, err := e.db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if err := first.MarkProcessedTx(ctx, tx, token); err != nil {
				return errors.Join(err, tx.Rollback())
			}
			return tx.Commit()
		}
		for _, tc := range []struct {
			name   string
			ack    func(token []byte) error
			shared bool
		}{
			{"MarkProcessed", func(token []byte) error { return first.MarkProcessed(ctx, token) }, false},
			{"MarkProcessedTx", byTx, false},
			{"Shared member", func(token []byte) error { return first.MarkProcessed(ctx, token) }, true},
		} {
			for range 3 {
				hook := &statementHook{sql: statements(cfg.WithDefaults()).LoadToken, done: make(chan error, 1)}
				hook.before = func() error { // on the second instance's reader: no t.FailNow here
					if _, err := e.db.ExecContext(ctx, `INSERT INTO items (n) VALUES (1)`); err != nil {
						return err
					}
					select {
					case ev := <-first.Events():
						return tc.ack(ev.ResumeToken)
					case <-time.After(liveWait):
						return errors.New("the first instance delivered nothing")
					}
				}
				hook.armed.Store(true)
				second := cfg
				second.DB, second.Shared = e.hookedDB(hook), tc.shared
				w := e.start(second)
				if tc.shared { // a member's Ready waits until its first rows were taken
					go func() {
						for range w.Events() {
						}
					}()
				}
				<-w.Ready()
				require.NoError(t, <-hook.done, tc.name)
				require.NoError(t, w.Err(), "%s: a token saved during the start is no restored database", tc.name)
				saved := mustDecodeToken(t, e.rawToken("c"))
				require.True(t, saved.InDelta(), "the token holds a snapshot")
				if !tc.shared {
					require.Zero(t, saved.Compare(w.Stats().Checkpoint), "%s: resumes after the token saved during its start", tc.name)
				}
				require.NoError(t, w.Close(ctx))
			}
		}
	})
}

// statementHook is a pgx tracer that runs before, once armed, right before the first statement
// whose text is sql, and sends its result on done.
type statementHook struct {
	sql    string
	armed  atomic.Bool
	before func() error
	done   chan error // capacity 1
}

func (h *statementHook) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL == h.sql && h.armed.CompareAndSwap(true, false) {
		h.done <- h.before()
	}
	return ctx
}

func (h *statementHook) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// hookedDB opens a pool on the test's database whose statements go through tracer.
func (e *liveEnv) hookedDB(tracer pgx.QueryTracer) *sql.DB {
	e.t.Helper()
	connCfg, err := pgx.ParseConfig(e.dsn)
	require.NoError(e.t, err)
	connCfg.Tracer = tracer
	db := stdlib.OpenDB(*connCfg)
	e.t.Cleanup(func() { _ = db.Close() })
	return db
}
