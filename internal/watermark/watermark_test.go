package watermark

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// model is the obvious low-water mark: a set of finished sequence numbers and the highest
// added; the mark is the longest contiguous finished prefix.
type model struct {
	added    uint64
	finished map[uint64]bool
}

func (m *model) mark() uint64 {
	var s uint64
	for m.finished[s+1] {
		s++
	}
	return s
}

// step runs one random operation on both the mark and the model, then checks that they agree
// and that the mark never passes an unfinished sequence number.
func step(t *testing.T, rng *rand.Rand, wm *Mark[uint64], m *model, open *[]uint64) {
	t.Helper()
	if len(*open) == 0 || rng.IntN(3) == 0 {
		m.added++
		wm.Add(m.added, m.added*10)
		*open = append(*open, m.added)
	} else {
		i := rng.IntN(len(*open))
		s := (*open)[i]
		*open = append((*open)[:i], (*open)[i+1:]...)
		before := m.mark()
		m.finished[s] = true
		last, advanced := wm.Finish(s)
		want := m.mark()
		require.Equal(t, want != before, advanced, "finish %d: advanced", s)
		if advanced {
			require.Equal(t, want*10, last, "finish %d: the value of the new mark", s)
		}
	}
	require.Equal(t, m.mark(), wm.Done(), "mark")
	for _, s := range *open {
		require.Greater(t, s, wm.Done(), "the mark passed unfinished %d", s)
	}
	require.Equal(t, int(m.added-wm.Done()), wm.Len(), "entries held")
}

func TestMarkMatchesModel(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 1))
		wm := New[uint64]()
		m := &model{finished: map[uint64]bool{}}
		var open []uint64
		for range 300 {
			step(t, rng, wm, m, &open)
		}
		for len(open) > 0 { // finish everything: the mark reaches the last added
			step(t, rng, wm, m, &open)
		}
		require.Equal(t, m.added, wm.Done())
		require.Zero(t, wm.Len())
	}
}

func TestFinishOutOfRangeIsIgnored(t *testing.T) {
	wm := New[string]()
	wm.Add(1, "a")
	wm.Add(2, "b")
	_, advanced := wm.Finish(3)
	require.False(t, advanced, "a sequence number never added")
	last, advanced := wm.Finish(1)
	require.True(t, advanced)
	require.Equal(t, "a", last)
	_, advanced = wm.Finish(1)
	require.False(t, advanced, "finished twice")
	require.Equal(t, uint64(1), wm.Done())
}

func TestAddOutOfOrderPanics(t *testing.T) {
	wm := New[int]()
	wm.Add(1, 1)
	require.Panics(t, func() { wm.Add(3, 3) }, "sequence numbers must be consecutive")
}

func FuzzMark(f *testing.F) {
	f.Add(uint64(1), uint16(100))
	f.Fuzz(func(t *testing.T, seed uint64, n uint16) {
		rng := rand.New(rand.NewPCG(seed, 2))
		wm := New[uint64]()
		m := &model{finished: map[uint64]bool{}}
		var open []uint64
		for range int(n) % 2000 {
			step(t, rng, wm, m, &open)
		}
	})
}
