package pgchangestream

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestFunctionStateProblem: a function is the library's only with SECURITY DEFINER, the pinned
// search_path and a body that reads the trigger arguments; each missing one is named.
func TestFunctionStateProblem(t *testing.T) {
	assert.Empty(t, functionState{name: "f()", definer: true, pinned: true, readsArgs: true}.problem())
	for _, tc := range []struct {
		state functionState
		want  string
	}{
		{functionState{name: "f()", pinned: true, readsArgs: true}, "trigger function f() is not the one InstallSchema installs: " +
			`it is not SECURITY DEFINER (writers without changelog grants get "permission denied for table")`},
		{functionState{name: "f()", definer: true, readsArgs: true}, "it has no pinned search_path"},
		{functionState{name: "f()", definer: true, pinned: true}, "it has a body that ignores the trigger arguments (key, no_notify)"},
		{functionState{name: "s.f()"}, `get "permission denied for table"), has no pinned search_path, has a body that ignores`},
	} {
		assert.Contains(t, tc.state.problem(), tc.want)
	}
}
