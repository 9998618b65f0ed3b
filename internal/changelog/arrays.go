package changelog

import (
	"fmt"

	"github.com/pgchangestream/pgchangestream/internal/position"
)

// Array formats integers as a PostgreSQL array literal.
func Array[T int64 | uint64](xs []T) string {
	b := make([]byte, 0, 2+21*len(xs))
	b = append(b, '{')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Append(b, x)
	}
	return string(append(b, '}'))
}

// RangeArrays returns the four array arguments of key ranges: lower txids, lower ids, upper
// txids, upper ids.
func RangeArrays(rs []position.KeyRange) (lo string, loID string, hi string, hiID string) {
	los, hts := make([]uint64, len(rs)), make([]uint64, len(rs))
	loIDs, hiIDs := make([]int64, len(rs)), make([]int64, len(rs))
	for i, r := range rs {
		los[i], loIDs[i], hts[i], hiIDs[i] = r.Lo, r.LoID, r.Hi, r.HiID
	}
	return Array(los), Array(loIDs), Array(hts), Array(hiIDs)
}
