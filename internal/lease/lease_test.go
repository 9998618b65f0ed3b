package lease

import (
	"slices"
	"testing"
)

// Every range has exactly one target owner among the live members, blocks are contiguous, and
// shares differ by at most one range.
func TestTargetDividesEveryRangeOnce(t *testing.T) {
	for n := 1; n <= 70; n++ {
		members := make([]int64, n)
		for i := range members {
			members[i] = int64(1000 - 7*i) // unsorted, sparse ids
		}
		owner := make([]int, 64)
		for i := range owner {
			owner[i] = -1
		}
		minShare, maxShare := 64, 0
		for i, m := range members {
			got := Target(members, m, 64)
			minShare, maxShare = min(minShare, len(got)), max(maxShare, len(got))
			for j, r := range got {
				if owner[r] >= 0 {
					t.Fatalf("n=%d: range %d targeted to members %d and %d", n, r, owner[r], i)
				}
				owner[r] = i
				if j > 0 && got[j-1]+1 != r {
					t.Fatalf("n=%d: member %d's ranges %v are not contiguous", n, m, got)
				}
			}
		}
		if slices.Contains(owner, -1) {
			t.Fatalf("n=%d: a range has no target owner: %v", n, owner)
		}
		if maxShare-minShare > 1 {
			t.Fatalf("n=%d: shares from %d to %d ranges", n, minShare, maxShare)
		}
	}
}

func TestTargetOfANonMemberIsEmpty(t *testing.T) {
	if got := Target([]int64{1, 2}, 3, 64); len(got) != 0 {
		t.Fatalf("Target of a non-member = %v", got)
	}
}

// A join moves only part of the ranges: the first member keeps the start of its block.
func TestTargetAfterAJoinKeepsPartOfEachBlock(t *testing.T) {
	before := Target([]int64{5}, 5, 64)
	after := Target([]int64{5, 9}, 5, 64)
	if len(before) != 64 || !slices.Equal(after, before[:32]) {
		t.Fatalf("member 5 owns %v after the join, before %v", after, before)
	}
}

func TestCover(t *testing.T) {
	for _, c := range []struct {
		ranges []int
		iv     Interval
	}{
		{[]int{0}, Interval{0, 15}},
		{[]int{3, 4, 5}, Interval{48, 95}},
		{[]int{3, 5}, Interval{48, 95}},
		{[]int{63}, Interval{1008, 1023}},
	} {
		if iv := Cover(c.ranges, 16); iv != c.iv {
			t.Errorf("Cover(%v) = %v; want %v", c.ranges, iv, c.iv)
		}
	}
}
