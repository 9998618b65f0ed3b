package pgchangestream

import (
	"context"
	"testing"
	"time"

	"github.com/pgchangestream/pgchangestream/admin"
	"github.com/stretchr/testify/require"
)

// sharedMember starts a polling member of client s from the beginning (polling: no LISTEN
// connection, so no lock keeps the token commands away), closed at the end of the test.
func (e *liveEnv) sharedMember(name string) *Watcher {
	e.t.Helper()
	cfg := e.fromBeginning(ModePolling)
	cfg.ClientName, cfg.Shared, cfg.SharedLease, cfg.MemberName = "s", true, 2*time.Second, name
	return e.start(cfg)
}

// rangeTokens returns the saved token and owner (0 for none) of each of client's ranges.
func (e *liveEnv) rangeTokens(client string) (tokens []string, owners []int64) {
	e.t.Helper()
	rows, err := e.db.Query(`SELECT resume_token::text, COALESCE(owner, 0) FROM datastore_changelog_ranges
	WHERE client_name = $1 ORDER BY range_no`, client)
	require.NoError(e.t, err)
	defer rows.Close()
	for rows.Next() {
		var (
			t string
			o int64
		)
		require.NoError(e.t, rows.Scan(&t, &o))
		tokens, owners = append(tokens, t), append(owners, o)
	}
	require.NoError(e.t, rows.Err())
	return tokens, owners
}

// TestLiveResetTokenFencesSharedMembers proves that admin.ResetToken of a shared client resets every
// range and frees it in one statement, so that a member that was running saves nothing over the
// reset (it stops with ErrFenced), and the client's next member reads from the reset position.
func TestLiveResetTokenFencesSharedMembers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLive(t)
	items := e.insert(5)
	w := e.sharedMember("m1")
	got := receiveWithin(t, w, 5, liveWait)
	require.ElementsMatch(t, items, got)
	require.NoError(t, w.MarkProcessed(ctx, tok(got[4])))
	more := e.insert(1)
	require.Equal(t, more, receiveWithin(t, w, 1, liveWait)) // held unacknowledged: no hand-over meanwhile

	require.NoError(t, resetTo(ctx, e.db, "s", Position{}, ""))
	reset := Position{}.Token(liveTable)
	tokens, owners := e.rangeTokens("s")
	require.Len(t, tokens, SharedRanges)
	for r := range tokens {
		require.JSONEq(t, reset, tokens[r], "range %d is reset", r)
		require.Zero(t, owners[r], "range %d is freed", r)
	}

	err := w.MarkProcessed(ctx, tok(more[0]))
	require.Eventually(t, func() bool { return w.Err() != nil }, liveWait, 10*time.Millisecond, "the member stops")
	require.ErrorIs(t, w.Err(), ErrFenced)
	if err != nil {
		require.ErrorIs(t, err, ErrExclusiveLost, "the save is refused")
	}
	tokens, _ = e.rangeTokens("s")
	for r := range tokens {
		require.JSONEq(t, reset, tokens[r], "range %d keeps the reset: the member saved nothing over it", r)
	}
	if err := w.Close(ctx); err != nil {
		require.ErrorIs(t, err, ErrExclusiveLost, "its final save is refused too")
	}

	next := e.sharedMember("m2")
	var again []int64
	for len(again) < 6 { // acknowledged as they come, so that its hand-overs go on
		ids := receiveWithin(t, next, 1, liveWait)
		require.NoError(t, next.MarkProcessed(ctx, tok(ids[0])))
		again = append(again, ids...)
	}
	require.ElementsMatch(t, append(items, more...), again, "the next member reads from the beginning")
}

// TestLiveDeleteTokenDeletesSharedRanges proves that admin.DeleteToken of a shared client deletes its
// ranges with its token row, and that its next member starts as a new client.
func TestLiveDeleteTokenDeletesSharedRanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newLive(t)
	items := e.insert(3)
	e.saveRanges("s", e.position(items[0]).Token(liveTable), nil)
	found, err := admin.DeleteToken(ctx, e.db, "s", admin.Options{})
	require.NoError(t, err)
	require.True(t, found, "a client with ranges only has a token to delete")
	tokens, _ := e.rangeTokens("s")
	require.Empty(t, tokens)
	w := e.sharedMember("m1")
	require.ElementsMatch(t, items, receiveWithin(t, w, 3, liveWait), "a new client, from the beginning")
}
