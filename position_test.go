package pgchangestream

import (
	"time"

	"github.com/pgchangestream/pgchangestream/internal/position"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// pos returns a position sec seconds after t0.
func pos(sec int, id int64) Position {
	return position.Make(t0.Add(time.Duration(sec)*time.Second), id)
}
