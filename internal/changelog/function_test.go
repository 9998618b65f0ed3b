package changelog

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestFunctionStateProblem: a function is the library's only with SECURITY DEFINER, the pinned
// search_path and a body that reads the trigger arguments; each missing one is named.
func TestFunctionStateProblem(t *testing.T) {
	assert.Empty(t, FunctionState{Name: "f()", Definer: true, Pinned: true, ReadsArgs: true}.Problem())
	for _, tc := range []struct {
		state FunctionState
		want  string
	}{
		{FunctionState{Name: "f()", Pinned: true, ReadsArgs: true}, "trigger function f() is not the one schema.Install installs: " +
			`it is not SECURITY DEFINER (writers without changelog grants get "permission denied for table")`},
		{FunctionState{Name: "f()", Definer: true, ReadsArgs: true}, "it has no pinned search_path"},
		{FunctionState{Name: "f()", Definer: true, Pinned: true}, "it has a body that ignores the trigger arguments (key, no_notify)"},
		{FunctionState{Name: "s.f()"}, `get "permission denied for table"), has no pinned search_path, has a body that ignores`},
	} {
		assert.Contains(t, tc.state.Problem(), tc.want)
	}
}
