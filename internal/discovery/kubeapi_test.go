package discovery

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
)

// watchOf decodes s as a watch stream.
func watchOf(s string, maxEvent int64) *apiWatch {
	ctx, cancel := context.WithCancel(context.Background())
	return newAPIWatch(context.Background(), ctx, cancel, io.NopCloser(strings.NewReader(s)), maxEvent)
}

// Every kind of event decodes; an ERROR event is an *APIError, 410 is
// "gone"; the end of the stream is io.EOF.
func TestWatchStream(t *testing.T) {
	w := watchOf(`{"type":"ADDED","object":{"kind":"EndpointSlice","metadata":{"name":"a","namespace":"mcp","resourceVersion":"5","labels":{"kubernetes.io/service-name":"s"}},`+
		`"addressType":"IPv4","endpoints":[{"addresses":["10.0.0.1"],"conditions":{"ready":true},"targetRef":{"kind":"Pod","name":"p","uid":"u"},"nodeName":"n","zone":"z"}],`+
		`"ports":[{"name":"mcp","port":8080,"protocol":"TCP","appProtocol":"https"}]}}
{"type":"BOOKMARK","object":{"kind":"EndpointSlice","metadata":{"resourceVersion":"6","annotations":{"k8s.io/initial-events-end":"true"}}}}
{"type":"DELETED","object":{"metadata":{"name":"a","resourceVersion":"7"}}}{"type":"MODIFIED","object":{"metadata":{"name":"b","resourceVersion":"8"}}}
{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version: 1 (5)","reason":"Expired","code":410}}
`, 1<<20)
	ev, err := w.Next()
	if err != nil {
		t.Fatal(err)
	}
	s := ev.Object
	if ev.Type != EventAdded || s.Name != "a" || s.Namespace != "mcp" || s.ResourceVersion != "5" || s.Labels[LabelServiceName] != "s" ||
		s.AddressType != "IPv4" || len(s.Endpoints) != 1 || s.Endpoints[0].Addresses[0] != "10.0.0.1" || !*s.Endpoints[0].Conditions.Ready ||
		s.Endpoints[0].Conditions.Serving != nil || s.Endpoints[0].TargetRef.UID != "u" ||
		len(s.Ports) != 1 || *s.Ports[0].Name != "mcp" || *s.Ports[0].Port != 8080 || *s.Ports[0].Protocol != "TCP" || *s.Ports[0].AppProtocol != "https" {
		t.Errorf("ADDED decoded as %+v", ev)
	}
	for _, want := range []struct{ typ, rv string }{{EventBookmark, "6"}, {EventDeleted, "7"}, {EventModified, "8"}} {
		ev, err := w.Next()
		if err != nil || ev.Type != want.typ || ev.Object.ResourceVersion != want.rv {
			t.Errorf("got %s %s, %v; want %s %s", ev.Type, ev.Object.ResourceVersion, err, want.typ, want.rv)
		}
	}
	_, err = w.Next()
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != 410 || !isGone(err) || !strings.Contains(err.Error(), "too old resource version") {
		t.Errorf("ERROR event: %v, want a 410 APIError", err)
	}
	if _, err := w.Next(); err != io.EOF {
		t.Errorf("end of stream: %v, want io.EOF", err)
	}
}

func TestWatchStreamBroken(t *testing.T) {
	tests := []struct {
		name, stream string
		malformed    bool
	}{
		{"truncated", `{"type":"ADDED","object":{"metadata":`, false},
		{"not JSON", `<html>`, true},
		{"not an object", `[1,2]`, true},
		{"object of the wrong type", `{"type":"ADDED","object":"x"}`, true},
		{"no object", `{"type":"ADDED"}`, true},
		{"field of the wrong type", `{"type":"MODIFIED","object":{"endpoints":[{"addresses":[1]}]}}`, true},
		{"port out of int32", `{"type":"MODIFIED","object":{"ports":[{"port":99999999999}]}}`, true},
		{"unknown type", `{"type":"","object":{}}`, true},
		{"ERROR without a Status", `{"type":"ERROR","object":[]}`, true},
		{"over the limit", `{"type":"ADDED","object":{"metadata":{"name":"` + strings.Repeat("x", 300) + `"}}}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := watchOf(tt.stream, 256).Next()
			if err == nil || err == io.EOF {
				t.Fatalf("error %v, want a failure", err)
			}
			if errors.Is(err, ErrMalformed) != tt.malformed {
				t.Errorf("error %v: malformed %v, want %v", err, errors.Is(err, ErrMalformed), tt.malformed)
			}
		})
	}
}

// Whatever the API server sends, the decoder returns events or an error
// and never panics; it always ends.
func FuzzWatchStream(f *testing.F) {
	for _, seed := range []string{
		`{"type":"ADDED","object":{"metadata":{"name":"a"},"endpoints":[{"addresses":["10.0.0.1"]}],"ports":[{"port":1}]}}`,
		`{"type":"ERROR","object":{"code":410}}`,
		`{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"1"}}}{"type":"DELETED","object":{}}`,
		`{"type":"ADDED","object":{"ports":[{"port":null,"name":null}],"endpoints":[{"conditions":null,"targetRef":null}]}}`,
		"\x00\xff{",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		w := watchOf(s, 512)
		for range len(s) + 2 {
			ev, err := w.Next()
			if err != nil {
				return
			}
			// What a decoded event reaches must not panic either.
			mergeSlices([]*EndpointSlice{&ev.Object}, PortSelector{})
		}
		t.Fatalf("%q: more events than bytes", s)
	})
}

// The limit counts what is past it: a body of exactly the limit is whole.
func TestLimitedReader(t *testing.T) {
	for _, tt := range []struct {
		body string
		over bool
	}{{"12345678", false}, {"123456789", true}, {"", false}} {
		l := &limitedReader{r: strings.NewReader(tt.body), max: 8}
		got, err := io.ReadAll(l)
		if tt.over != (err != nil) || l.over != tt.over {
			t.Errorf("%q: read %q, %v, over %v; want over %v", tt.body, got, err, l.over, tt.over)
		}
	}
}
