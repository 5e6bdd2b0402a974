package proxy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/tether-mcp/tether/internal/h1"
)

// MCP has two eras on one endpoint (docs/specification/2026-07-28/basic/
// versioning.mdx, "Backward Compatibility with Initialization-Based
// Versions", in github.com/modelcontextprotocol/modelcontextprotocol):
// legacy versions (2025-11-25 and older) open a session with initialize and
// carry Mcp-Session-Id; modern ones (2026-07-28 on, SEP-2567 and SEP-2575)
// have no session and carry their version on every request. A dual-era
// server serves both, so tether tells them apart per request.

// protocolEra is the protocol era of one request.
type protocolEra uint8

const (
	// eraLegacy: initialize, a request with Mcp-Session-Id, or a version
	// header older than 2026-07-28, absent or malformed. Routed as before
	// the modern era existed; its routing headers are never trusted.
	eraLegacy protocolEra = iota
	// eraModern: MCP-Protocol-Version 2026-07-28 or later and no session.
	// Its routing headers are validated against the body (validateModern).
	eraModern
)

var eraNames = [...]string{"legacy", "modern"}

func (e protocolEra) String() string { return eraNames[e] }

// firstModernVersion is the first protocol version without sessions and
// with routing headers (SEP-2243, SEP-2567, SEP-2575).
const firstModernVersion = "2026-07-28"

// op is what a request's method asks of routing beyond a plain pick: the
// state it depends on lives on one backend.
type op uint8

const (
	opPlain  op = iota // any backend can serve it
	opTask             // tasks/get, tasks/update, tasks/cancel: the task's backend (SEP-2663)
	opListen           // subscriptions/listen: a long-lived stream (basic/patterns/subscriptions.mdx)
)

var opNames = [...]string{"plain", "task", "listen"}

func (o op) String() string { return opNames[o] }

// Routing headers of the 2026-07-28 Streamable HTTP transport
// (docs/specification/2026-07-28/basic/transports/streamable-http.mdx,
// "Request Metadata").
const (
	headerMethod = "Mcp-Method"
	headerName   = "Mcp-Name"
)

// metaProtocolVersion is the _meta key that carries a modern request's
// version; the MCP-Protocol-Version header must equal it
// (streamable-http.mdx, "Protocol Version Header").
const metaProtocolVersion = "io.modelcontextprotocol/protocolVersion"

// codeHeaderMismatch is HeaderMismatch (schema/2026-07-28/schema.ts,
// HEADER_MISMATCH): headers that disagree with the body, or required
// routing headers missing or malformed. Always with 400. SEP-2243 first
// numbered it -32001; its changelog moves it to -32020.
const codeHeaderMismatch = -32020

// nameMember is the params member Mcp-Name mirrors for method, or "" when
// the method has no Mcp-Name. tools/call, prompts/get: params.name;
// resources/read: params.uri (streamable-http.mdx, "Standard Request
// Headers"); tasks/get, tasks/update, tasks/cancel: params.taskId
// (seps/2663-tasks-extension.md, "Streamable HTTP: Routing Headers").
func nameMember(method string) string {
	switch method {
	case "tools/call", "prompts/get":
		return "name"
	case "resources/read":
		return "uri"
	case "tasks/get", "tasks/update", "tasks/cancel":
		return "taskId"
	}
	return ""
}

// methodOp is the Op of a method.
func methodOp(method string) op {
	switch method {
	case "tasks/get", "tasks/update", "tasks/cancel":
		return opTask
	case "subscriptions/listen":
		return opListen
	}
	return opPlain
}

// requestEra applies the era rule. Versions are dates, compared as strings
// once they have a date's shape (as go-sdk does); anything else is legacy,
// to be answered by the backend as today.
func requestEra(c *classification) protocolEra {
	if c.Kind == kindInitialize || c.SessionID != "" {
		return eraLegacy
	}
	if isVersionDate(c.ProtocolVersion) && c.ProtocolVersion >= firstModernVersion {
		return eraModern
	}
	return eraLegacy
}

// isVersionDate reports whether v is shaped YYYY-MM-DD.
func isVersionDate(v string) bool {
	if len(v) != 10 {
		return false
	}
	for i := 0; i < len(v); i++ {
		if i == 4 || i == 7 {
			if v[i] != '-' {
				return false
			}
		} else if v[i] < '0' || v[i] > '9' {
			return false
		}
	}
	return true
}

// errModernBatch refuses a batch carrying a 2026-07-28 version: the body
// of a POST must be a single request or notification (streamable-http.mdx,
// "Sending Messages", 4), and a batch's routing headers could not match
// its several bodies.
var errModernBatch = &requestError{http.StatusBadRequest, codeInvalidRequest,
	"a " + firstModernVersion + " request body must be a single JSON-RPC message, not a batch"}

// headerMismatch is a HeaderMismatch refusal with the spec's wording
// ("Header mismatch: Mcp-Name header value 'foo' does not match body value
// 'bar'", streamable-http.mdx, "Server Validation").
func headerMismatch(format string, args ...any) *requestError {
	return &requestError{http.StatusBadRequest, codeHeaderMismatch, fmt.Sprintf(format, args...)}
}

// maxEchoed bounds a header or body value quoted back in an error message.
const maxEchoed = 128

func quoted(s string) string {
	if len(s) > maxEchoed {
		s = s[:maxEchoed] + "…"
	}
	return s
}

// validateModern checks a modern POST's routing headers against its body
// before anything routes on them, as streamable-http.mdx ("Server
// Validation") requires of every server that processes the body: a
// required header missing, a value the body contradicts, or a malformed
// value is refused with 400 and HeaderMismatch. It fills c.Name from the
// body. Header names are matched case-insensitively, values exactly
// ("Case Sensitivity").
//
// Requests need Mcp-Method, and Mcp-Name where nameMember says. The spec
// defines no header requirement for notifications ("This revision ...
// defines no client-to-server notifications"): a notification's
// Mcp-Method is checked only when sent. Mcp-Param-* headers are forwarded
// untouched, except the affinity header tether routes on, which
// affinityValue checks against the argument it is configured to carry:
// which argument any other one mirrors is in the tool's inputSchema, which
// only the backend has.
func validateModern(h h1.Fields, c *classification, params []byte) *requestError {
	if c.Batch {
		return errModernBatch
	}
	if c.Kind != kindRequest && c.Kind != kindNotification {
		return nil // a response: not routed on headers (clients MUST NOT send them)
	}
	method, present, rerr := singleHeader(h, headerMethod)
	if rerr != nil {
		return rerr
	}
	switch {
	case !present && c.Kind == kindRequest:
		return headerMismatch("Header mismatch: missing required %s header", headerMethod)
	case present && method != c.Method:
		return headerMismatch("Header mismatch: %s header value '%s' does not match body value '%s'", headerMethod, quoted(method), quoted(c.Method))
	}
	if v, ok, err := paramsString(params, "_meta", metaProtocolVersion); err != nil {
		return err
	} else if ok && v != c.ProtocolVersion {
		return headerMismatch("Header mismatch: MCP-Protocol-Version header value '%s' does not match body value '%s'", quoted(c.ProtocolVersion), quoted(v))
	}
	member := nameMember(c.Method)
	if member == "" || c.Kind != kindRequest {
		return nil
	}
	raw, present, rerr := singleHeader(h, headerName)
	if rerr != nil {
		return rerr
	}
	if !present {
		return headerMismatch("Header mismatch: missing required %s header for method '%s'", headerName, c.Method)
	}
	name, ok := decodeHeaderValue(raw)
	if !ok {
		return headerMismatch("Header mismatch: %s header value '%s' is not valid =?base64?...?= encoding", headerName, quoted(raw))
	}
	body, ok, rerr := paramsString(params, member, "")
	if rerr != nil {
		return rerr
	}
	if !ok {
		// The header names something the body does not: a mismatch, as
		// with any other body value (the backend would refuse the body as
		// invalid params anyway).
		return headerMismatch("Header mismatch: %s header value '%s' does not match body value (params.%s is missing or not a string)", headerName, quoted(name), member)
	}
	if name != body {
		return headerMismatch("Header mismatch: %s header value '%s' does not match body value '%s'", headerName, quoted(name), quoted(body))
	}
	c.Name = body
	return nil
}

// singleHeader returns the one value of a routing header. Two values, or a
// value with control characters, are malformed ("A header value contains
// invalid characters"). Bytes above 0x7e (obs-text) pass: go-sdk v1.8.0
// clients send a non-ASCII name raw rather than Base64-encoded, and RFC
// 9110 still admits obs-text.
func singleHeader(h h1.Fields, name string) (string, bool, *requestError) {
	switch n := h.Count(name); n {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", false, headerMismatch("Header mismatch: %s header sent %d times", name, n)
	}
	v := h.Get(name)
	if v == "" {
		return "", false, headerMismatch("Header mismatch: %s header is empty", name)
	}
	for i := 0; i < len(v); i++ {
		if (v[i] < 0x20 && v[i] != '\t') || v[i] == 0x7f {
			return "", false, headerMismatch("Header mismatch: %s header contains invalid characters", name)
		}
	}
	return v, true, nil
}

// Base64 sentinel of Mcp-Name and Mcp-Param-* values (streamable-http.mdx,
// "Value Encoding"): case-sensitive markers around standard Base64 of the
// UTF-8 value.
const (
	base64Prefix = "=?base64?"
	base64Suffix = "?="
)

// decodeHeaderValue undoes the Base64 sentinel; a value without both
// markers is literal. ok is false for a sentinel around invalid Base64,
// which servers must refuse.
func decodeHeaderValue(v string) (string, bool) {
	inner, ok := strings.CutPrefix(v, base64Prefix)
	if !ok || len(inner) < len(base64Suffix) || !strings.HasSuffix(inner, base64Suffix) {
		return v, true
	}
	dec, err := base64.StdEncoding.DecodeString(inner[:len(inner)-len(base64Suffix)])
	if err != nil {
		return "", false
	}
	return string(dec), true
}

// paramsString reads params.key as a string (or params.key.sub when sub is
// not ""). ok is false when params, the member or the string is absent or
// of another type. Member names match exactly, as the SDKs read them
// (go-sdk decodes case-sensitively; JSON.parse does); a member named twice
// is refused, since parsers disagree on which one counts.
func paramsString(params []byte, key, sub string) (string, bool, *requestError) {
	val, rerr := objectMember(params, key)
	if rerr != nil || val == nil {
		return "", false, rerr
	}
	if sub != "" {
		if val, rerr = objectMember(val, sub); rerr != nil || val == nil {
			return "", false, rerr
		}
	}
	if val[0] != '"' {
		return "", false, nil
	}
	s, ok := stringValue(val)
	return s, ok, nil
}

// objectMember returns the raw value of member key in the JSON object obj
// (well-formed JSON: part of a body parseMessages validated), or nil when
// obj is not an object or has no such member.
func objectMember(obj []byte, key string) ([]byte, *requestError) {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return nil, nil
	}
	var found []byte
	for i++; ; {
		i = skipSpace(obj, i)
		if obj[i] == '}' {
			return found, nil
		}
		if obj[i] == ',' {
			i = skipSpace(obj, i+1)
		}
		keyEnd := skipString(obj, i)
		rawKey := obj[i:keyEnd]
		i = skipSpace(obj, keyEnd)
		i = skipSpace(obj, i+1) // ':'
		valEnd := skipValue(obj, i)
		if memberNamed(rawKey, key) {
			if found != nil {
				return nil, headerMismatch("Header mismatch: body member '%s' appears more than once", key)
			}
			found = obj[i:valEnd]
		}
		i = valEnd
	}
}

// memberNamed reports whether the JSON string token tok is key, escapes
// decoded.
func memberNamed(tok []byte, key string) bool {
	raw := tok[1 : len(tok)-1]
	if !bytes.ContainsRune(raw, '\\') {
		return string(raw) == key
	}
	var s string
	return json.Unmarshal(tok, &s) == nil && s == key
}

// methodLabels is the bounded set of method label values
// (tether_requests_total{method}): the methods a client sends in
// 2026-07-28 (schema/2026-07-28/schema.ts), in 2025-11-25 and earlier
// (schema/2025-11-25/schema.ts), and in the tasks extension (SEP-2663).
// Any other method counts as "other"; a message without one (GET, DELETE,
// a POST of responses) as "".
var methodLabels = func() map[string]string {
	m := map[string]string{}
	for _, s := range []string{
		"completion/complete", "initialize", "logging/setLevel", "ping",
		"prompts/get", "prompts/list", "resources/list", "resources/read",
		"resources/subscribe", "resources/templates/list", "resources/unsubscribe",
		"server/discover", "subscriptions/listen",
		"tasks/cancel", "tasks/get", "tasks/list", "tasks/result", "tasks/update",
		"tools/call", "tools/list",
		"notifications/cancelled", "notifications/initialized", "notifications/progress",
		"notifications/roots/list_changed",
	} {
		m[s] = s
	}
	return m
}()

// methodLabel is the metric label value of a JSON-RPC method.
func methodLabel(method string) string {
	if method == "" {
		return ""
	}
	if l, ok := methodLabels[method]; ok {
		return l
	}
	return "other"
}

// affinityValue is the handle key of a modern tools/call routed by the
// affinity header: the header's value, checked against the tool argument
// it carries (params.arguments.argument), as the spec asks of an
// intermediary that routes on an Mcp-Param-* header (streamable-http.mdx,
// "Server Validation": it SHOULD NOT trust the header unvalidated). A
// missing header is no key (the request is picked by load); a header that
// differs from the argument, or names an argument the call lacks, is a
// HeaderMismatch. Numbers and booleans travel as their JSON text
// (SEP-2243); other argument types are never header values.
func affinityValue(h h1.Fields, header, argument string, params []byte) (string, *requestError) {
	raw, present, rerr := singleHeader(h, header)
	if rerr != nil || !present {
		return "", rerr
	}
	value, ok := decodeHeaderValue(raw)
	if !ok {
		return "", headerMismatch("Header mismatch: %s header value '%s' is not valid =?base64?...?= encoding", header, quoted(raw))
	}
	args, rerr := objectMember(params, "arguments")
	if rerr != nil {
		return "", rerr
	}
	arg, rerr := objectMember(args, argument)
	if rerr != nil {
		return "", rerr
	}
	var body string
	switch {
	case len(arg) > 0 && arg[0] == '"':
		body, ok = stringValue(arg)
	case len(arg) > 0 && (arg[0] == '-' || arg[0] >= '0' && arg[0] <= '9' || string(arg) == "true" || string(arg) == "false"):
		body, ok = string(arg), true
	default:
		ok = false
	}
	if !ok {
		return "", headerMismatch("Header mismatch: %s header value '%s' does not match body value (params.arguments.%s is missing or not a string, number or boolean)", header, quoted(value), argument)
	}
	if value != body {
		return "", headerMismatch("Header mismatch: %s header value '%s' does not match body value '%s'", header, quoted(value), quoted(body))
	}
	return value, nil
}
