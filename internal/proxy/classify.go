package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"

	"github.com/tether-mcp/tether/internal/h1"
)

// MCP Streamable HTTP headers.
const (
	headerSessionID       = "Mcp-Session-Id"
	headerProtocolVersion = "Mcp-Protocol-Version"
	headerLastEventID     = "Last-Event-Id"
)

// maxSessionIDLen bounds the Mcp-Session-Id header. The MCP spec only says
// "visible ASCII"; real servers mint UUIDs or 32–64 character tokens, so 256
// leaves room while keeping records and logs bounded.
const maxSessionIDLen = 256

// kind is what an HTTP request means to MCP, as far as routing cares.
type kind uint8

const (
	kindRequest      kind = iota // POST of a JSON-RPC request (or a batch holding one)
	kindInitialize               // POST whose message, or one of whose batch members, is initialize
	kindNotification             // POST of notifications only
	kindResponse                 // POST of responses (to server-initiated requests) only
	kindStream                   // GET: the server-to-client SSE stream
	kindDelete                   // DELETE: end the session
	kindOther                    // any other HTTP method (OPTIONS preflight, HEAD, ...)
)

var kindNames = [...]string{"request", "initialize", "notification", "response", "stream", "delete", "other"}

func (k kind) String() string { return kindNames[k] }

// classification is everything the router needs to know about a request. It
// is computed once, before any routing decision.
//
// The one-byte fields come first, together: an open stream keeps a copy
// (eventStream), and padding between them was 16 bytes of each.
type classification struct {
	Kind  kind
	Batch bool
	// Era is the request's protocol era (era.go); Op what its method needs
	// of routing. Name is the body's params.name (tools/call,
	// prompts/get), params.uri (resources/read) or params.taskId (tasks/*)
	// once a modern request's Mcp-Name matched it; "" otherwise.
	Era protocolEra
	Op  op

	SessionID       string          // Mcp-Session-Id as the client sent it ("" if none)
	ProtocolVersion string          // MCP-Protocol-Version as the client sent it
	Method          string          // JSON-RPC method of the message (first request of a batch); "" for responses
	ID              json.RawMessage // JSON-RPC id of a single request, for error replies; nil otherwise
	Body            []byte          // the complete request body (POST; others only when they have one), kept for forwarding and replay
	Name            string
	Params          []byte // the raw params of a single message, inside Body; nil if none
}

// requestError is a request tether refuses before routing it. It becomes an
// HTTP status plus, where the client speaks JSON-RPC, a JSON-RPC error body.
type requestError struct {
	status  int
	code    int
	message string
}

func (e *requestError) Error() string { return e.message }

// JSON-RPC error codes tether answers with. JSON-RPC leaves -32000..-32099
// to implementations; MCP 2026-07-28 reserves -32020..-32099 for codes its
// schema defines (-32020 header mismatch, -32021 missing client capability,
// -32022 unsupported protocol version) and keeps -32002 (resource not found
// before 2026-07-28, which mcp-go still maps to ErrResourceNotFound) and
// -32042 (URL elicitation required, 2025-11-25) retired, never to be reused.
// In -32000..-32019 the SDKs already use -32000 (TypeScript, Python, Kotlin:
// connection closed), -32001 (TypeScript, Python: request timeout; go-sdk:
// unknown error), -32003 and -32004 (go-sdk: client or server closing;
// TypeScript drafts of 2026-07-28: missing capability, unsupported version)
// and -32005 (go-sdk: rejected by transport). tether's own failures take two
// codes nobody assigns, so that no client library reads them as something
// they are not:
//
//	code    status       meaning
//	-32700  400          body is not JSON
//	-32600  400, 413     not a JSON-RPC 2.0 message, bad session header, body too large
//	-32603  500          tether failed internally
//	-32001  404          unknown session (id null): start a new session. The TypeScript,
//	                     C# and Python SDK servers answer an unknown session with it.
//	-32010  502          the backend failed, or no backend could take the request
//	-32011  503          no backend or session store available now (Retry-After)
const (
	codeParseError      = -32700
	codeInvalidRequest  = -32600
	codeInternalError   = -32603
	codeSessionNotFound = -32001
	codeBackendFailed   = -32010
	codeUnavailable     = -32011
)

var (
	errBodyTooLarge = &requestError{http.StatusRequestEntityTooLarge, codeInvalidRequest, "request body too large"}
	errEmptyBody    = &requestError{http.StatusBadRequest, codeInvalidRequest, "empty request body"}
	errNotJSON      = &requestError{http.StatusBadRequest, codeParseError, "request body is not valid JSON"}
	errNotJSONRPC   = &requestError{http.StatusBadRequest, codeInvalidRequest, "request body is not a JSON-RPC 2.0 message"}
	errEmptyBatch   = &requestError{http.StatusBadRequest, codeInvalidRequest, "empty JSON-RPC batch"}
	errBadSessionID = &requestError{http.StatusBadRequest, codeInvalidRequest, "invalid Mcp-Session-Id header"}
	errReadBody     = &requestError{http.StatusBadRequest, codeInvalidRequest, "could not read request body"}
)

// classify reads what routing needs from r. For POST it reads the whole body,
// refusing more than maxBody bytes: an oversized Content-Length is refused
// before a byte of the body is read. The body's buffer is reserved from
// budget (nil: unbounded) as it grows; see readBody.
func classify(r *http.Request, h h1.Fields, maxBody int64, budget *byteBudget) (classification, *requestError) {
	var c classification
	c.ProtocolVersion = h.Get(headerProtocolVersion)
	// An empty header counts as none (some proxies send one); two values,
	// or one that is not 1..256 visible ASCII characters, are refused.
	if n := h.Count(headerSessionID); n > 1 {
		return c, errBadSessionID
	} else if v := h.Get(headerSessionID); n == 1 && v != "" {
		if !validSessionID(v) {
			return c, errBadSessionID
		}
		c.SessionID = v
	}
	switch r.Method {
	case http.MethodPost:
	case http.MethodGet:
		c.Kind = kindStream
	case http.MethodDelete:
		c.Kind = kindDelete
	default:
		c.Kind = kindOther
	}
	if r.Method != http.MethodPost {
		c.Era = requestEra(&c)
		// MCP's GET and DELETE carry no body. One that comes anyway is read
		// under the same limits as a POST's and forwarded whole, rather
		// than streamed to the backend with no deadline or bound.
		if r.Body != nil && r.Body != http.NoBody {
			body, rerr := readBody(r, maxBody, budget)
			if rerr != nil {
				return c, rerr
			}
			if len(body) > 0 {
				c.Body = body
			} else {
				budget.release(int64(cap(body)))
			}
		}
		return c, nil
	}

	body, rerr := readBody(r, maxBody, budget)
	if rerr != nil {
		return c, rerr
	}
	c.Body = body
	rerr = parseMessages(body, &c)
	c.Op = methodOp(c.Method)
	c.Era = requestEra(&c) // also for a refusal's metrics and span
	if rerr != nil {
		return c, rerr
	}
	if c.Era == eraModern {
		// Checked before anything routes on these headers
		// (streamable-http.mdx, "Server Validation").
		if rerr := validateModern(h, &c, c.Params); rerr != nil {
			return c, rerr
		}
	}
	return c, nil
}

// validSessionID reports whether id is 1..256 visible ASCII characters
// (0x21–0x7E), as MCP requires of session ids.
func validSessionID(id string) bool {
	if len(id) == 0 || len(id) > maxSessionIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// readBody reads a POST body of at most maxBody bytes. An announced
// Content-Length over the limit is refused before a byte is read; below it,
// the announcement only sizes the first buffer (at most bodyChunk): the
// buffer grows with the bytes that actually arrive, each growth reserved
// from budget first. On success the body's whole capacity stays reserved
// for the caller to release; on failure nothing does.
func readBody(r *http.Request, maxBody int64, budget *byteBudget) ([]byte, *requestError) {
	if r.ContentLength > maxBody {
		return nil, errBodyTooLarge
	}
	// limit is the most the buffer may need: the announced length, or one
	// byte over the limit to tell "exactly the limit" from "over it".
	limit, first := r.ContentLength, int64(bodyChunk)
	if limit < 0 {
		limit, first = maxBody+1, bodyChunkUnknown
	}
	first = min(first, limit)
	if !budget.reserve(first) {
		return nil, errBodyBudget
	}
	buf := make([]byte, 0, first)
	for {
		if len(buf) == cap(buf) {
			if int64(cap(buf)) >= limit {
				// Full at the announced length (or past the limit): one
				// more byte would be a body longer than announced, which
				// Go's server already refuses, or one over the limit.
				if r.ContentLength < 0 {
					budget.release(int64(cap(buf)))
					return nil, errBodyTooLarge
				}
				break
			}
			grown := min(2*int64(cap(buf)), limit)
			if !budget.reserve(grown - int64(cap(buf))) {
				budget.release(int64(cap(buf)))
				return nil, errBodyBudget
			}
			buf = append(make([]byte, 0, grown), buf...)
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			budget.release(int64(cap(buf)))
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return nil, errBodyTimeout
			}
			return nil, errReadBody
		}
	}
	if r.ContentLength >= 0 && int64(len(buf)) < r.ContentLength {
		// Go's server reports a short body as io.ErrUnexpectedEOF; a body
		// reader that does not is refused the same way.
		budget.release(int64(cap(buf)))
		return nil, errReadBody
	}
	return buf, nil
}

// parseMessages fills c.Kind, c.Method, c.ID, c.Params and c.Batch from a
// POST body, in one pass that also checks the body is JSON: invalid JSON
// anywhere in it is errNotJSON, whatever came before.
func parseMessages(body []byte, c *classification) *requestError {
	i := skipSpace(body, 0)
	if i == len(body) {
		return errEmptyBody
	}
	if body[i] == '[' {
		return parseBatch(body, i, c)
	}
	var m wireMessage
	end, res := scanMessage(body, i, 0, &m)
	if res == scanInvalid || skipSpace(body, end) != len(body) {
		return errNotJSON
	}
	if rerr := decodeMessage(body, &m, res); rerr != nil {
		return rerr
	}
	kind, rerr := messageKind(&m)
	if rerr != nil {
		return rerr
	}
	c.Kind = kind
	c.Method = m.Method
	c.Params = m.Params
	if kind == kindRequest || kind == kindInitialize {
		c.ID = m.ID
	}
	return nil
}

// parseBatch is parseMessages for the array at body[i]. Its members are
// classified as they are scanned, up to the first refused one; the rest
// are only validated. The batch folds into a copy of c, kept only once the
// whole body proved to be JSON, so that invalid JSON leaves c as it was.
func parseBatch(body []byte, i int, c *classification) *requestError {
	bc := *c
	var batch batchKind
	batch.start(&bc)
	var rerr *requestError
	i = skipSpace(body, i+1)
	empty := i < len(body) && body[i] == ']'
	for !empty {
		var m wireMessage
		end, res := scanMessage(body, i, 1, &m)
		if res == scanInvalid {
			return errNotJSON
		}
		if rerr == nil {
			if rerr = decodeMessage(body[i:end], &m, res); rerr == nil {
				rerr = batch.add(&bc, &m)
			}
		}
		i = skipSpace(body, end)
		if i >= len(body) {
			return errNotJSON
		}
		if body[i] == ']' {
			break
		}
		if body[i] != ',' {
			return errNotJSON
		}
		i = skipSpace(body, i+1)
	}
	if skipSpace(body, i+1) != len(body) {
		return errNotJSON
	}
	*c = bc
	switch {
	case rerr != nil:
		return rerr
	case empty:
		return errEmptyBatch
	}
	batch.finish(c)
	return nil
}

// batchKind classifies a batch as a whole: initialize anywhere makes it a
// new session; otherwise any request makes it a request; otherwise it is
// notifications and/or responses, both answered 202 by the server.
// Callers pass the classification to each step rather than keep a pointer
// to it here, so that it stays on their stack.
type batchKind struct {
	sawResponse, sawNotification bool
}

func (b *batchKind) start(c *classification) {
	c.Batch, c.Kind = true, kindNotification
}

func (b *batchKind) add(c *classification, m *wireMessage) *requestError {
	kind, rerr := messageKind(m)
	if rerr != nil {
		return rerr
	}
	switch kind {
	case kindInitialize:
		c.Kind, c.Method = kindInitialize, "initialize"
	case kindRequest:
		if c.Kind != kindInitialize {
			c.Kind = kindRequest
			if c.Method == "" {
				c.Method = m.Method
			}
		}
	case kindResponse:
		b.sawResponse = true
	case kindNotification:
		b.sawNotification = true
		if c.Method == "" && c.Kind == kindNotification {
			c.Method = m.Method
		}
	}
	return nil
}

func (b *batchKind) finish(c *classification) {
	if c.Kind == kindNotification && b.sawResponse && !b.sawNotification {
		c.Kind = kindResponse
	}
}

// decodeMessage finishes reading the message b (well formed) that
// scanMessage read into m with outcome res.
func decodeMessage(b []byte, m *wireMessage, res scanOutcome) *requestError {
	switch res {
	case scanFallback:
		var rerr *requestError
		*m, rerr = decodeWithJSON(b)
		return rerr
	case scanNotMessage:
		return errNotJSONRPC
	}
	return nil
}

// jsonMessage is wireMessage as encoding/json decodes it, for the messages
// the scanner leaves to encoding/json.
type jsonMessage struct {
	JSONRPC string          `json:"jsonrpc"`
	Method  *string         `json:"method"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result"`
	Error   json.RawMessage `json:"error"`
	Params  json.RawMessage `json:"params"`
}

func decodeWithJSON(b []byte) (wireMessage, *requestError) {
	var j jsonMessage
	if err := json.Unmarshal(b, &j); err != nil {
		return wireMessage{}, jsonError(err)
	}
	m := wireMessage{JSONRPC: j.JSONRPC, ID: j.ID, Result: j.Result, Error: j.Error, Params: j.Params}
	if j.Method != nil {
		m.Method, m.HasMethod = *j.Method, true
	}
	return m, nil
}

func jsonError(err error) *requestError {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		// Valid JSON of the wrong shape (e.g. "method": 5).
		return errNotJSONRPC
	}
	return errNotJSON
}

// messageKind applies JSON-RPC 2.0's rules: a method makes a request (with
// an id) or a notification (without); no method but an id with a result or
// an error makes a response.
func messageKind(m *wireMessage) (kind, *requestError) {
	if m.JSONRPC != "2.0" {
		return 0, errNotJSONRPC
	}
	hasID := len(m.ID) > 0 && !bytes.Equal(m.ID, []byte("null"))
	if m.HasMethod {
		if m.Method == "" {
			return 0, errNotJSONRPC
		}
		if !hasID {
			return kindNotification, nil
		}
		if !validID(m.ID) {
			return 0, errNotJSONRPC
		}
		if m.Method == "initialize" {
			return kindInitialize, nil
		}
		return kindRequest, nil
	}
	if (m.Result != nil) != (m.Error != nil) && len(m.ID) > 0 {
		return kindResponse, nil
	}
	return 0, errNotJSONRPC
}

// validID accepts the id types JSON-RPC allows for requests: strings and
// numbers that are finite as float64s (id is well-formed JSON).
func validID(id json.RawMessage) bool {
	switch id[0] {
	case '"':
		return true
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		// Without an exponent, fewer than 309 digits stay below
		// math.MaxFloat64 (about 1.8e308): ParseFloat, which refuses a
		// well-formed number only when it is out of range, need not run
		// for the ids clients send.
		if len(id) < 309 && !hasExponent(id) {
			return true
		}
		_, err := strconv.ParseFloat(string(id), 64)
		return err == nil
	}
	return false
}

func hasExponent(num []byte) bool {
	for _, c := range num {
		if c == 'e' || c == 'E' {
			return true
		}
	}
	return false
}

// readOnlyMethod reports an MCP request method that only reads the
// server's state, so that sending it twice does what sending it once does
// (the retry contract, retry.go): the queries of the specification, each
// defined as a read with no effect of its own.
//
//	ping                      basic/utilities/ping ("a simple request/response")
//	tools/list                server/tools ("Listing Tools")
//	resources/list, resources/templates/list, resources/read
//	                          server/resources ("Listing", "Resource Templates", "Reading")
//	prompts/list, prompts/get server/prompts ("Listing Prompts", "Getting a Prompt")
//	completion/complete       server/utilities/completion (suggestions for an argument)
//	server/discover           2026-07-28 basic/lifecycle (SEP-2575: capabilities, no state)
//	tasks/get, tasks/list, tasks/result
//	                          the tasks extension (SEP-2663): a task's state and result
//
// Everything else may act: tools/call above all, initialize (a session),
// subscriptions (resources/subscribe, subscriptions/listen), logging/setLevel,
// tasks/cancel and tasks/update, and every notification and response.
func readOnlyMethod(method string) bool {
	switch method {
	case "ping", "tools/list", "resources/list", "resources/templates/list", "resources/read",
		"prompts/list", "prompts/get", "completion/complete", "server/discover",
		"tasks/get", "tasks/list", "tasks/result":
		return true
	}
	return false
}

// idempotent reports a request that the retry contract lets tether send
// again after it may have reached a backend, by what it is: a safe HTTP
// method (a GET stream, HEAD, OPTIONS) or a single JSON-RPC request of a
// read-only method. A batch is not, whatever its members: a 2025-03-26
// feature, rare, and sent once. (A request the client marks with an
// Idempotency-Key is idempotent too, as net/http reads that field: see
// hasIdempotencyKey, asked of the header as it is sent.)
func idempotent(method string, c *classification) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return c.Kind == kindRequest && !c.Batch && readOnlyMethod(c.Method)
}

// hasIdempotencyKey reports a header that marks its request idempotent,
// as net/http's transport reads it (Request.isReplayable).
func hasIdempotencyKey(h h1.Fields) bool {
	for _, f := range h {
		if f.Name == "Idempotency-Key" || f.Name == "X-Idempotency-Key" {
			return true
		}
	}
	return false
}
