package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// The benchmark speaks raw MCP Streamable HTTP: it needs the session id, the
// backend's name and the status of every request, and a go-sdk client would
// hide them (and open a GET stream per session, which is not what a proxy's
// follow-up traffic looks like).

const (
	protocolVersion = "2025-06-18"
	initializeBody  = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"tetherbench","version":"1"}}}`
	initializedBody = `{"jsonrpc":"2.0","method":"notifications/initialized"}`
	whoamiBody      = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`
	echoBody        = `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`
	pingBody        = `{"jsonrpc":"2.0","id":9,"method":"ping"}`
)

// statusError is a non-2xx answer.
type statusError struct {
	Code int
	Body string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("status %d: %s", e.Code, strings.TrimSpace(e.Body))
}

func mcpHeaders(sid string) http.Header {
	h := http.Header{
		"Content-Type": {"application/json"},
		"Accept":       {"application/json, text/event-stream"},
	}
	if sid != "" {
		h.Set("Mcp-Session-Id", sid)
		h.Set("Mcp-Protocol-Version", protocolVersion)
	}
	return h
}

// post sends one JSON-RPC message and returns the response's session id
// header and the JSON-RPC message it carried (nil for 202).
func post(ctx context.Context, c *http.Client, url, sid, body string) (string, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return "", nil, err
	}
	req.Header = mcpHeaders(sid)
	resp, err := c.Do(req)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", nil, err
	}
	if resp.StatusCode/100 != 2 {
		return "", nil, &statusError{Code: resp.StatusCode, Body: string(raw)}
	}
	return resp.Header.Get("Mcp-Session-Id"), jsonRPCMessage(raw), nil
}

// jsonRPCMessage extracts the message of a JSON response or of the first
// SSE event that has data.
func jsonRPCMessage(raw []byte) []byte {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || t[0] == '{' || t[0] == '[' {
		return t
	}
	var data []byte
	for line := range bytes.Lines(raw) {
		line = bytes.TrimRight(line, "\r\n")
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			data = append(data, bytes.TrimPrefix(d, []byte(" "))...)
		} else if len(line) == 0 && len(data) > 0 {
			return data
		}
	}
	return data
}

// openSession initializes a session at url and returns its id and the name
// of the server that answered (serverInfo.name: the backend's name).
func openSession(ctx context.Context, c *http.Client, url string) (sid, backend string, err error) {
	sid, msg, err := post(ctx, c, url, "", initializeBody)
	if err != nil {
		return "", "", fmt.Errorf("initialize: %w", err)
	}
	if sid == "" {
		return "", "", errors.New("initialize: no Mcp-Session-Id in the response")
	}
	var res struct {
		Result struct {
			ServerInfo struct{ Name string } `json:"serverInfo"`
		}
	}
	if err := json.Unmarshal(msg, &res); err != nil {
		return "", "", fmt.Errorf("initialize: %w (%q)", err, msg)
	}
	if _, _, err := post(ctx, c, url, sid, initializedBody); err != nil {
		return "", "", fmt.Errorf("notifications/initialized: %w", err)
	}
	return sid, res.Result.ServerInfo.Name, nil
}

// whoami calls the whoami tool on a session and returns the backend's name.
func whoami(ctx context.Context, c *http.Client, url, sid string) (string, error) {
	_, msg, err := post(ctx, c, url, sid, whoamiBody)
	if err != nil {
		return "", err
	}
	var res struct {
		Result struct {
			StructuredContent struct{ Backend string } `json:"structuredContent"`
			IsError           bool                     `json:"isError"`
		}
		Error *struct{ Message string }
	}
	if err := json.Unmarshal(msg, &res); err != nil {
		return "", fmt.Errorf("whoami: %w (%q)", err, msg)
	}
	if res.Error != nil {
		return "", fmt.Errorf("whoami: JSON-RPC error %s", res.Error.Message)
	}
	if res.Result.StructuredContent.Backend == "" {
		return "", fmt.Errorf("whoami: no backend in %q", msg)
	}
	return res.Result.StructuredContent.Backend, nil
}

// closeSession sends DELETE for a session (best effort).
func closeSession(ctx context.Context, c *http.Client, url, sid string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, url, nil)
	if err != nil {
		return err
	}
	req.Header = mcpHeaders(sid)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
		return &statusError{Code: resp.StatusCode}
	}
	return nil
}

// newClient is the benchmark's own HTTP client for session set-up.
func newClient() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}}
}
