package proxy

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
