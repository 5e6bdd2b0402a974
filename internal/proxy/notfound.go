package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/tether-mcp/tether/internal/h1"
)

// maxNotFoundBody bounds what tether reads of a backend's 404 to tell "the
// session is unknown" from an answer to the request. Session-not-found
// bodies are a line of text or a small JSON-RPC error.
const maxNotFoundBody = 64 << 10

// sessionLost reads the start of a 404 answer to a request on a known
// session and reports whether the 404 is about the session. When it is not,
// resp.Body is replaced by one that yields the whole original body, so the
// client gets the answer unchanged.
func (p *Proxy) sessionLost(resp *h1.Answer) (bool, error) {
	if isEventStream(resp.Header.Get("Content-Type")) {
		// A stream is an answer to the request; no server streams its
		// "session not found".
		return false, nil
	}
	head, err := io.ReadAll(io.LimitReader(resp.Body, maxNotFoundBody+1))
	if err != nil {
		return false, fmt.Errorf("read 404 answer: %w", err)
	}
	if len(head) <= maxNotFoundBody && notFoundIsAboutSession(head) {
		return true, nil
	}
	// Hand on what was read, then the rest, under the original Close.
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	return false, nil
}

// notFoundIsAboutSession tells a 404 about the session (MCP: the client must
// re-initialize) from a 404 that answers the request itself. It is about the
// session when the body is not a JSON-RPC response (go-sdk: the text
// "session not found"), when the JSON-RPC error's id is null or absent (the
// TypeScript, Python and C# SDK servers), or when it has the shape those SDKs
// give session-not-found (code -32001, or a message saying so). A response
// carrying a request's id answers that request: MCP 2026-07-28 servers (go-sdk
// v1.8.0) answer an unknown method with 404 and -32601, and a server may
// answer 404 for a missing resource.
func notFoundIsAboutSession(body []byte) bool {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || (body[0] != '{' && body[0] != '[') {
		return true
	}
	if body[0] == '[' {
		var batch []json.RawMessage
		if json.Unmarshal(body, &batch) != nil || len(batch) == 0 {
			return true
		}
		for _, m := range batch {
			if !responseIsAboutSession(m) {
				return false
			}
		}
		return true
	}
	return responseIsAboutSession(body)
}

func responseIsAboutSession(msg []byte) bool {
	var m struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  json.RawMessage `json:"result"`
		Error   *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(msg, &m) != nil || m.JSONRPC != "2.0" || (m.Result == nil && m.Error == nil) {
		return true // not a JSON-RPC response
	}
	if len(m.ID) == 0 || string(m.ID) == "null" {
		return true
	}
	return m.Error != nil && (m.Error.Code == codeSessionNotFound ||
		strings.Contains(strings.ToLower(m.Error.Message), "session not found"))
}
