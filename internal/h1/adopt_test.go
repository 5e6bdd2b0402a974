package h1

import (
	"bufio"
	"io"
	"net/http"
	"reflect"
	"testing"
)

// adopt hands f to w as a proxy does: adopted by h1's writer, added to
// any other's header (each value after what is there).
func adopt(w http.ResponseWriter, f Fields) bool {
	if a, ok := w.(interface{ AdoptFields(Fields) bool }); ok && a.AdoptFields(f) {
		return true
	}
	dst := w.Header()
	for _, fl := range f {
		dst[fl.Name] = append(dst[fl.Name], fl.Value)
	}
	return false
}

// Adopted fields reach the client as the same fields added to net/http's
// header would: merged with what the handler set before and after, the
// framing fields the writer's, its trailers announced and sent.
func TestAdoptFieldsAsNetHTTP(t *testing.T) {
	get := "GET /x HTTP/1.1\r\nHost: x\r\n\r\n"
	for _, tc := range []struct {
		name string
		h    http.HandlerFunc
	}{
		{"adopted", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, Fields{{"Content-Type", "application/json"}, {"X-Multi", "a"}, {"X-Other", "o"}, {"X-Multi", "b"}})
			io.WriteString(w, `{}`)
		}},
		{"merged", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Multi", "first")
			w.Header().Set("X-Own", "1")
			adopt(w, Fields{{"X-Multi", "a"}, {"Content-Length", "2"}, {"X-Multi", "b"}})
			w.Header().Set("X-After", "2")
			w.Header().Add("X-Multi", "last")
			io.WriteString(w, `{}`)
		}},
		{"length", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, Fields{{"Content-Length", "3"}, {"Content-Type", "text/plain"}})
			io.WriteString(w, "abc")
		}},
		{"length of a 204", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, Fields{{"Content-Length", "3"}, {"X-A", "1"}})
			w.WriteHeader(http.StatusNoContent)
		}},
		{"framing", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, Fields{{"Transfer-Encoding", "chunked"}, {"Date", "Mon, 30 Nov 2026 22:04:35 GMT"}, {"Content-Type", "text/event-stream"}})
			io.WriteString(w, "data: 1\n\n")
			w.(http.Flusher).Flush()
			io.WriteString(w, "data: 2\n\n")
		}},
		{"connection close", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, Fields{{"X-A", "1"}, {"Connection", "close"}})
			io.WriteString(w, "bye")
		}},
		{"odd fields", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, Fields{{"Bad Name", "v"}, {"X-Break", "a\r\nX-Injected: b"}, {http.TrailerPrefix + "X-T", "t"}, {"X-Empty", ""}})
			io.WriteString(w, "x")
		}},
		{"trailers", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, Fields{{"Trailer", "X-T"}, {"Content-Type", "text/plain"}, {"Trailer", "X-V"}, {"X-V", "in the head"}})
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, "a")
			w.Header().Set("X-T", "v")
			w.Header().Set(http.TrailerPrefix+"X-U", "w")
		}},
		{"trailers of the fields", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, Fields{{"Trailer", "X-T"}, {"X-T", "from the head"}})
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, "a")
		}},
		{"trailer announced after", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, Fields{{"Content-Type", "text/plain"}})
			w.Header().Add("Trailer", "X-T")
			io.WriteString(w, "a")
			w.Header().Set("X-T", "v")
		}},
		{"twice", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, Fields{{"X-A", "1"}, {"X-B", "1"}})
			adopt(w, Fields{{"X-A", "2"}})
			io.WriteString(w, "a")
		}},
		{"after the status", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusAccepted)
			adopt(w, Fields{{"X-Late", "1"}})
			io.WriteString(w, "a")
		}},
		{"status", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, Fields{{"Content-Type", "text/event-stream"}})
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "data: 1\n\n")
		}},
		{"interim", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, Fields{{"Link", "</x>"}})
			w.WriteHeader(http.StatusEarlyHints)
			io.WriteString(w, "a")
		}},
		{"none", func(w http.ResponseWriter, r *http.Request) {
			adopt(w, nil)
			io.WriteString(w, "a")
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

// AdoptFields takes fields only before the head is set; Header then holds
// them, after what the handler set, whose value lists are left as they
// were; and what it adopted is not the next request's on the connection.
func TestAdoptFields(t *testing.T) {
	type result struct {
		before, after bool
		header        http.Header
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
		res.before = adopt(w, Fields{{"X-Multi", "adopted"}, {"X-Adopted", "1"}})
		res.header = w.Header().Clone()
		res.shared = own[:2][1]
		w.WriteHeader(http.StatusOK)
		res.after = adopt(w, Fields{{"X-Late", "1"}})
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
		t.Errorf("AdoptFields before the status: %v, after it: %v; want true, false", res.before, res.after)
	}
	if want := (http.Header{"X-Multi": {"own", "adopted"}, "X-Adopted": {"1"}}); !reflect.DeepEqual(res.header, want) {
		t.Errorf("Header after AdoptFields: %v, want %v", res.header, want)
	}
	if res.shared != "" {
		t.Errorf("Header wrote %q into the array of the handler's value list", res.shared)
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

// A handler that adopts fields and never asks for the header map (a
// proxy's) leaves its connection without one: an open stream's connection
// would keep it for the stream's life.
func TestAdoptedFieldsMakeNoHeaderMap(t *testing.T) {
	addr, s := startH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !adopt(w, Fields{{"Content-Type", "text/plain"}, {"X-Adopted", "1"}}) {
			panic("h1's writer did not adopt the fields")
		}
		io.WriteString(w, "hello")
	}))
	c := dial(t, addr)
	br := bufio.NewReader(c)
	for range 2 {
		if _, err := io.WriteString(c, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Header.Get("X-Adopted") != "1" {
			t.Fatalf("header %v", resp.Header)
		}
	}
	if idle := idleConn(t, s); idle.header != nil {
		t.Errorf("the connection made a header map: %v", idle.header)
	}
}
