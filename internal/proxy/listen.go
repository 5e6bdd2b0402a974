package proxy

import (
	"errors"
	"io"
	"net/http"
	"sync/atomic"
)

// Listen streams. MCP 2026-07-28 replaced the GET stream with
// subscriptions/listen: a POST whose SSE answer stays open for the
// subscription's life, carrying list-changed and resource-updated
// notifications. Any backend can serve one (the request names what it
// listens to), so the stream is placed by a pick like any session-less
// request, but it is counted as a stream (Endpoint.BeginListen), not as a
// request in flight: held for minutes, it would otherwise raise its
// backend's load for its whole life and steer the client's short calls
// elsewhere. It takes a --max-streams slot and the small stream buffers
// as GET streams do.
//
// A stream is only as useful as its backend: once that backend leaves the
// endpoint set, stops being ready or is ejected, the stream is ended at an
// event boundary, as a server ending it would, so that the client opens
// a new one, which lands on a live backend.

// copyListen is copyBody for a listen stream's SSE body (flushed at every
// event), ended when departed is closed. Then the backend body is closed,
// which unblocks the read, and the response ends cleanly (nil) if what
// reached the client ends with a whole event; a departure in the middle of
// an event aborts the response (an error), since a client must not take
// half an event for a whole one.
func copyListen(w http.ResponseWriter, body io.ReadCloser, buf []byte, departed <-chan struct{}) error {
	var left atomic.Bool
	if departed != nil {
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-departed:
				left.Store(true)
				body.Close() // unblocks the Read below
			case <-done:
			}
		}()
	}
	var tail eventTail
	whole := true // what the client has received ends with a whole event
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			nw, werr := w.Write(buf[:n])
			if werr != nil {
				return errors.Join(errClientWrite, werr)
			}
			if nw != n {
				return errors.Join(errClientWrite, io.ErrShortWrite)
			}
			whole = tail.endsEvent(buf[:n])
			if rerr == nil && whole {
				if err := flush(w); err != nil {
					return errors.Join(errClientWrite, err)
				}
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			if left.Load() && whole {
				return nil // the backend left: end the stream here
			}
			return rerr
		}
	}
}
