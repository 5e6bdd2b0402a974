package tetherproc

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Post sends one Streamable HTTP POST (on session sid, when not "") and
// drains the answer; a non-2xx status is an error. The returned response's
// body is already read and closed: callers want its headers.
func Post(ctx context.Context, c *http.Client, url, sid, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s: status %d", body, resp.StatusCode)
	}
	return resp, nil
}

// Scrape reads tether's /metrics at admin into name → value (unlabelled
// series only).
func Scrape(admin string) map[string]float64 {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			v, _ := strconv.ParseFloat(f[1], 64)
			out[f[0]] = v
		}
	}
	return out
}

// MinimalBackend answers initialize with a new session and anything else
// with an empty result: an MCP backend that costs next to nothing, so
// that what is measured is tether.
func MinimalBackend(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	if bytes.Contains(body, []byte(`"initialize"`)) {
		id := make([]byte, 16)
		rand.Read(id)
		w.Header().Set("Mcp-Session-Id", hex.EncodeToString(id))
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"minimal","version":"1"}}}`)
		return
	}
	if r.Header.Get("Mcp-Session-Id") == "" || bytes.Contains(body, []byte(`"notifications/`)) {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	io.WriteString(w, `{"jsonrpc":"2.0","id":2,"result":{}}`)
}
