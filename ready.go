package pgchangestream

import "sync"

// Ready returns a channel that is closed once the watcher has loaded its saved token and its
// first read has returned without error, with the rows it found sent on [Watcher.Events] (so a
// first read of more rows than [Config.BufferSize] waits for the consumer; a [Config.Shared]
// member's, of any row). It is also closed
// when the watcher stops before that: Close, the end of Start's context, a configuration error
// or a refused start ([Watcher.Err] says which). Tests wait on it instead of polling Stats.
func (w *Watcher) Ready() <-chan struct{} { return w.primed.channel() }

// signal is a channel closed once. Its zero value is ready to use.
type signal struct {
	make, close sync.Once
	ch          chan struct{}
}

func (s *signal) channel() chan struct{} {
	s.make.Do(func() { s.ch = make(chan struct{}) })
	return s.ch
}

// fire closes the channel; later calls do nothing.
func (s *signal) fire() { s.close.Do(func() { close(s.channel()) }) }
