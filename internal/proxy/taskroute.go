package proxy

import (
	"context"
	"errors"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/tether-mcp/tether/internal/balancer"
	"github.com/tether-mcp/tether/internal/h1"
	"github.com/tether-mcp/tether/internal/session"
)

// Task routing (extension io.modelcontextprotocol/tasks, SEP-2663). A
// task lives on the backend that created it, in that process's memory;
// tasks/get, tasks/update and tasks/cancel name it in Mcp-Name so that an
// intermediary can send them there ("typically required for
// correctness"). tether does two things:
//
//   - record: when a modern request that may create a task (tools/call,
//     from a client declaring the extension) is answered with a
//     CreateTaskResult, the task id → backend record is stored (memory or
//     Redis) before the client can read the id (watchTasks), so that every
//     replica can route the task the moment the client polls.
//   - route: a modern tasks/* request goes to its record's backend, and
//     nowhere else. A task cannot be replayed: when its backend is gone
//     (left the endpoint set, ejected, refused the connection) the task is
//     lost, and tether answers the error the SEP specifies for an unknown
//     task itself, rather than guess a backend that has never heard of it.

// Extension names of SEP-2663 ("Capability Negotiation"): a client declares
// the extension per request in
// params._meta["io.modelcontextprotocol/clientCapabilities"].extensions.
const (
	tasksExtension         = "io.modelcontextprotocol/tasks"
	metaClientCapabilities = "io.modelcontextprotocol/clientCapabilities"
)

// codeInvalidParams is JSON-RPC Invalid params, which SEP-2663 ("Error
// Handling", "Protocol Errors") specifies for an invalid or nonexistent
// taskId: MUST for tasks/get, SHOULD for tasks/update and tasks/cancel.
const codeInvalidParams = -32602

// unknownTaskMessage is the SEP's own example message for the error.
const unknownTaskMessage = "Failed to retrieve task: Task not found"

// taskRecordTimeout bounds the store write of a task record. It runs inside
// the relay's read of the creation result (the client must not see the id
// before the record exists), so a slow store delays that answer by at most
// this much, never indefinitely.
const taskRecordTimeout = 2 * time.Second

// Results of tether_task_routes_total.
const (
	taskRouted            = "routed"
	taskUnknown           = "unknown"
	taskBackendGone       = "backend_gone"
	taskPrincipalMismatch = "principal_mismatch"
	taskUnavailable       = "unavailable"
)

// taskAugmentable reports whether a request of method may be answered with
// a CreateTaskResult. SEP-2663 ("Supported Methods") lists tools/call only,
// and asks implementations to be ready for more.
func taskAugmentable(method string) bool { return method == "tools/call" }

// declaresTasks reports whether a request's params declare the tasks
// extension. A server must not create a task for a request that does not
// (SEP-2663), so only declaring requests are watched. params whose
// capabilities tether cannot read unambiguously (a member named twice) are
// watched too: a watch costs little, a missed record loses the task.
func declaresTasks(params []byte) bool {
	v := params
	for _, key := range [...]string{"_meta", metaClientCapabilities, "extensions", tasksExtension} {
		next, rerr := objectMember(v, key)
		if rerr != nil {
			return true
		}
		if next == nil {
			return false
		}
		v = next
	}
	return true
}

// watchTaskCreation is the record step's part for tasks: it wraps the
// answer to a request that may create a task so that the task's record is
// stored before its id reaches the client.
func (p *Proxy) watchTaskCreation(r *http.Request, x *exchange, out sentRequest, resp *h1.Answer) {
	if p.tasks == nil || x.class.Era != eraModern || x.class.Kind != kindRequest ||
		!taskAugmentable(x.class.Method) || resp.StatusCode != http.StatusOK || !declaresTasks(x.class.Params) {
		return
	}
	ep := x.ep
	principal := p.principal.digest(out.header())
	ctx := r.Context()
	resp.Body = watchTasks(resp.Body, isEventStream(resp.Header.Get("Content-Type")), func(tc taskCreation) {
		wctx, cancel := context.WithTimeout(ctx, taskRecordTimeout)
		defer cancel()
		err := p.tasks.PutTask(wctx, session.TaskRecord{
			TaskID:     tc.ID,
			BackendID:  ep.ID,
			BackendURL: ep.String(),
			Principal:  principal,
			TTL:        tc.TTL,
		})
		switch {
		case err == nil:
			p.metrics.TaskRecord("stored")
		case errors.Is(err, session.ErrExists):
			// Two backends minted one id (or two principals reached one
			// backend with it): the live record keeps it, and this task's
			// requests will go to the other backend's task or be refused.
			// Unguessable ids make this a misbehaving backend.
			p.metrics.TaskRecord("conflict")
			p.log.Warn("task id already recorded for another backend or principal", "task", session.HashID(tc.ID), "backend", ep.String())
		default:
			// The answer is relayed anyway. Withholding it would not undo
			// the task (it runs on the backend regardless), and the client
			// would likely call the tool again, running the work twice.
			// Without a record the task's requests get the unknown-task
			// error: the client learns it lost the task on its first poll.
			p.metrics.TaskRecord("failed")
			p.log.Error("task record not written; the task cannot be routed", "task", session.HashID(tc.ID), "backend", ep.String(), "err", err)
		}
	})
}

// routeTask routes a modern tasks/get, tasks/update or tasks/cancel to its
// task's backend, or answers the client itself. It reports false when it
// has answered.
func (p *Proxy) routeTask(ctx context.Context, w http.ResponseWriter, r *http.Request, x *exchange, span trace.Span) bool {
	id := x.class.Name
	x.taskID = id
	rec, err := p.tasks.GetTask(ctx, id)
	result := taskRouted
	var ep *balancer.Endpoint
	switch {
	case errors.Is(err, session.ErrNotFound):
		x.store = "miss"
		result = taskUnknown
	case err != nil:
		x.store = "error"
		result = taskUnavailable
	default:
		x.store = "hit"
		if !p.principal.matches(rec.Principal, x.header) {
			// Someone else's task: the same answer as no task at all, so a
			// guessed or leaked id tells its holder nothing.
			result = taskPrincipalMismatch
		} else if e, ok := p.bal.Lookup(rec.BackendID); !ok || e.Ejected() {
			result = taskBackendGone
		} else {
			ep = e
		}
	}
	p.metrics.TaskRoute(result)
	if span != nil {
		// The server span carries the task as mcp.task.id (hashed).
		span.SetAttributes(attribute.String("tether.task.result", result))
	}
	switch result {
	case taskRouted:
		x.ep = ep
		return true
	case taskUnavailable:
		p.log.Warn("task store lookup failed", "task", session.HashID(id), "err", err)
		w.Header().Set("Retry-After", "1")
		writeJSONRPCError(w, http.StatusServiceUnavailable, x.class.ID, codeUnavailable, "session store unavailable")
		return false
	case taskBackendGone:
		p.log.Debug("task's backend is gone; the task is lost", "task", session.HashID(id), "backend", rec.BackendURL)
	}
	writeUnknownTask(w, x)
	return false
}

// taskBackendFailed answers a task request whose backend refused the
// connection (and is now ejected): the task cannot be sent anywhere else.
func (p *Proxy) taskBackendFailed(w http.ResponseWriter, x *exchange, failed *balancer.Endpoint) {
	p.metrics.TaskRoute(taskBackendGone)
	p.log.Debug("task's backend refused the connection; the task is lost", "task", session.HashID(x.taskID), "backend", failed.String())
	writeUnknownTask(w, x)
}

// writeUnknownTask answers SEP-2663's unknown-task error: a JSON-RPC error
// response, which the Streamable HTTP transport sends with 200 like any
// other response to a request.
func writeUnknownTask(w http.ResponseWriter, x *exchange) {
	writeJSONRPCError(w, http.StatusOK, x.class.ID, codeInvalidParams, unknownTaskMessage)
}
