package fail

import "testing"

func TestGood(t *testing.T) {}

func TestBad(t *testing.T) {
	t.Log("context before the failure")
	t.Run("inner", func(t *testing.T) { t.Error("inner broke") })
}
