package procrun

import (
	"context"
	"encoding/json"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

var doc = []byte(`{"id": 123, "name": "item-123", "payload": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", "a": {"b": 1, "c": [1,2,3]}}`)

func TestZZSpeed(t *testing.T) {
	for _, feed := range []bool{false, true} {
		w := 64
		n := 5000
		src := make(chan int, 100)
		go func() {
			for i := range n {
				if feed {
					var m map[string]any
					for range 4 {
						_ = json.Unmarshal(doc, &m)
					}
				}
				src <- i
			}
			close(src)
		}()
		var ht atomic.Int64
		start := time.Now()
		err := Run(context.Background(), Options{Workers: w, MaxInFlight: 1000, MaxAttempts: 1, Grace: time.Second, PollInterval: time.Second,
			Delay: func(int) time.Duration { return time.Millisecond }}, src, Hooks[int]{
			Key: func(i int) string { return strconv.Itoa(i % 1000) },
			Run: func(ctx context.Context, j *Job[int]) error {
				s := time.Now()
				time.Sleep(2 * time.Millisecond)
				ht.Add(int64(time.Since(s)))
				return nil
			},
			Advance: func(int) {},
		})
		el := time.Since(start)
		t.Logf("feed %v W%d: %.0f/s handler %v err %v", feed, w, float64(n)/el.Seconds(), time.Duration(ht.Load()/int64(n)), err)
	}
}
