package lock

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestKeyNamesTheTokenTableAndClient(t *testing.T) {
	k := Key("resume_tokens", "c")
	require.Equal(t, k, Key("resume_tokens", "c"), "every watcher and command derives the same key")
	require.NotEqual(t, k, Key("resume_tokens", "d"))
	require.NotEqual(t, k, Key("other_tokens", "c"))
	require.NotEqual(t, Key("a", "bc"), Key("ab", "c"), "the parts are separated")
}
