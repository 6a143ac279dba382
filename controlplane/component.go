package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// component is one part of the control plane run in its own goroutine with its own context, so that shutdown can
// stop the parts one by one in a chosen order (clients of the API server before the API server).
type component struct {
	name    string
	timeout time.Duration // how long stop waits for it to return
	ctx     context.Context
	cancel  context.CancelFunc
	done    sync.WaitGroup
	stopped sync.Once
}

func newComponent(name string, timeout time.Duration) *component {
	ctx, cancel := context.WithCancel(context.Background())
	return &component{name: name, timeout: timeout, ctx: ctx, cancel: cancel}
}

// start runs fn until the component is stopped. An error while it is meant to run stops the whole control plane
// through failed; whatever fn returns after stop is the component shutting down and is ignored.
func (c *component) start(fn func(ctx context.Context) error, failed context.CancelCauseFunc) {
	c.done.Go(func() {
		if err := fn(c.ctx); err != nil && c.ctx.Err() == nil {
			failed(fmt.Errorf("%s: %w", c.name, err))
		}
	})
}

// stop cancels the component and waits (up to its timeout) for it to return. Stopping a component that never
// started returns at once, and so does stopping it again (a deferred stopAll after the explicit one).
func (c *component) stop() {
	c.stopped.Do(func() {
		c.cancel()
		done := make(chan struct{})
		go func() { c.done.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(c.timeout):
			klog.InfoS("component did not stop in time; continuing shutdown", "component", c.name, "timeout", c.timeout)
		}
	})
}

// stopAll stops the components in the order given.
func stopAll(components ...*component) {
	for _, c := range components {
		c.stop()
	}
}
