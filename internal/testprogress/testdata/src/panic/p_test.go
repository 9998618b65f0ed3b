package panic

import "testing"

func TestBefore(t *testing.T) {}

func TestBoom(t *testing.T) {
	t.Log("about to panic")
	var m map[string]int
	m["x"] = 1
}

func TestNeverRuns(t *testing.T) {}
