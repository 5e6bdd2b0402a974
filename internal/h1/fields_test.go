package h1

import (
	"net/http"
	"net/textproto"
	"reflect"
	"testing"
)

// Fields read and change as http.Header does: the same operations on both
// leave the same header, each name's values in the same order, and the
// others' fields in their places.
func TestFieldsAsHeader(t *testing.T) {
	type op struct{ set, del, value string }
	start := Fields{{"A", "1"}, {"B", "2"}, {"A", "3"}, {"C", "4"}, {"A", "5"}}
	for _, tc := range []struct {
		name  string
		ops   []op
		order Fields // the fields after, when their order is pinned
	}{
		{"set replaces all, in the first's place", []op{{set: "a", value: "x"}}, Fields{{"A", "x"}, {"B", "2"}, {"C", "4"}}},
		{"set a new name appends", []op{{set: "mcp-session-id", value: "s"}}, append(start[:len(start):len(start)], Field{"Mcp-Session-Id", "s"})},
		{"del removes all", []op{{del: "A"}}, Fields{{"B", "2"}, {"C", "4"}}},
		{"del of an absent name", []op{{del: "X"}}, start},
		{"del of an invalid name", []op{{del: "a b"}}, start},
		{"set then del", []op{{set: "B", value: "y"}, {del: "c"}, {set: "D", value: "z"}}, Fields{{"A", "1"}, {"B", "y"}, {"A", "3"}, {"A", "5"}, {"D", "z"}}},
	} {
		f := append(Fields(nil), start...)
		h := start.Header()
		for _, o := range tc.ops {
			if o.set != "" {
				f.Set(o.set, o.value)
				h.Set(o.set, o.value)
			} else {
				f.Del(o.del)
				h.Del(o.del)
			}
		}
		if got := f.Header(); !reflect.DeepEqual(got, h) {
			t.Errorf("%s: %v, http.Header %v", tc.name, got, h)
		}
		if !reflect.DeepEqual(f, tc.order) {
			t.Errorf("%s: fields %v, want %v", tc.name, f, tc.order)
		}
		for _, name := range []string{"A", "a", "B", "Mcp-Session-Id", "X"} {
			if f.Get(name) != h.Get(name) || !reflect.DeepEqual(f.Values(name), h.Values(name)) || f.Has(name) != (len(h.Values(name)) > 0) || f.Count(name) != len(h.Values(name)) {
				t.Errorf("%s: %s reads %q %q, http.Header %q %q", tc.name, name, f.Get(name), f.Values(name), h.Get(name), h.Values(name))
			}
		}
	}
}

// AddTo adds after what a header has, without writing into its lists.
func TestFieldsAddTo(t *testing.T) {
	own := make([]string, 1, 4)
	own[0] = "own"
	h := http.Header{"A": own}
	Fields{{"A", "1"}, {"B", "2"}, {"A", "3"}}.AddTo(h)
	if want := (http.Header{"A": {"own", "1", "3"}, "B": {"2"}}); !reflect.DeepEqual(h, want) {
		t.Errorf("AddTo: %v, want %v", h, want)
	}
	if own[:2][1] != "" {
		t.Errorf("AddTo wrote %q into the header's own list", own[:2][1])
	}
}

// canonical is textproto.CanonicalMIMEHeaderKey, for the common names it
// does not walk and for any other.
func TestCanonical(t *testing.T) {
	names := append([]string{"", "x-a", "X-A", "mcp-session-id", "MCP-SESSION-ID", "x a", "ÄB", "content-length"}, commonKeys[:]...)
	for _, n := range names {
		if got, want := canonical(n), textproto.CanonicalMIMEHeaderKey(n); got != want {
			t.Errorf("canonical(%q) = %q, want %q", n, got, want)
		}
	}
}
