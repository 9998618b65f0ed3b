package parallel

import (
	"testing"
	"time"
)

func TestP1(t *testing.T)     { t.Parallel(); time.Sleep(50 * time.Millisecond); t.Log("p1") }
func TestP2(t *testing.T)     { t.Parallel(); t.Log("p2"); t.Fatal("p2 failed") }
func TestSerial(t *testing.T) { t.Log("serial") }
