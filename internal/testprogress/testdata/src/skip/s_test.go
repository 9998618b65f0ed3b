package skip

import "testing"

func TestRuns(t *testing.T) {}

func TestSkipped(t *testing.T) { t.Skip("needs PostgreSQL: set PGCHANGESTREAM_TEST_DSN") }
