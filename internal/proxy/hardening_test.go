package proxy_test

// Regression tests for issue 10 on the forward/route/record path: in-flight
// accounting that cannot leak, 404s that are not about the session, session
// takeover on failover, colliding backend session ids, duplicate session
// headers, superseded backend sessions, the initialize body limit.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/testkit"
)

// sdkBackend is a go-sdk MCP server (stateful Streamable HTTP) built for
// these tests: a whoami tool, a tool that streams one progress event and
// then holds its response open, and optional session-id generator, bearer
// authentication and a switch that makes it forget the next session.
type sdkBackend struct {
	name        string
	server      *mcp.Server
	http        *httptest.Server
	initializes atomic.Int64 // initialize requests that reached the backend
	forgetNext  atomic.Bool  // answer the next request on a session 404 "session not found"
	release     chan struct{}
}

type sdkBackendOptions struct {
	sessionIDs func() string     // the server's GetSessionID; nil = go-sdk's random ids
	users      map[string]string // bearer token → user id; nil = no authentication
}

func startSDKBackend(t *testing.T, name string, o sdkBackendOptions) *sdkBackend {
	t.Helper()
	b := &sdkBackend{name: name, release: make(chan struct{})}
	b.server = mcp.NewServer(&mcp.Implementation{Name: name, Version: "1.0.0"}, &mcp.ServerOptions{GetSessionID: o.sessionIDs})
	mcp.AddTool(b.server, &mcp.Tool{Name: "whoami"},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, map[string]string, error) {
			return nil, map[string]string{"backend": name}, nil
		})
	mcp.AddTool(b.server, &mcp.Tool{Name: "stream"},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, map[string]string, error) {
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
				ProgressToken: req.Params.GetProgressToken(), Progress: 1, Message: "started",
			}); err != nil {
				return nil, nil, err
			}
			select { // hold the response open: the client hangs up first
			case <-ctx.Done():
			case <-b.release:
			}
			return nil, map[string]string{"backend": name}, nil
		})
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return b.server }, nil)
	if o.users != nil {
		verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
			user, ok := o.users[token]
			if !ok {
				return nil, auth.ErrInvalidToken
			}
			return &auth.TokenInfo{UserID: user, Expiration: time.Now().Add(time.Hour)}, nil
		}
		h = auth.RequireBearerToken(verify, nil)(h)
	}
	sdk := h
	b.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.Body != nil {
			body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
			if err != nil {
				http.Error(w, "short body", http.StatusBadRequest)
				return
			}
			if bytes.Contains(body, []byte(`"method":"initialize"`)) {
				b.initializes.Add(1)
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		if r.Header.Get("Mcp-Session-Id") != "" && b.forgetNext.CompareAndSwap(true, false) {
			http.Error(w, "session not found", http.StatusNotFound) // as go-sdk answers an unknown session
			return
		}
		sdk.ServeHTTP(w, r)
	}))
	t.Cleanup(b.http.Close)
	t.Cleanup(func() { close(b.release) }) // runs first: blocked tools return, then the server closes
	return b
}

func (b *sdkBackend) URL() string { return b.http.URL }

func (b *sdkBackend) liveSessions() int {
	n := 0
	for range b.server.Sessions() {
		n++
	}
	return n
}

// mcpPost sends one JSON-RPC POST and returns the status, the headers and
// the whole body. hdr is name, value pairs.
func mcpPost(ctx context.Context, client *http.Client, url, sid, body string, hdr ...string) (int, http.Header, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(data), err
}

// openSession initializes an MCP session at url with the given headers and
// returns its id.
func openSession(t *testing.T, client *http.Client, url string, hdr ...string) string {
	t.Helper()
	ctx := testContext(t)
	status, h, body, err := mcpPost(ctx, client, url, "", initializeBody, hdr...)
	if err != nil || status != http.StatusOK {
		t.Fatalf("initialize: status %d, err %v, body %q", status, err, body)
	}
	sid := h.Get("Mcp-Session-Id")
	if sid == "" {
		t.Fatal("initialize answered without a session id")
	}
	status, _, body, err = mcpPost(ctx, client, url, sid, initializedBody, hdr...)
	if err != nil || status != http.StatusAccepted {
		t.Fatalf("notifications/initialized: status %d, err %v, body %q", status, err, body)
	}
	return sid
}

// servedBy names the backend a whoami answer came from ("" if none).
func servedBy(body string, backends ...*sdkBackend) string {
	for _, b := range backends {
		if strings.Contains(body, `"backend":"`+b.name+`"`) {
			return b.name
		}
	}
	return ""
}

// jsonrpcErrorOf decodes a JSON-RPC error answer (plain JSON, or the data
// of the first SSE event).
func jsonrpcErrorOf(body string) (code int, id string, ok bool) {
	if i := strings.Index(body, "data: "); i >= 0 {
		body = body[i+len("data: "):]
		body, _, _ = strings.Cut(body, "\n")
	}
	var m struct {
		ID    json.RawMessage `json:"id"`
		Error *struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(body), &m) != nil || m.Error == nil {
		return 0, "", false
	}
	return m.Error.Code, string(m.ID), true
}

// Clients that hang up in the middle of a streamed tools/call, over
// HTTP/1.1 and over h2c, leave no request counted in flight: the relay
// aborts such a response with panic(http.ErrAbortHandler), and the count
// must end anyway (issue 10 item 13).
func TestInflightEndsWhenClientsHangUpMidStream(t *testing.T) {
	backends := []*sdkBackend{startSDKBackend(t, "b0", sdkBackendOptions{}), startSDKBackend(t, "b1", sdkBackendOptions{})}
	h := newTether(t, []string{backends[0].URL(), backends[1].URL()}, harnessOptions{})

	h2cFront := httptest.NewUnstartedServer(h.proxy)
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	h2cFront.Config.Protocols = &protos
	h2cFront.Start()
	t.Cleanup(h2cFront.Close)
	var h2cOnly http.Protocols
	h2cOnly.SetUnencryptedHTTP2(true)

	clients := []struct {
		name   string
		url    string
		client *http.Client
	}{
		{"http1", h.endpoint(), &http.Client{Transport: &http.Transport{}}},
		{"h2c", h2cFront.URL + "/mcp", &http.Client{Transport: &http.Transport{Protocols: &h2cOnly}}},
	}
	const streams = 4
	inflight := func() (n int64) {
		for _, ep := range h.bal.Endpoints() {
			n += ep.Inflight()
		}
		return n
	}
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			sid := openSession(t, c.client, c.url)
			ctx, hangUp := context.WithCancel(testContext(t))
			defer hangUp()
			started := make(chan error, streams)
			var wg sync.WaitGroup
			for i := range streams {
				wg.Add(1)
				go func() {
					defer wg.Done()
					started <- streamUntilFirstEvent(ctx, c.client, c.url, sid, i)
				}()
			}
			for range streams {
				if err := <-started; err != nil {
					t.Fatal(err)
				}
			}
			if n := inflight(); n != streams {
				t.Fatalf("%d requests counted in flight while %d streams are open", n, streams)
			}
			hangUp() // every client leaves in the middle of its stream
			wg.Wait()
			testkit.EventuallyNoError(t, 10*time.Second, func() error {
				if n := inflight(); n != 0 {
					return fmt.Errorf("%d in flight", n)
				}
				return nil
			}, "requests still counted in flight after their clients hung up")
		})
	}
}

// streamUntilFirstEvent calls the stream tool and returns once its first
// event has arrived, leaving the response open (ctx ends it).
func streamUntilFirstEvent(ctx context.Context, client *http.Client, url, sid string, n int) error {
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"stream","arguments":{},"_meta":{"progressToken":"p%d"}}}`, 10+n, n)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return fmt.Errorf("stream call: status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "notifications/progress") {
			// Keep reading in the background until the hang-up, as a
			// client would; the body closes when ctx ends.
			go func() { io.Copy(io.Discard, resp.Body); resp.Body.Close() }()
			return nil
		}
	}
	resp.Body.Close()
	return fmt.Errorf("stream ended before its first event: %v", sc.Err())
}

// A go-sdk v1.8.0 backend answers an unknown method with 404 and -32601
// when the request says MCP 2026-07-28. That 404 answers the request, not
// the session: it reaches the client unchanged, and the session is neither
// re-initialized nor moved (issue 10 item 5: 10 such calls used to cause 20
// re-initializations, 20 orphan backend sessions and 502s).
func TestNotFoundAnsweringTheRequestIsPassedOn(t *testing.T) {
	b := startSDKBackend(t, "b0", sdkBackendOptions{})
	h := newTether(t, []string{b.URL()}, harnessOptions{})
	ctx := testContext(t)
	client := &http.Client{}
	sid := openSession(t, client, h.endpoint())

	// How go-sdk v1.8.0 answers an unknown method at each protocol version,
	// directly and through tether: the same status and body.
	for _, version := range []string{"2025-06-18", "2025-11-25", "2026-07-28"} {
		const body = `{"jsonrpc":"2.0","id":5,"method":"no/such/method"}`
		dStatus, _, dBody, err := mcpPost(ctx, client, b.URL()+"/mcp", sid, body, "Mcp-Protocol-Version", version)
		if err != nil {
			t.Fatal(err)
		}
		tStatus, _, tBody, err := mcpPost(ctx, client, h.endpoint(), sid, body, "Mcp-Protocol-Version", version)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("unknown method at %s: backend %d %q", version, dStatus, strings.TrimSpace(dBody))
		if tStatus != dStatus || tBody != dBody {
			t.Errorf("%s: through tether %d %q, backend answers %d %q", version, tStatus, tBody, dStatus, dBody)
		}
	}
	for i := range 10 {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"no/such/method"}`, 100+i)
		status, _, got, err := mcpPost(ctx, client, h.endpoint(), sid, body, "Mcp-Protocol-Version", "2026-07-28")
		if err != nil {
			t.Fatal(err)
		}
		code, id, ok := jsonrpcErrorOf(got)
		if status != http.StatusNotFound || !ok || code != -32601 || id != fmt.Sprint(100+i) {
			t.Errorf("call %d: %d %q, want 404 with -32601 for id %d", i, status, got, 100+i)
		}
	}
	if n := b.initializes.Load(); n != 1 {
		t.Errorf("backend saw %d initialize requests, want 1 (no re-initialization)", n)
	}
	if n := b.liveSessions(); n != 1 {
		t.Errorf("backend holds %d sessions, want 1", n)
	}
	rec, err := h.store.Get(ctx, sid)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Reinits != 0 {
		t.Errorf("record says %d re-initializations, want 0", rec.Reinits)
	}
	// The session still works.
	if status, _, got, err := mcpPost(ctx, client, h.endpoint(), sid, whoamiBody); err != nil || status != http.StatusOK || servedBy(got, b) != "b0" {
		t.Errorf("whoami afterwards: %d %q %v", status, got, err)
	}
}

// When a backend forgets a session (404 "session not found") while its
// endpoint stays, the session is re-initialized and the superseded backend
// session is deleted, not left to live on beside the new one.
func TestSupersededBackendSessionIsDeleted(t *testing.T) {
	b := startSDKBackend(t, "b0", sdkBackendOptions{})
	h := newTether(t, []string{b.URL()}, harnessOptions{})
	ctx := testContext(t)
	client := &http.Client{}
	sid := openSession(t, client, h.endpoint())
	if n := b.liveSessions(); n != 1 {
		t.Fatalf("backend holds %d sessions after one initialize", n)
	}

	b.forgetNext.Store(true)
	status, _, got, err := mcpPost(ctx, client, h.endpoint(), sid, whoamiBody)
	if err != nil || status != http.StatusOK || servedBy(got, b) != "b0" {
		t.Fatalf("call after the backend forgot the session: %d %q %v", status, got, err)
	}
	rec, err := h.store.Get(ctx, sid)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Reinits != 1 || rec.BackendSID == sid {
		t.Fatalf("record: %d re-initializations, backend session %q; want 1 and a new one", rec.Reinits, rec.BackendSID)
	}
	testkit.EventuallyNoError(t, 10*time.Second, func() error {
		var ids []string
		for ss := range b.server.Sessions() {
			ids = append(ids, ss.ID())
		}
		if len(ids) != 1 || ids[0] != rec.BackendSID {
			return fmt.Errorf("backend sessions %v, want only %s", ids, rec.BackendSID)
		}
		return nil
	}, "the superseded backend session was not deleted")
}

// Backends that bind a session to its user (go-sdk with
// auth.RequireBearerToken) refuse another user's token; once the session's
// backend dies, another user must not re-initialize the session with their
// own token and lock its owner out (issue 10 item 4).
func TestReinitializationOnlyForTheSessionsCreator(t *testing.T) {
	users := map[string]string{"token-alice": "alice", "token-bob": "bob"}
	backends := []*sdkBackend{
		startSDKBackend(t, "b0", sdkBackendOptions{users: users}),
		startSDKBackend(t, "b1", sdkBackendOptions{users: users}),
	}
	h := newTether(t, []string{backends[0].URL(), backends[1].URL()}, harnessOptions{})
	ctx := testContext(t)
	client := &http.Client{}
	alice := []string{"Authorization", "Bearer token-alice"}
	bob := []string{"Authorization", "Bearer token-bob"}

	sid := openSession(t, client, h.endpoint(), alice...)
	status, _, got, err := mcpPost(ctx, client, h.endpoint(), sid, whoamiBody, alice...)
	home := servedBy(got, backends...)
	if err != nil || status != http.StatusOK || home == "" {
		t.Fatalf("alice's call: %d %q %v", status, got, err)
	}
	// While the backend lives, it refuses bob on alice's session itself.
	if status, _, got, _ := mcpPost(ctx, client, h.endpoint(), sid, whoamiBody, bob...); status != http.StatusForbidden {
		t.Fatalf("bob on alice's session before failover: %d %q, want 403 from the backend", status, got)
	}
	rec, err := h.store.Get(ctx, sid)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Principal == "" || strings.Contains(rec.Principal, "token-alice") {
		t.Errorf("record's principal %q: want a digest, never the credential", rec.Principal)
	}

	var other *sdkBackend
	for _, b := range backends {
		if b.name == home {
			b.http.Close() // the session's backend dies
		} else {
			other = b
		}
	}
	status, _, got, err = mcpPost(ctx, client, h.endpoint(), sid, whoamiBody, bob...)
	if err != nil {
		t.Fatal(err)
	}
	if code, id, ok := jsonrpcErrorOf(got); status != http.StatusNotFound || !ok || code != -32001 || id != "null" {
		t.Errorf("bob on alice's session after failover: %d %q, want 404 with -32001 and id null", status, got)
	}
	if n := other.initializes.Load(); n != 0 {
		t.Errorf("bob's request re-initialized alice's session (%d initialize requests on %s)", n, other.name)
	}

	status, _, got, err = mcpPost(ctx, client, h.endpoint(), sid, whoamiBody, alice...)
	if err != nil || status != http.StatusOK || servedBy(got, backends...) != other.name {
		t.Errorf("alice after failover: %d %q %v, want her session re-initialized on %s", status, got, err, other.name)
	}
	// And bob is still refused, now by the backend that holds alice's session.
	if status, _, got, _ := mcpPost(ctx, client, h.endpoint(), sid, whoamiBody, bob...); status != http.StatusForbidden {
		t.Errorf("bob on alice's re-initialized session: %d %q, want 403", status, got)
	}

	// Once that backend dies too, bob cannot end alice's session either.
	other.http.Close()
	del := func(who []string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, h.endpoint(), nil)
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set(who[0], who[1])
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if status := del(bob); status != http.StatusNotFound {
		t.Errorf("bob's DELETE of alice's session with its backends gone: %d, want 404", status)
	}
	if _, err := h.store.Get(ctx, sid); err != nil {
		t.Errorf("alice's session ended by bob's DELETE: %v", err)
	}
	if status := del(alice); status != http.StatusNoContent {
		t.Errorf("alice's DELETE of her session with its backends gone: %d, want 204", status)
	}
}

// refusingStore honours Store.Create's contract that a live record's id is
// never taken over (session.ErrExists), whatever the store underneath does.
type refusingStore struct{ session.Store }

func (s refusingStore) Create(ctx context.Context, r *session.Record) error {
	if _, err := s.Store.Get(ctx, r.ClientSID); err == nil {
		return session.ErrExists
	}
	return s.Store.Create(ctx, r)
}

// Two backends that mint the same session ids (a counter) never hand one
// client's session to another: the second initialize's backend session is
// deleted and the initialize goes elsewhere (issue 10 item 6).
func TestCollidingSessionIDsNeverChangeHands(t *testing.T) {
	counter := func() func() string {
		var n atomic.Int64
		return func() string { return fmt.Sprintf("session-%d", n.Add(1)) }
	}
	backends := []*sdkBackend{
		startSDKBackend(t, "b0", sdkBackendOptions{sessionIDs: counter()}),
		startSDKBackend(t, "b1", sdkBackendOptions{sessionIDs: counter()}),
	}
	h := newTether(t, []string{backends[0].URL(), backends[1].URL()}, harnessOptions{
		picker:    "round-robin", // the second initialize goes to the other backend, which mints the same id
		wrapStore: func(s session.Store) session.Store { return refusingStore{s} },
	})
	ctx := testContext(t)
	client := &http.Client{}

	first := openSession(t, client, h.endpoint())
	_, _, got, _ := mcpPost(ctx, client, h.endpoint(), first, whoamiBody)
	firstHome := servedBy(got, backends...)
	second := openSession(t, client, h.endpoint())
	if first == second {
		t.Fatalf("two clients share the session id %s", first)
	}
	_, _, got, _ = mcpPost(ctx, client, h.endpoint(), first, whoamiBody)
	if b := servedBy(got, backends...); b != firstHome || firstHome == "" {
		t.Errorf("first session served by %q after the second initialize, want %q", b, firstHome)
	}
	if status, _, got, err := mcpPost(ctx, client, h.endpoint(), second, whoamiBody); err != nil || status != http.StatusOK {
		t.Errorf("second session: %d %q %v", status, got, err)
	}
	testkit.EventuallyNoError(t, 10*time.Second, func() error {
		n := 0
		for _, b := range backends {
			n += b.liveSessions()
		}
		if n != 2 {
			return fmt.Errorf("%d backend sessions, want 2", n)
		}
		return nil
	}, "the colliding backend session was not deleted")
	if counted := h.countedSessions(); counted != 2 {
		t.Errorf("%d sessions counted on the endpoints, want 2", counted)
	}
}

// A backend that answers with two Mcp-Session-Id headers gets its client a
// 502: never two ids, never a record under one of them (issue 10 item 10).
func TestDuplicateSessionIDFromBackendIs502(t *testing.T) {
	var dupOnInit atomic.Bool
	srv := testkit.StartServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case bytes.Contains(body, []byte(`"initialize"`)) && !dupOnInit.Load():
			w.Header().Set("Mcp-Session-Id", "one")
		default:
			w.Header()["Mcp-Session-Id"] = []string{"one", "two"}
		}
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18"}}`)
	}))
	h := newStaticHarness(t, srv.URL)
	ctx := testContext(t)
	client := &http.Client{}

	check := func(what string, status int, hdr http.Header, body string) {
		t.Helper()
		if n := len(hdr.Values("Mcp-Session-Id")); status != http.StatusBadGateway || n > 0 {
			t.Errorf("%s: status %d with %d session ids, want 502 and none", what, status, n)
		}
		if code, _, ok := jsonrpcErrorOf(body); !ok || code != -32010 {
			t.Errorf("%s: body %q, want a JSON-RPC error -32010", what, body)
		}
	}
	// A follow-up of a session recorded from a well-formed initialize.
	status, hdr, body, err := mcpPost(ctx, client, h.endpoint(), "", initializeBody)
	if err != nil || status != http.StatusOK || hdr.Get("Mcp-Session-Id") != "one" {
		t.Fatalf("initialize: %d %v %v", status, hdr, err)
	}
	status, hdr, body, _ = mcpPost(ctx, client, h.endpoint(), "one", whoamiBody)
	check("follow-up", status, hdr, body)
	// A stateless request.
	status, hdr, body, _ = mcpPost(ctx, client, h.endpoint(), "", `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
	check("stateless", status, hdr, body)
	// An initialize: no record under either id.
	if _, err := h.store.Delete(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	dupOnInit.Store(true)
	status, hdr, body, _ = mcpPost(ctx, client, h.endpoint(), "", initializeBody)
	check("initialize", status, hdr, body)
	for _, id := range []string{"one", "two"} {
		if _, err := h.store.Get(ctx, id); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("record under %q after a refused initialize: %v", id, err)
		}
	}
}

// An initialize larger than --max-init-body is refused with 413 before it
// is stored or forwarded; other requests keep the --max-body limit.
func TestInitializeBodyLimit(t *testing.T) {
	rb := newRecordingBackend(t, nil)
	h := newStaticHarness(t, rb.URL)
	ctx := testContext(t)
	client := &http.Client{}
	padding := strings.Repeat("x", 70<<10)

	big := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"` + padding + `","version":"1"}}}`
	status, _, body, err := mcpPost(ctx, client, h.endpoint(), "", big)
	if err != nil {
		t.Fatal(err)
	}
	if code, _, ok := jsonrpcErrorOf(body); status != http.StatusRequestEntityTooLarge || !ok || code != -32600 {
		t.Errorf("70 KiB initialize: %d %q, want 413 with -32600", status, body)
	}
	if got, _ := rb.last(); got != nil {
		t.Error("the oversized initialize reached the backend")
	}
	if n := h.mem.Len(); n != 0 {
		t.Errorf("%d records after the refused initialize", n)
	}
	// The same size is fine for a request that is not stored.
	call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"` + padding + `"}}}`
	if status, _, body, err := mcpPost(ctx, client, h.endpoint(), "", call); err != nil || status != http.StatusOK {
		t.Errorf("70 KiB tools/call: %d %q %v, want it forwarded", status, body, err)
	}
}

// A principal header of the deployment's own (a gateway's user header)
// binds the session like Authorization does, and it is replayed with the
// initialize, so that the new backend session belongs to the same user.
func TestPrincipalHeaderIsReplayed(t *testing.T) {
	var mu sync.Mutex
	var initUsers []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case bytes.Contains(body, []byte(`"initialize"`)):
			mu.Lock()
			initUsers = append(initUsers, r.Header.Get("X-Auth-Request-User"))
			n := len(initUsers)
			mu.Unlock()
			w.Header().Set("Mcp-Session-Id", fmt.Sprintf("backend-session-%d", n))
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18"}}`)
		case r.Header.Get("Mcp-Session-Id") == "backend-session-1":
			http.Error(w, "session not found", http.StatusNotFound) // forgotten at once
		default:
			w.WriteHeader(http.StatusAccepted)
		}
	}))
	t.Cleanup(srv.Close)
	h := newTether(t, []string{srv.URL}, harnessOptions{principalHeaders: []string{"X-Auth-Request-User"}})
	ctx := testContext(t)
	client := &http.Client{}
	status, hdr, _, err := mcpPost(ctx, client, h.endpoint(), "", initializeBody, "X-Auth-Request-User", "alice")
	sid := hdr.Get("Mcp-Session-Id")
	if err != nil || status != http.StatusOK || sid == "" {
		t.Fatalf("initialize: %d %v", status, err)
	}
	note := `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}`
	if status, _, body, _ := mcpPost(ctx, client, h.endpoint(), sid, note, "X-Auth-Request-User", "mallory"); status != http.StatusNotFound {
		t.Errorf("another user's request on the lost session: %d %q, want 404", status, body)
	}
	if status, _, body, _ := mcpPost(ctx, client, h.endpoint(), sid, note, "X-Auth-Request-User", "alice"); status != http.StatusAccepted {
		t.Errorf("the creator's request on the lost session: %d %q, want it re-initialized and accepted", status, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(initUsers) != 2 || initUsers[1] != "alice" {
		t.Errorf("initialize requests carried users %q, want [alice alice]", initUsers)
	}
}
