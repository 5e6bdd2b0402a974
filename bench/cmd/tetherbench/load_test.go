package main

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestJSONRPCMessage(t *testing.T) {
	for name, tc := range map[string]struct{ in, want string }{
		"json":        {`{"jsonrpc":"2.0","id":1,"result":{}}`, `{"jsonrpc":"2.0","id":1,"result":{}}`},
		"sse":         {"event: message\ndata: {\"id\":1}\n\n", `{"id":1}`},
		"sse, crlf":   {"event: message\r\ndata: {\"id\":1}\r\n\r\nevent: message\r\ndata: {\"id\":2}\r\n\r\n", `{"id":1}`},
		"sse, no end": {"data: {\"id\":3}", `{"id":3}`},
		"empty":       {"", ""},
	} {
		if got := string(jsonRPCMessage([]byte(tc.in))); got != tc.want {
			t.Errorf("%s: got %q, want %q", name, got, tc.want)
		}
	}
}

func TestSummarizeAndSustainable(t *testing.T) {
	var samples []sample
	for i := range 1000 {
		samples = append(samples, sample{latency: time.Duration(i+1) * time.Millisecond / 10, ok: true, code: 200})
	}
	s := summarize(samples, time.Second)
	got := []time.Duration{s.P50, s.P99, s.P999, s.Max}
	want := []time.Duration{50 * time.Millisecond, 99 * time.Millisecond, 99900 * time.Microsecond, 100 * time.Millisecond}
	if diff := cmp.Diff(got, want); diff != "" {
		t.Errorf("quantiles (-got +want):\n%s", diff)
	}
	if ok, why := s.sustainable(1000); ok || why == "" {
		t.Errorf("p99 of 99ms judged sustainable (%q)", why)
	}
	samples[0].ok, samples[0].code = false, 502
	s = summarize(samples[:500], time.Second/2)
	if ok, _ := s.sustainable(1000); ok {
		t.Error("0.2% failures judged sustainable")
	}
	if s.Codes["502"] != 1 {
		t.Errorf("codes %v", s.Codes)
	}
	if ok, why := summarize(samples[1:400], time.Second).sustainable(1000); ok {
		t.Error("40% of the offered rate judged sustainable")
	} else if why != "sent 399/s of 1000/s" {
		t.Errorf("why = %q", why)
	}
}

func TestTimeline(t *testing.T) {
	samples := []sample{
		{at: 10 * time.Millisecond, latency: time.Millisecond, ok: true},
		{at: 150 * time.Millisecond, latency: 3 * time.Millisecond, ok: false},
		{at: 160 * time.Millisecond, latency: 2 * time.Millisecond, ok: true},
	}
	tt, ok, errs, p99 := timeline(samples, 200*time.Millisecond, 100*time.Millisecond)
	if diff := cmp.Diff([][]float64{tt, ok, errs, p99}, [][]float64{{0, 0.1, 0.2}, {10, 10, 0}, {0, 10, 0}, {1, 3, 0}}); diff != "" {
		t.Errorf("timeline (-got +want):\n%s", diff)
	}
}
