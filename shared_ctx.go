package pgchangestream

import (
	"context"
	"sync"
	"time"
)

// leaseContext is the context of a Shared member's handler: it is done when its parent is, when
// the member stops owning its ranges, and as soon as it is asked (Done, Err) after the member's
// lease may have run out. The last is checked on the monotonic clock at each call, so a member
// frozen mid-handler (a pause, a stopped process) past its lease finds the context done at the
// handler's next database call when it wakes, before any goroutine could cancel it: the call
// fails instead of writing after another member took over the range.
type leaseContext struct {
	context.Context // the parent
	sh              *sharedMember
	once            sync.Once
	done            chan struct{}
	stop            [2]func() bool // the AfterFuncs on the parent and on the member's loss
}

// handlerContext returns the context for a handler run under parent, and its release.
func (s *sharedMember) handlerContext(parent context.Context) (*leaseContext, func()) {
	c := &leaseContext{Context: parent, sh: s, done: make(chan struct{})}
	c.stop[0] = context.AfterFunc(parent, c.close)
	c.stop[1] = context.AfterFunc(s.lost, c.close)
	return c, func() {
		c.stop[0]()
		c.stop[1]()
	}
}

func (c *leaseContext) close() { c.once.Do(func() { close(c.done) }) }

// Done returns the channel closed when the handler must stop; it closes it first if the lease
// may have run out.
func (c *leaseContext) Done() <-chan struct{} {
	if !c.sh.leaseValid() {
		c.close()
	}
	return c.done
}

// Err returns the parent's error, or DeadlineExceeded once the lease may have run out or the
// member stopped owning its ranges; nil while the handler may go on.
func (c *leaseContext) Err() error {
	select {
	case <-c.Done():
		if err := c.Context.Err(); err != nil {
			return err
		}
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// Deadline is the parent's: the lease's end moves with each renewal.
func (c *leaseContext) Deadline() (time.Time, bool) { return c.Context.Deadline() }
