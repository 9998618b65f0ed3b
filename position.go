package pgchangestream

import "github.com/pgchangestream/pgchangestream/internal/position"

// Position is a place in the change stream. Reading resumes strictly after a position.
//
// On a legacy changelog (no txid column) a position is (changed_at, id), ordered by changed_at,
// then id, with changed_at compared at PostgreSQL's microsecond precision. On an upgraded
// changelog the stream is read in snapshot deltas, each in changelog id order, and a position is
// (delta, id): of the delta's rows, those with an id up to ID are passed (at the start of a
// delta, none). Positions are ordered as the rows are delivered in both cases (see
// Position.Compare). ChangedAt and ID always name the row at (or, between deltas, last read
// before) the position, for logs and tools; Xid names the row's transaction, for logs.
type Position = position.Position
