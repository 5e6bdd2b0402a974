package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// writeJSONRPCError answers with an HTTP status and a JSON-RPC 2.0 error
// body. id is the JSON-RPC id of the request being refused; nil writes
// "id": null, which JSON-RPC uses when the error is not about one request.
func writeJSONRPCError(w http.ResponseWriter, status int, id json.RawMessage, code int, message string) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	msg, _ := json.Marshal(message) // a string always marshals
	body := make([]byte, 0, 64+len(id)+len(msg))
	body = append(body, `{"jsonrpc":"2.0","id":`...)
	body = append(body, id...)
	body = append(body, `,"error":{"code":`...)
	body = strconv.AppendInt(body, int64(code), 10)
	body = append(body, `,"message":`...)
	body = append(body, msg...)
	body = append(body, "}}\n"...)

	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(body)
}

func writeRequestError(w http.ResponseWriter, id json.RawMessage, e *requestError) {
	writeJSONRPCError(w, e.status, id, e.code, e.message)
}

// errInitTooLarge refuses an initialize whose body exceeds MaxInitBody: the
// body is stored with the session for its whole life.
var errInitTooLarge = &requestError{http.StatusRequestEntityTooLarge, codeInvalidRequest, "initialize body too large"}

// errInitAddressTooLong refuses an initialize whose Host or path the
// session record could not keep (session.MaxAddressLen).
var errInitAddressTooLong = &requestError{http.StatusBadRequest, codeInvalidRequest, "initialize Host or path longer than 8 KiB"}
