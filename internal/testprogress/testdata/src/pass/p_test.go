package pass

import "testing"

func TestOne(t *testing.T) { t.Log("quiet when passing") }

func TestTwo(t *testing.T) {
	t.Run("sub", func(t *testing.T) {})
}
