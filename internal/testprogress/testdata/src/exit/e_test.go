package exit

import (
	"os"
	"testing"
)

func TestFirst(t *testing.T) {}

func TestExits(t *testing.T) { t.Log("leaving"); os.Exit(3) }
