package build

import "testing"

func TestX(t *testing.T) { undefinedThing() }
