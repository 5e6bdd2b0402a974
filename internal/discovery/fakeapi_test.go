package discovery

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeAPI is a small kube-apiserver for the EndpointSlices of one
// namespace: list and watch as the real one answers them (JSON, resource
// versions, label selectors, bookmarks, 410 for a compacted version), plus
// knobs to hold, fail or garble answers.
type fakeAPI struct {
	t   *testing.T
	srv *httptest.Server

	mu        sync.Mutex
	rv        int
	objs      map[string]EndpointSlice // by name
	events    []fakeEvent
	compacted int           // a watch from before this version is gone (410)
	wake      chan struct{} // closed and replaced on every change to wake watches
	endGen    int           // bumped to end the open watches cleanly
	expireGen int           // bumped to end them with an ERROR 410 event
	hold      chan struct{} // when set, lists wait for it to close
	hooks     map[string][]http.HandlerFunc
	always    map[string]http.HandlerFunc
	reqs      map[string][]*http.Request
	openWatch int
}

type fakeEvent struct {
	rv  int
	typ string
	obj EndpointSlice
}

func newFakeAPI(t *testing.T, slices ...*EndpointSlice) *fakeAPI {
	f := &fakeAPI{
		t:      t,
		rv:     100,
		objs:   map[string]EndpointSlice{},
		wake:   make(chan struct{}),
		hooks:  map[string][]http.HandlerFunc{},
		always: map[string]http.HandlerFunc{},
		reqs:   map[string][]*http.Request{},
	}
	for _, s := range slices {
		f.rv++
		o := *s
		o.ResourceVersion = strconv.Itoa(f.rv)
		f.objs[o.Name] = o
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// kubeconfig writes a kubeconfig for the fake server.
func (f *fakeAPI) kubeconfig() string {
	return writeKubeconfig(f.t, f.srv.URL)
}

// client is the real client, pointed at the fake.
func (f *fakeAPI) client() *apiClient {
	f.t.Helper()
	c, err := newKubeClient(f.kubeconfig(), "tether/test", testEnv(f.t))
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	const prefix = "/apis/discovery.k8s.io/v1/namespaces/"
	rest, ok := strings.CutPrefix(r.URL.Path, prefix)
	ns, res, _ := strings.Cut(rest, "/")
	if !ok || res != "endpointslices" || r.Method != http.MethodGet {
		writeStatus(w, http.StatusNotFound, "NotFound", "the server could not find the requested resource")
		return
	}
	kind := "list"
	if r.URL.Query().Get("watch") == "1" {
		kind = "watch"
	}
	f.mu.Lock()
	f.reqs[kind] = append(f.reqs[kind], r.Clone(r.Context()))
	var hook http.HandlerFunc
	if hs := f.hooks[kind]; len(hs) > 0 {
		hook, f.hooks[kind] = hs[0], hs[1:]
	} else if h := f.always[kind]; h != nil {
		hook = h
	}
	hold := f.hold
	f.mu.Unlock()
	if hook != nil {
		hook(w, r)
		return
	}
	if ns != "mcp" {
		// The fake serves one namespace; another is empty.
		f.t.Errorf("request outside the Service's namespace: %s", r.URL)
	}
	if kind == "list" {
		if hold != nil {
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
		f.serveList(w, r)
		return
	}
	f.serveWatch(w, r)
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{
		"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "message": msg, "reason": reason, "code": code,
	})
}

// selects applies the only label selector tether sends: name=value.
func selects(selector string, s EndpointSlice) bool {
	k, v, ok := strings.Cut(selector, "=")
	return !ok || s.Labels[k] == v
}

func (f *fakeAPI) serveList(w http.ResponseWriter, r *http.Request) {
	sel := r.URL.Query().Get("labelSelector")
	f.mu.Lock()
	items := []EndpointSlice{}
	for _, s := range f.objs {
		if selects(sel, s) {
			items = append(items, s)
		}
	}
	rv := f.rv
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
		"metadata": map[string]any{"resourceVersion": strconv.Itoa(rv)},
		"items":    items,
	})
}

func (f *fakeAPI) serveWatch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sel := q.Get("labelSelector")
	from, err := strconv.Atoi(q.Get("resourceVersion"))
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "bad resourceVersion")
		return
	}
	f.mu.Lock()
	if from < f.compacted {
		f.mu.Unlock()
		writeStatus(w, http.StatusGone, "Expired", fmt.Sprintf("too old resource version: %d (%d)", from, f.compacted))
		return
	}
	endGen, expireGen := f.endGen, f.expireGen
	f.openWatch++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.openWatch--
		f.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	flusher := w.(http.Flusher)
	flusher.Flush()
	enc := json.NewEncoder(w)
	next := from
	for {
		f.mu.Lock()
		var pending []fakeEvent
		for _, e := range f.events {
			if e.rv > next && (e.typ == EventBookmark || selects(sel, e.obj)) {
				pending = append(pending, e)
			}
		}
		if len(f.events) > 0 {
			next = max(next, f.events[len(f.events)-1].rv)
		}
		wake, ended, expired := f.wake, f.endGen != endGen, f.expireGen != expireGen
		compacted := f.compacted
		f.mu.Unlock()
		for _, e := range pending {
			enc.Encode(map[string]any{"type": e.typ, "object": e.obj})
		}
		switch {
		case expired:
			enc.Encode(map[string]any{"type": "ERROR", "object": map[string]any{
				"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
				"message": fmt.Sprintf("too old resource version: %d (%d)", from, compacted),
			}})
			return
		case ended:
			return
		}
		flusher.Flush()
		select {
		case <-wake:
		case <-r.Context().Done():
			return
		}
	}
}

// changed wakes the watches; the caller holds mu.
func (f *fakeAPI) changedLocked() {
	close(f.wake)
	f.wake = make(chan struct{})
}

// apply stores s (or deletes it) with a new resource version and, unless
// quiet, sends the event to the watches.
func (f *fakeAPI) apply(typ string, s *EndpointSlice, quiet bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	o := *s
	o.ResourceVersion = strconv.Itoa(f.rv)
	if typ == EventDeleted {
		delete(f.objs, o.Name)
	} else {
		f.objs[o.Name] = o
	}
	if !quiet {
		f.events = append(f.events, fakeEvent{rv: f.rv, typ: typ, obj: o})
	}
	f.changedLocked()
}

func (f *fakeAPI) create(s *EndpointSlice) { f.apply(EventAdded, s, false) }
func (f *fakeAPI) update(s *EndpointSlice) { f.apply(EventModified, s, false) }
func (f *fakeAPI) delete(name string) {
	f.mu.Lock()
	s := f.objs[name]
	f.mu.Unlock()
	f.apply(EventDeleted, &s, false)
}

// bookmark sends a bookmark at a new resource version and returns it.
func (f *fakeAPI) bookmark() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	f.events = append(f.events, fakeEvent{rv: f.rv, typ: EventBookmark, obj: EndpointSlice{ObjectMeta: ObjectMeta{ResourceVersion: strconv.Itoa(f.rv)}}})
	f.changedLocked()
	return strconv.Itoa(f.rv)
}

// endWatches ends the open watches cleanly, as the API server's timeout
// does.
func (f *fakeAPI) endWatches() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.endGen++
	f.changedLocked()
}

// compact forgets every version up to now: a watch from an older one is
// answered 410. asEvent ends the open watches with an ERROR 410 event (the
// watch cache's answer); otherwise they end cleanly and the next watch
// gets HTTP 410.
func (f *fakeAPI) compact(asEvent bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.compacted = f.rv + 1
	f.rv++
	if asEvent {
		f.expireGen++
	} else {
		f.endGen++
	}
	f.changedLocked()
}

// answerNext answers the next request of kind ("list" or "watch") with h.
func (f *fakeAPI) answerNext(kind string, h http.HandlerFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hooks[kind] = append(f.hooks[kind], h)
}

// answerAlways answers every request of kind with h (nil: normally again).
func (f *fakeAPI) answerAlways(kind string, h http.HandlerFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.always[kind] = h
}

// holdLists makes lists wait until the returned function is called.
func (f *fakeAPI) holdLists() (release func()) {
	ch := make(chan struct{})
	f.mu.Lock()
	f.hold = ch
	f.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.hold = nil
			f.mu.Unlock()
			close(ch)
		})
	}
}

// requests returns the queries of the requests of kind so far.
func (f *fakeAPI) requests(kind string) []*http.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*http.Request(nil), f.reqs[kind]...)
}

func (f *fakeAPI) watching() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.openWatch
}

func (f *fakeAPI) currentRV() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strconv.Itoa(f.rv)
}

// testEnv is a configEnv with nothing in it: no in-cluster variables, no
// home directory, an empty service account directory.
func testEnv(t *testing.T) configEnv {
	env := map[string]string{}
	return configEnv{
		getenv: func(k string) string { return env[k] },
		saDir:  filepath.Join(t.TempDir(), "serviceaccount"),
		now:    time.Now,
	}
}

func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	return writeFile(t, "kubeconfig", `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+server+`"}}]
users: [{name: u, user: {token: secret}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: mcp}}]
current-context: x
`)
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// query is a request's query, for messages.
func query(r *http.Request) url.Values { return r.URL.Query() }
