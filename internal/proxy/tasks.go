package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/tether-mcp/tether/internal/session"
)

// Tasks (extension io.modelcontextprotocol/tasks, SEP-2663): a server may
// answer a tools/call with a CreateTaskResult instead of its result,
//
//	{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"786512e2-…",
//	  "status":"working","createdAt":"…","lastUpdatedAt":"…","ttlMs":60000,"pollIntervalMs":5000}}
//
// either as the POST's JSON body or as the response event of its SSE
// stream. The task then lives on that backend only: tasks/get, tasks/update
// and tasks/cancel name it in Mcp-Name, and tether routes them by the
// record it stores when it sees the creation (session.TaskRecord).
//
// The SEP requires a server not to answer before a tasks/get for the task
// would resolve, so a client may poll, through any replica, the moment it
// reads the result: tether must have stored the record before the client
// can read it. watchTasks therefore reports the task from inside the Read
// that returns the bytes completing it, before relay writes them.

// taskCreation is what tether keeps of a CreateTaskResult.
type taskCreation struct {
	ID string
	// TTL is the result's ttlMs, with session.TaskRecord.TTL's meaning: 0
	// when absent or not a valid duration (the store's default applies),
	// session.TaskTTLUnlimited when null, capped at session.MaxTaskTTL.
	TTL time.Duration
}

// maxTaskMessage bounds the bytes watchTasks keeps of one JSON-RPC message
// (a JSON body, or one SSE event's data). A CreateTaskResult is a few
// hundred bytes; a larger message is an ordinary result (or a notification)
// and is not kept. 1 MiB leaves room for a task created already completed
// with its result inline.
const maxTaskMessage = 1 << 20

// parseTaskResponse reads one JSON-RPC message. response reports a
// response (a result or an error, no method): on a POST's SSE stream it
// is the last message that matters. ok reports a result of the
// CreateTaskResult shape: resultType "task" and a non-empty string taskId.
func parseTaskResponse(b []byte) (tc taskCreation, response, ok bool) {
	var m wireMessage
	end, res := scanMessage(b, skipSpace(b, 0), 0, &m)
	if res == scanInvalid || skipSpace(b, end) != len(b) {
		return tc, false, false
	}
	isObject := res == scanOK
	if res == scanFallback {
		// Escaped or non-ASCII member names: rare enough for encoding/json.
		var d struct {
			Method *string         `json:"method"`
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		if json.Unmarshal(b, &d) != nil {
			return tc, false, false
		}
		m = wireMessage{HasMethod: d.Method != nil, Result: d.Result, Error: d.Error}
		isObject = true
	}
	if !isObject || m.HasMethod || (m.Result == nil && m.Error == nil) {
		return tc, false, false
	}
	tc, ok = scanTaskResult(m.Result)
	return tc, true, ok
}

// scanTaskResult reads a result object (well-formed JSON) of the
// CreateTaskResult shape. Member names match as encoding/json matches
// them (case-insensitively, the last duplicate winning).
func scanTaskResult(b []byte) (tc taskCreation, ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return tc, false
	}
	var isTask bool
	for i++; ; {
		i = skipSpace(b, i)
		if b[i] == '}' {
			break
		}
		if b[i] == ',' {
			i = skipSpace(b, i+1)
		}
		keyEnd := skipString(b, i)
		key := b[i+1 : keyEnd-1]
		if needsDecoding(key) {
			return scanTaskResultSlow(b)
		}
		i = skipSpace(b, keyEnd)
		i = skipSpace(b, i+1) // ':'
		valEnd := skipValue(b, i)
		val := b[i:valEnd]
		i = valEnd
		switch {
		case bytes.EqualFold(key, []byte("resultType")):
			isTask = bytes.Equal(val, []byte(`"task"`)) // without allocating
			if !isTask && val[0] == '"' && needsDecoding(val) {
				s, _ := stringValue(val)
				isTask = s == "task"
			}
		case bytes.EqualFold(key, []byte("taskId")):
			s, isString := stringValue(val)
			if !isString {
				s = ""
			}
			tc.ID = s
		case bytes.EqualFold(key, []byte("ttlMs")):
			tc.TTL = taskTTL(val)
		}
	}
	if !isTask || tc.ID == "" {
		return taskCreation{}, false
	}
	return tc, true
}

// scanTaskResultSlow is scanTaskResult by encoding/json.
func scanTaskResultSlow(b []byte) (tc taskCreation, ok bool) {
	var d struct {
		ResultType json.RawMessage `json:"resultType"`
		TaskID     json.RawMessage `json:"taskId"`
		TTLMs      json.RawMessage `json:"ttlMs"`
	}
	if json.Unmarshal(b, &d) != nil {
		return tc, false
	}
	var rt, id string
	if json.Unmarshal(d.ResultType, &rt) != nil || rt != "task" || json.Unmarshal(d.TaskID, &id) != nil || id == "" {
		return tc, false
	}
	tc.ID = id
	if d.TTLMs != nil {
		tc.TTL = taskTTL(d.TTLMs)
	}
	return tc, true
}

// taskTTL reads a ttlMs token: integer milliseconds, or null for
// unlimited. Anything else (a string, a negative number, zero) gives 0,
// the store's default: recording a task for too long costs a record,
// dropping it early loses the task.
func taskTTL(tok []byte) time.Duration {
	if tok[0] == 'n' {
		return session.TaskTTLUnlimited
	}
	if tok[0] < '0' || tok[0] > '9' {
		return 0
	}
	maxMs := session.MaxTaskTTL.Milliseconds()
	var ms int64
	for _, c := range tok {
		if c < '0' || c > '9' { // a fraction or an exponent
			f, err := strconv.ParseFloat(string(tok), 64)
			if err != nil || math.IsNaN(f) {
				return 0
			}
			ms = int64(min(f, float64(maxMs)+1))
			break
		}
		if ms > maxMs { // past the cap: stop before overflowing
			break
		}
		ms = ms*10 + int64(c-'0')
	}
	if ms <= 0 {
		return 0
	}
	if ms > maxMs {
		return session.MaxTaskTTL
	}
	return time.Duration(ms) * time.Millisecond
}

// taskWatcher relays a response body to a task-augmented request and
// calls onTask, once, when the response creates a task (see watchTasks).
type taskWatcher struct {
	src    io.ReadCloser
	sse    bool
	onTask func(taskCreation)
	done   bool      // the response was seen, or cannot be a task's
	buf    *taskBufs // pooled; nil once done

	// JSON: where the top-level object ends.
	started, inString, escaped bool
	depth                      int

	// SSE: the state of the line being read (in buf.line) and of the
	// event (its data in buf.msg).
	lineLong  bool // the line outgrew maxTaskMessage: only its start is kept
	eventLong bool // the event's data outgrew maxTaskMessage
	hasData   bool
}

// taskBufs are a watcher's buffers: msg holds the JSON body so far, or the
// SSE event's data; line the SSE line being read.
type taskBufs struct{ msg, line []byte }

var taskBuffers = sync.Pool{New: func() any { return &taskBufs{msg: make([]byte, 0, 1024)} }}

// watchTasks wraps body, the response to a tools/call that may create a
// task (its client declared the tasks extension), sse telling an event
// stream from a JSON body. onTask is called with the task the response
// creates, if any, from within the Read that returns the last byte of the
// message carrying it, before those bytes reach the caller; it is called
// at most once and the body is relayed unchanged. The watcher keeps at
// most maxTaskMessage bytes, and nothing once the response has been seen.
func watchTasks(body io.ReadCloser, sse bool, onTask func(taskCreation)) io.ReadCloser {
	return &taskWatcher{src: body, sse: sse, onTask: onTask, buf: taskBuffers.Get().(*taskBufs)}
}

func (w *taskWatcher) Read(p []byte) (int, error) {
	n, err := w.src.Read(p)
	if n > 0 && !w.done {
		if w.sse {
			w.feedSSE(p[:n])
		} else {
			w.feedJSON(p[:n])
		}
		if w.done {
			w.release()
		}
	}
	return n, err
}

func (w *taskWatcher) Close() error {
	w.done = true
	w.release()
	return w.src.Close()
}

func (w *taskWatcher) release() {
	if b := w.buf; b != nil {
		w.buf = nil
		if cap(b.msg)+cap(b.line) <= 64<<10 { // do not pool the rare large buffers
			b.msg, b.line = b.msg[:0], b.line[:0]
			taskBuffers.Put(b)
		}
	}
}

// feedJSON keeps the body until its top-level value ends, then parses it.
func (w *taskWatcher) feedJSON(p []byte) {
	end := -1
	for i, c := range p {
		switch {
		case !w.started:
			switch c {
			case ' ', '\t', '\r', '\n':
				continue
			case '{':
				w.started, w.depth = true, 1
			default: // not one object (a batch, or not JSON): no task
				w.done = true
				return
			}
		case w.inString:
			switch {
			case w.escaped:
				w.escaped = false
			case c == '\\':
				w.escaped = true
			case c == '"':
				w.inString = false
			}
		case c == '"':
			w.inString = true
		case c == '{' || c == '[':
			w.depth++
		case c == '}' || c == ']':
			w.depth--
		}
		if w.started && w.depth == 0 {
			end = i + 1
			break
		}
	}
	if end < 0 {
		end = len(p)
	}
	if len(w.buf.msg)+end > maxTaskMessage {
		w.done = true
		return
	}
	w.buf.msg = append(w.buf.msg, p[:end]...)
	if w.started && w.depth == 0 {
		w.done = true
		if tc, _, ok := parseTaskResponse(w.buf.msg); ok {
			w.onTask(tc)
		}
	}
}

// feedSSE reads p's lines: the data lines of each event are joined, and at
// the blank line that ends the event its data is parsed as a message.
// Lines end in LF or CRLF (a lone CR, which no MCP server sends, is not
// taken for a line end).
func (w *taskWatcher) feedSSE(p []byte) {
	for len(p) > 0 && !w.done {
		nl := bytes.IndexByte(p, '\n')
		part := p
		if nl >= 0 {
			part = p[:nl]
			p = p[nl+1:]
		} else {
			p = nil
		}
		if !w.lineLong {
			if len(w.buf.line)+len(part) > maxTaskMessage {
				// Keep the start, which names the line's field.
				w.lineLong = true
				w.buf.line = append(w.buf.line, part[:min(len(part), 16)]...)
			} else {
				w.buf.line = append(w.buf.line, part...)
			}
		}
		if nl < 0 {
			return
		}
		w.endLine()
	}
}

// endLine handles the complete line in buf.line.
func (w *taskWatcher) endLine() {
	line := bytes.TrimSuffix(w.buf.line, []byte("\r"))
	long := w.lineLong
	w.buf.line, w.lineLong = w.buf.line[:0], false
	if len(line) == 0 && !long {
		w.endEvent()
		return
	}
	field, value, hasColon := bytes.Cut(line, []byte(":"))
	if !bytes.Equal(field, []byte("data")) {
		return // a comment, an id, an event name, a retry: not data
	}
	if long {
		w.eventLong = true
		return
	}
	if hasColon {
		value = bytes.TrimPrefix(value, []byte(" "))
	}
	if w.eventLong {
		return
	}
	if w.hasData {
		if len(w.buf.msg)+1+len(value) > maxTaskMessage {
			w.eventLong = true
			return
		}
		w.buf.msg = append(w.buf.msg, '\n')
	} else if len(value) > maxTaskMessage {
		w.eventLong = true
		return
	}
	w.buf.msg = append(w.buf.msg, value...)
	w.hasData = true
}

// endEvent parses the event's data as a JSON-RPC message.
func (w *taskWatcher) endEvent() {
	data, long := w.buf.msg, w.eventLong
	w.buf.msg, w.hasData, w.eventLong = (w.buf.msg)[:0], false, false
	if long || len(data) == 0 {
		// An event too large to be a task's creation; it might have been the
		// response, so keep watching: a later event cannot hurt.
		return
	}
	tc, response, ok := parseTaskResponse(data)
	if ok {
		w.onTask(tc)
	}
	if response {
		w.done = true
	}
}
