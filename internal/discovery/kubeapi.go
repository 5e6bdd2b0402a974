package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// This file is tether's own Kubernetes API client: the EndpointSlice types
// it reads, and list and watch of them as JSON over net/http. It replaces
// client-go, whose rest client, informer and API types cost the sidecar
// 9 MB of (stripped) binary and 5 MiB of idle RSS for two GET requests.

// The subset of discovery.k8s.io/v1 EndpointSlice tether reads; every other
// field of the API's JSON is ignored when decoding.
type (
	// EndpointSlice is one slice of a Service's endpoints.
	EndpointSlice struct {
		ObjectMeta  `json:"metadata"`
		AddressType string          `json:"addressType"`
		Endpoints   []SliceEndpoint `json:"endpoints"`
		Ports       []EndpointPort  `json:"ports"`
	}

	// ObjectMeta is the part of an object's metadata tether reads.
	ObjectMeta struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace"`
		ResourceVersion string            `json:"resourceVersion"`
		Labels          map[string]string `json:"labels"`
	}

	// SliceEndpoint is one endpoint (a pod) of a slice.
	SliceEndpoint struct {
		Addresses  []string           `json:"addresses"`
		Conditions EndpointConditions `json:"conditions"`
		TargetRef  *ObjectReference   `json:"targetRef"`
	}

	// EndpointConditions follow the API's nil rules (see rankOf).
	EndpointConditions struct {
		Ready       *bool `json:"ready"`
		Serving     *bool `json:"serving"`
		Terminating *bool `json:"terminating"`
	}

	// ObjectReference names the pod behind an endpoint.
	ObjectReference struct {
		Kind      string `json:"kind"`
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
		UID       string `json:"uid"`
	}

	// EndpointPort is one port of a slice: the pods' (target) port.
	EndpointPort struct {
		Name        *string `json:"name"`
		Protocol    *string `json:"protocol"`
		Port        *int32  `json:"port"`
		AppProtocol *string `json:"appProtocol"`
	}

	// EndpointSliceList is the answer to a list.
	EndpointSliceList struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items []EndpointSlice `json:"items"`
	}
)

// Values of the API's fields that tether compares against.
const (
	AddressTypeIPv4 = "IPv4"
	AddressTypeIPv6 = "IPv6"
	AddressTypeFQDN = "FQDN"
	ProtocolTCP     = "TCP"
	// LabelServiceName is the label that ties a slice to its Service.
	LabelServiceName = "kubernetes.io/service-name"
)

// The event types of a watch (the API's watch.EventType).
const (
	EventAdded    = "ADDED"
	EventModified = "MODIFIED"
	EventDeleted  = "DELETED"
	EventBookmark = "BOOKMARK"
	eventError    = "ERROR" // returned by Next as an *APIError, never as an event
)

// WatchEvent is one change of a watch. A bookmark's Object carries only its
// resource version.
type WatchEvent struct {
	Type   string
	Object EndpointSlice
}

// WatchOptions scope a watch.
type WatchOptions struct {
	// LabelSelector selects the Service's slices.
	LabelSelector string
	// ResourceVersion is where the watch starts: the list's, or the last one
	// seen.
	ResourceVersion string
	// Timeout asks the API server to end the watch after this long
	// (timeoutSeconds); the client gives up a little later on its own.
	// Zero means minWatchTimeout.
	Timeout time.Duration
}

// EndpointSliceWatch is an open watch.
type EndpointSliceWatch interface {
	// Next returns the next event. It returns io.EOF when the watch ended
	// cleanly (the API server's timeout, or the client's own deadline), an
	// *APIError for an ERROR event, and another error for a broken
	// connection or, wrapping ErrMalformed, an answer that is not a watch
	// event.
	Next() (WatchEvent, error)
	// Close ends the watch; it may be called more than once.
	Close() error
}

// EndpointSliceClient lists and watches the EndpointSlices of a namespace:
// the only API calls the Kubernetes source makes. KubeClient returns the
// real one.
type EndpointSliceClient interface {
	ListEndpointSlices(ctx context.Context, namespace, labelSelector string) (*EndpointSliceList, error)
	WatchEndpointSlices(ctx context.Context, namespace string, opts WatchOptions) (EndpointSliceWatch, error)
}

// Limits on what the API server may send. A Service's slices hold at most
// 100 endpoints each by default (the EndpointSlice controller's
// --max-endpoints-per-slice, 1000 at most), about 500 bytes apiece in JSON:
// a 1000-endpoint slice is about 0.5 MB and a list of a Service of 10,000
// pods about 5 MB. The limits are several times that, so they only stop a
// broken or hostile answer from taking the sidecar's memory.
const (
	// maxListBytes caps the body of one list.
	maxListBytes = 16 << 20
	// maxEventBytes caps one watch event (one slice, at most 1000
	// endpoints).
	maxEventBytes = 4 << 20
	// maxStatusBytes caps the body of an error answer read into the error.
	maxStatusBytes = 64 << 10
	// listTimeout bounds one list request: a list of one Service's slices
	// is small, and a stuck request must not hold the source before its
	// first snapshot forever.
	listTimeout = time.Minute
	// watchDeadlineSlack is how long past its timeoutSeconds the client
	// waits for the API server to end a watch before ending it itself (a
	// half-open connection, a proxy that swallowed the end).
	watchDeadlineSlack = 30 * time.Second
)

// ErrMalformed is wrapped by the errors of answers that are not what the
// API sends: bad JSON, a truncated body, an answer over its size limit, an
// unknown event type.
var ErrMalformed = errors.New("malformed answer from the API server")

// APIError is a non-2xx answer, or an ERROR event of a watch, with the
// API's Status when it sent one.
type APIError struct {
	Code    int    // HTTP status code (the Status's code)
	Reason  string // the Status's reason: Forbidden, Expired, Gone, ...
	Message string // the Status's message, or the start of the body
}

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Code)
	}
	if e.Reason != "" {
		return fmt.Sprintf("%s (%d %s)", msg, e.Code, e.Reason)
	}
	return fmt.Sprintf("%s (%d)", msg, e.Code)
}

// isGone says whether err means the resource version asked for is too old:
// HTTP 410, or an ERROR event with code 410 ("too old resource version").
// The answer is to list again.
func isGone(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && (ae.Code == http.StatusGone || ae.Reason == "Expired" || ae.Reason == "Gone")
}

// status is the API's metav1.Status, as far as errors need it.
type status struct {
	Kind    string `json:"kind"`
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// apiClient is the EndpointSliceClient KubeClient returns.
type apiClient struct {
	base      *url.URL // the server, with its path prefix if any
	http      *http.Client
	userAgent string
	// auth sets the request's credentials (a bearer token re-read from
	// its file, basic auth); nil for none or client certificates only.
	auth func(*http.Request) error
	// maxList and maxEvent are maxListBytes and maxEventBytes; tests
	// shrink them.
	maxList, maxEvent int64
}

var _ EndpointSliceClient = (*apiClient)(nil)

func (c *apiClient) endpoint(namespace string, q url.Values) string {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/apis/discovery.k8s.io/v1/namespaces/" + url.PathEscape(namespace) + "/endpointslices"
	u.RawPath = ""
	u.RawQuery = q.Encode()
	return u.String()
}

// get sends a GET and returns the response when it is 2xx; otherwise the
// error carries the API's Status.
func (c *apiClient) get(ctx context.Context, target string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.userAgent)
	if c.auth != nil {
		if err := c.auth(req); err != nil {
			return nil, err
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, statusError(resp)
	}
	return resp, nil
}

// statusError reads at most maxStatusBytes of a non-2xx answer into an
// *APIError.
func statusError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxStatusBytes))
	e := &APIError{Code: resp.StatusCode}
	var st status
	if json.Unmarshal(body, &st) == nil && st.Kind == "Status" {
		e.Reason, e.Message = st.Reason, st.Message
		return e
	}
	e.Message = strings.ToValidUTF8(strings.TrimSpace(string(body)), "?")
	if len(e.Message) > 200 {
		e.Message = e.Message[:200] + "..."
	}
	return e
}

func (c *apiClient) ListEndpointSlices(ctx context.Context, namespace, labelSelector string) (*EndpointSliceList, error) {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	// No resourceVersion: the most recent state, a consistent read.
	resp, err := c.get(ctx, c.endpoint(namespace, url.Values{"labelSelector": {labelSelector}}))
	if err != nil {
		return nil, fmt.Errorf("list EndpointSlices: %w", err)
	}
	defer resp.Body.Close()
	list := &EndpointSliceList{}
	body := &limitedReader{r: resp.Body, max: c.maxList}
	if err := json.NewDecoder(body).Decode(list); err != nil {
		return nil, fmt.Errorf("list EndpointSlices: %w", decodeError(err, body, "a list"))
	}
	if list.Metadata.ResourceVersion == "" {
		return nil, fmt.Errorf("list EndpointSlices: %w: no resourceVersion", ErrMalformed)
	}
	return list, nil
}

func (c *apiClient) WatchEndpointSlices(ctx context.Context, namespace string, o WatchOptions) (EndpointSliceWatch, error) {
	q := url.Values{
		"watch":               {"1"},
		"labelSelector":       {o.LabelSelector},
		"resourceVersion":     {o.ResourceVersion},
		"allowWatchBookmarks": {"true"},
	}
	if o.Timeout <= 0 {
		o.Timeout = minWatchTimeout
	}
	q.Set("timeoutSeconds", strconv.Itoa(max(1, int(o.Timeout.Seconds()))))
	wctx, cancel := context.WithTimeout(ctx, o.Timeout+watchDeadlineSlack)
	resp, err := c.get(wctx, c.endpoint(namespace, q))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watch EndpointSlices: %w", err)
	}
	return newAPIWatch(ctx, wctx, cancel, resp.Body, c.maxEvent), nil
}

// newAPIWatch decodes body, the stream of a watch made with wctx (parent's
// child with the watch's deadline; cancel ends it).
func newAPIWatch(parent, wctx context.Context, cancel context.CancelFunc, body io.ReadCloser, maxEvent int64) *apiWatch {
	limit := &limitedReader{r: body, max: maxEvent}
	return &apiWatch{parent: parent, ctx: wctx, cancel: cancel, body: body, limit: limit, dec: json.NewDecoder(limit)}
}

// apiWatch decodes a watch's stream of JSON events.
type apiWatch struct {
	parent, ctx context.Context
	cancel      context.CancelFunc
	body        io.ReadCloser
	limit       *limitedReader
	dec         *json.Decoder
}

// rawEvent is one event on the wire: {"type": ..., "object": {...}}.
type rawEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

func (w *apiWatch) Next() (WatchEvent, error) {
	var raw rawEvent
	w.limit.n = 0 // the limit is per event
	if err := w.dec.Decode(&raw); err != nil {
		switch {
		case errors.Is(err, io.EOF):
			return WatchEvent{}, io.EOF
		case w.parent.Err() == nil && w.ctx.Err() != nil:
			// The client's own deadline: the watch ended, not failed.
			return WatchEvent{}, io.EOF
		}
		return WatchEvent{}, fmt.Errorf("watch EndpointSlices: %w", decodeError(err, w.limit, "an event"))
	}
	switch raw.Type {
	case EventAdded, EventModified, EventDeleted, EventBookmark:
		ev := WatchEvent{Type: raw.Type}
		if err := json.Unmarshal(raw.Object, &ev.Object); err != nil {
			return WatchEvent{}, fmt.Errorf("watch EndpointSlices: %w: %s event: %v", ErrMalformed, raw.Type, err)
		}
		return ev, nil
	case eventError:
		var st status
		if err := json.Unmarshal(raw.Object, &st); err != nil {
			return WatchEvent{}, fmt.Errorf("watch EndpointSlices: %w: ERROR event: %v", ErrMalformed, err)
		}
		return WatchEvent{}, fmt.Errorf("watch EndpointSlices: %w", &APIError{Code: st.Code, Reason: st.Reason, Message: st.Message})
	}
	return WatchEvent{}, fmt.Errorf("watch EndpointSlices: %w: event type %q", ErrMalformed, truncate(raw.Type, 40))
}

func (w *apiWatch) Close() error {
	w.cancel()
	return w.body.Close()
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// decodeError tells a body that is not JSON of the expected shape, or is
// over its limit (ErrMalformed), from a connection that broke while it was
// read (returned as is; a body cut short mid-value is io.ErrUnexpectedEOF).
func decodeError(err error, body *limitedReader, what string) error {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case body.over:
		return fmt.Errorf("%w: %s over %d bytes", ErrMalformed, what, body.max)
	case errors.As(err, &syntax), errors.As(err, &typ):
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return err
}

// limitedReader fails once more than max bytes were read since n was last
// reset, without reading them: the JSON decoder then stops with an error
// instead of growing its buffer. The decoder reads ahead, so one event may
// take up to twice max of buffer before the limit bites.
type limitedReader struct {
	r    io.Reader
	max  int64
	n    int64
	over bool
}

var errTooLarge = errors.New("answer too large")

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n >= l.max {
		// Exactly max bytes and then the end is within the limit.
		var one [1]byte
		if n, err := l.r.Read(one[:]); n == 0 && err != nil {
			return 0, err
		}
		l.over = true
		return 0, errTooLarge
	}
	if int64(len(p)) > l.max-l.n {
		p = p[:l.max-l.n]
	}
	n, err := l.r.Read(p)
	l.n += int64(n)
	return n, err
}
