package h1

import "context"

// AfterCancel arranges for f to run, in its own goroutine, after ctx is
// cancelled (at once if it is already), as context.AfterFunc does; stop
// keeps f from running and reports whether it did (false once f has
// started, or was stopped before). For a context that can never be
// cancelled, f never runs and stop reports true.
//
// For the context of a request this package serves itself (the request's
// own context, not one derived from it), nothing is allocated or
// registered with the context: the connection keeps f and runs it where it
// cancels the request (the client gone, the BaseContext ended, the
// request's end). context.AfterFunc would make the context's Done channel,
// a child context, its stop func and the cancelled context's map of
// children, for each request. The stop func is then the connection's: it
// must be called before the request's handler returns, or not at all (by
// then the request's end has run f, or stop has kept it from running).
// Any other context (a request net/http serves, a derived context) gets
// context.AfterFunc.
func AfterCancel(ctx context.Context, f func()) (stop func() bool) {
	if c, ok := ctx.Value(connKey{}).(*conn); ok {
		if stop := c.afterCancel(ctx, f); stop != nil {
			return stop
		}
	}
	if ctx.Done() == nil {
		return neverCancelled
	}
	return context.AfterFunc(ctx, f)
}

// connKey is the key under which a connection's requests' contexts hold
// the connection, when the connection alone cancels them (see newConn).
type connKey struct{}

func neverCancelled() bool { return true }

func alreadyRun() bool { return false }

// afterCancel is AfterCancel for a context of c's: nil unless ctx is the
// running request's and c keeps no other f for it.
func (c *conn) afterCancel(ctx context.Context, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ctx != c.reqCtx || c.onCancel != nil {
		return nil
	}
	// The request's context is cancelled under c.mu (cancelLocked), or
	// before its handler runs (a BaseContext already ended).
	if ctx.Err() != nil {
		go f()
		return alreadyRun
	}
	c.onCancel = f
	return c.stopOnCancel
}

// stopAfterCancel is the stop func AfterCancel returns for c's requests.
func (c *conn) stopAfterCancel() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	stopped := c.onCancel != nil
	c.onCancel = nil
	return stopped
}

// cancelLocked cancels the running request's context, or the last one's,
// with cause, and starts what AfterCancel registered on it. c.mu is held.
func (c *conn) cancelLocked(cause error) {
	c.cancel(cause)
	if f := c.onCancel; f != nil {
		c.onCancel = nil
		go f()
	}
	if f := c.onDetachedCancel; f != nil {
		c.onDetachedCancel = nil
		go f()
	}
}
