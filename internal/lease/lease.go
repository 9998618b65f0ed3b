// Package lease divides the ranges of a shared client between its live members. The split is a
// pure function of the members' ids, so every member computes the same one from the same list,
// with no leader: the members sorted by id take contiguous, nearly equal blocks of ranges, in
// order. Contiguous blocks keep each member's units one interval (one index condition for its
// reads), and a block's bounds move by at most one member's share when one joins or leaves.
package lease

import "slices"

// Target returns, ascending, the ranges (0 to ranges-1) that member me is to own when the live
// members are members (any order, no duplicates). It is empty when me is not among them.
func Target(members []int64, me int64, ranges int) []int {
	sorted := slices.Clone(members)
	slices.Sort(sorted)
	i, found := slices.BinarySearch(sorted, me)
	if !found {
		return nil
	}
	n := len(sorted)
	lo, hi := i*ranges/n, (i+1)*ranges/n
	out := make([]int, 0, hi-lo)
	for r := lo; r < hi; r++ {
		out = append(out, r)
	}
	return out
}

// Interval is the units from Lo to Hi, both included.
type Interval struct{ Lo, Hi int }

// Cover returns the interval of units that holds every unit of ranges (ascending, not empty,
// each of unitsPerRange units): from the first range's first unit to the last range's last.
func Cover(ranges []int, unitsPerRange int) Interval {
	return Interval{Lo: ranges[0] * unitsPerRange, Hi: (ranges[len(ranges)-1]+1)*unitsPerRange - 1}
}
