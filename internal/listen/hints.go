package listen

import "sync"

// maxHints bounds the ids waiting for the reader.
const maxHints = 1 << 16

// Hints holds the ids named by notifications until the reader takes them: the listener adds,
// the reader takes and returns. Its zero value is empty and ready; it is safe for concurrent
// use.
type Hints struct {
	mu   sync.Mutex
	ids  []int64 // guarded by mu
	lost bool    // guarded by mu: ids were dropped since the last Take
}

// add notes id, unless maxHints ids already wait; it reports true for the first id dropped
// since the last Take.
func (h *Hints) add(id int64) (firstLost bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ids) < maxHints {
		h.ids = append(h.ids, id)
	} else if !h.lost {
		h.lost, firstLost = true, true
	}
	return firstLost
}

// Take returns the ids named by notifications since the last call.
func (h *Hints) Take() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := h.ids
	h.ids = nil
	h.lost = false
	return ids
}

// Return puts back ids the reader could not look at yet, ahead of newer ones.
func (h *Hints) Return(ids []int64) {
	if len(ids) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ids = append(ids, h.ids...)
	if len(h.ids) > maxHints {
		h.ids = h.ids[:maxHints]
	}
}

// RecentIDs remembers the ids of the last rows read (delivered or filtered), so that a NOTIFY
// for a row already read is not mistaken for a late row. It is not safe for concurrent use:
// the reader goroutine owns it.
type RecentIDs struct {
	ring  []int64
	next  int
	full  bool
	count map[int64]int32
}

// NewRecentIDs returns a RecentIDs that remembers the last capacity ids.
func NewRecentIDs(capacity int) *RecentIDs {
	return &RecentIDs{ring: make([]int64, capacity), count: make(map[int64]int32, capacity)}
}

// Add remembers id, forgetting the oldest id once capacity ids are remembered.
func (r *RecentIDs) Add(id int64) {
	if r.full {
		old := r.ring[r.next]
		if r.count[old]--; r.count[old] <= 0 {
			delete(r.count, old)
		}
	}
	r.ring[r.next] = id
	r.count[id]++
	r.next++
	if r.next == len(r.ring) {
		r.next = 0
		r.full = true
	}
}

// Contains reports whether id is among the remembered ids.
func (r *RecentIDs) Contains(id int64) bool {
	_, ok := r.count[id]
	return ok
}
