package h1

import (
	"bufio"
	"io"
	"net/http"
	"reflect"
	"testing"
)

// adopt hands h to w as a proxy does: adopted by h1's writer, copied into
// any other's header (each value list after what is there).
func adopt(w http.ResponseWriter, h http.Header) bool {
	if a, ok := w.(interface{ AdoptHeader(http.Header) bool }); ok && a.AdoptHeader(h) {
		return true
	}
	dst := w.Header()
	for k, vv := range h {
		dst[k] = append(dst[k], vv...)
	}
	return false
}

// A header map adopted by the fast path's writer reaches the client as the
// same header copied into net/http's would: merged with what the handler
// set before, its trailers announced and sent.
func TestAdoptHeaderAsNetHTTP(t *testing.T) {
	get := "GET /x HTTP/1.1\r\nHost: x\r\n\r\n"
	for _, tc := range []struct {
		name string
		h    http.HandlerFunc
	}{
		{"adopted", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}})
			io.WriteString(w, `{}`)
		}},
		{"merged", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Multi", "first")
			w.Header().Set("X-Own", "1")
			adopt(w, http.Header{"X-Multi": {"a", "b"}, "Content-Length": {"2"}})
			w.Header().Set("X-After", "2")
			io.WriteString(w, `{}`)
		}},
		{"trailers", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, http.Header{"Trailer": {"X-T"}, "Content-Type": {"text/plain"}})
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, "a")
			w.Header().Set("X-T", "v")
			w.Header().Set(http.TrailerPrefix+"X-U", "w")
		}},
		{"after the status", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusAccepted)
			adopt(w, http.Header{"X-Late": {"1"}})
			io.WriteString(w, "a")
		}},
		{"status", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, http.Header{"Content-Type": {"text/event-stream"}})
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "data: 1\n\n")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := again(tc.h)
			fast, _ := startH1(t, h)
			std := startStd(t, h)
			got, want := send(t, fast, get), send(t, std, get)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("fast path:\n%s\nnet/http:\n%s", got, want)
			}
		})
	}
}

// AdoptHeader takes a map only before the head is set; it leaves the value
// lists the handler set as they were; and what it adopted is not the next
// request's on the connection.
func TestAdoptHeader(t *testing.T) {
	type result struct {
		before, after bool
		shared        string
	}
	results := make(chan result, 1)
	addr, _ := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/next" {
			io.WriteString(w, "next")
			return
		}
		own := make([]string, 1, 4)
		own[0] = "own"
		w.Header()["X-Multi"] = own
		var res result
		res.before = adopt(w, http.Header{"X-Multi": {"adopted"}, "X-Adopted": {"1"}})
		res.shared = own[:2][1]
		w.WriteHeader(http.StatusOK)
		res.after = adopt(w, http.Header{"X-Late": {"1"}})
		results <- res
	}))
	c := dial(t, addr)
	br := bufio.NewReader(c)
	read := func(path string) *http.Response {
		t.Helper()
		if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	resp := read("/x")
	res := <-results
	if !res.before || res.after {
		t.Errorf("AdoptHeader before the status: %v, after it: %v; want true, false", res.before, res.after)
	}
	if res.shared != "" {
		t.Errorf("AdoptHeader wrote %q into the array of the handler's value list", res.shared)
	}
	if got := resp.Header.Values("X-Multi"); !reflect.DeepEqual(got, []string{"own", "adopted"}) {
		t.Errorf("X-Multi: %q, want the handler's value, then the adopted one", got)
	}
	if resp.Header.Get("X-Adopted") != "1" || resp.Header.Get("X-Late") != "" {
		t.Errorf("header %v: want X-Adopted and no X-Late", resp.Header)
	}
	next := read("/next")
	for _, k := range []string{"X-Multi", "X-Adopted", "X-Late"} {
		if v, ok := next.Header[k]; ok {
			t.Errorf("the next answer on the connection has %s: %q", k, v)
		}
	}
}
