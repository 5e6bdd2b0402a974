package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/h1"
	"github.com/tether-mcp/tether/internal/mcpbackend"
	"github.com/tether-mcp/tether/internal/proxy"
)

const followUpBody = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`

// initSession opens a raw MCP session at url and returns its id.
func initSession(tb testing.TB, client *http.Client, url string) string {
	tb.Helper()
	do := func(sid, body string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		}
		resp, err := client.Do(req)
		if err != nil {
			tb.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			tb.Fatalf("%s: status %d", body, resp.StatusCode)
		}
		return resp
	}
	resp := do("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}`)
	sid := resp.Header.Get("Mcp-Session-Id")
	do(sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return sid
}

func followUp(b *testing.B, client *http.Client, url, sid string) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(followUpBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	resp, err := client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("status %d", resp.StatusCode)
	}
}

// BenchmarkFollowUp sends the same follow-up tools/call on a live session
// to a go-sdk backend directly and through tether, interleaved in one run,
// and reports both latencies and their ratio (these machines are noisy; a
// ratio measured in one run is what can be compared).
func BenchmarkFollowUp(b *testing.B) {
	backend, err := mcpbackend.Start("bench", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer backend.Close()
	front := newTether(b, []string{backend.URL()}, harnessOptions{}).front

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	directURL, tetherURL := backend.URL()+"/mcp", front.URL+"/mcp"
	directSID := initSession(b, client, directURL)
	tetherSID := initSession(b, client, tetherURL)
	for range 50 { // warm the connection pools
		followUp(b, client, directURL, directSID)
		followUp(b, client, tetherURL, tetherSID)
	}

	var direct, through time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		followUp(b, client, directURL, directSID)
		t1 := time.Now()
		followUp(b, client, tetherURL, tetherSID)
		direct += t1.Sub(t0)
		through += time.Since(t1)
	}
	b.ReportMetric(float64(direct.Nanoseconds())/float64(b.N), "direct-ns/req")
	b.ReportMetric(float64(through.Nanoseconds())/float64(b.N), "tether-ns/req")
	b.ReportMetric(float64(through)/float64(direct), "tether/direct")
}

// cannedTransport answers every request from memory, so that a benchmark
// measures tether's own request path and nothing else.
type cannedTransport struct{ sid string }

func (c cannedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	h := http.Header{"Content-Type": {"application/json"}}
	if c.sid != "" {
		h.Set("Mcp-Session-Id", c.sid)
	}
	const body = `{"jsonrpc":"2.0","id":2,"result":{"content":[]}}`
	return &http.Response{
		StatusCode: 200, Header: h, Body: io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)), Request: r, ProtoMajor: 1, ProtoMinor: 1,
	}, nil
}

type discardWriter struct {
	h      http.Header
	adopt  bool // AdoptFields takes fields over, as h1's writer does
	fields h1.Fields
}

// Header merges adopted fields into the map, as h1's writer does: a
// Header call after the adoption costs what it costs there.
func (d *discardWriter) Header() http.Header {
	d.fields.AddTo(d.h)
	d.fields = nil
	return d.h
}

func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}

func (d *discardWriter) AdoptFields(f h1.Fields) bool {
	if !d.adopt {
		return false
	}
	d.Header()
	d.fields = f
	return true
}

// SetReadDeadline is what the server's writer offers for the body timeout
// (without it, http.ResponseController's "not supported" error would be
// counted as tether's allocation).
func (d *discardWriter) SetReadDeadline(time.Time) error { return nil }

// BenchmarkServeHTTPFollowUp is tether's own cost for a sticky follow-up:
// classify, session lookup, pick-free routing, the forward path, with the
// network replaced by a canned answer. Its allocations include the
// harness's (request, writer, canned answer); TestFollowUpAllocations
// tells them apart.
func BenchmarkServeHTTPFollowUp(b *testing.B) {
	serve := cannedProxy(b, proxy.Config{})
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		serve()
	}
}
