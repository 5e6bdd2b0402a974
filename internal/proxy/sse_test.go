package proxy

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestBackendEventID(t *testing.T) {
	for _, tt := range []struct {
		client string
		gen    uint32
		want   string
		ok     bool
	}{
		{"", 0, "", false},
		{"17_3", 0, "17_3", true},              // never moved: untouched
		{"17_3", 1, "", false},                 // issued by the lost backend
		{"tether.1.17_3", 1, "17_3", true},     // issued by the current backend
		{"tether.1.17_3", 2, "", false},        // issued by an earlier one
		{"tether.2.a.b", 2, "a.b", true},       // dots in the original id survive
		{"tether.x.17", 1, "", false},          // malformed tag
		{"tether.1", 1, "", false},             // tag without an id
		{"tether.99999999999.1", 1, "", false}, // overflow
		{string(tagEventID(3, []byte("e1"))), 3, "e1", true},
	} {
		got, ok := backendEventID(tt.client, tt.gen)
		if got != tt.want || ok != tt.ok {
			t.Errorf("backendEventID(%q, %d) = %q, %v; want %q, %v", tt.client, tt.gen, got, ok, tt.want, tt.ok)
		}
	}
}

func TestEventIDTagger(t *testing.T) {
	in := "event: message\nid: 0_1\ndata: {\"a\":1}\n\n" +
		"id:0_2\r\ndata: {\"id: not a field\":2}\n\n" +
		": comment id: 5\n" +
		"data: " + strings.Repeat("x", 40<<10) + "\n" + // longer than the reader's buffer
		"id: 0_3\n\n"
	want := "event: message\nid: tether.2.0_1\ndata: {\"a\":1}\n\n" +
		"id: tether.2.0_2\ndata: {\"id: not a field\":2}\n\n" +
		": comment id: 5\n" +
		"data: " + strings.Repeat("x", 40<<10) + "\n" +
		"id: tether.2.0_3\n\n"
	for name, src := range map[string]io.Reader{
		"whole":        strings.NewReader(in),
		"byte by byte": iotest.OneByteReader(strings.NewReader(in)),
	} {
		t.Run(name, func(t *testing.T) {
			got, err := io.ReadAll(newEventIDTagger(io.NopCloser(src), 2))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != want {
				t.Errorf("tagged stream differs:\n got %.200q\nwant %.200q", got, want)
			}
		})
	}
}
