package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestProcParsing(t *testing.T) {
	status := "Name:\tnginx\nVmPeak:\t   20000 kB\nVmHWM:\t   15000 kB\nVmRSS:\t   12345 kB\nRssAnon:\t    2000 kB\n"
	if got := parseVmRSS(status); got != 12345 {
		t.Errorf("parseVmRSS = %d, want 12345", got)
	}
	if got := parseVmRSS("Name:\tkthreadd\nState:\tS (sleeping)\n"); got != 0 {
		t.Errorf("parseVmRSS without VmRSS = %d, want 0", got)
	}

	// A comm may hold spaces and parentheses: the fields start after the
	// last ')'. utime and stime are fields 14 and 15, in 10 ms ticks.
	stat := "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 75 0 0 20 0 3 0 123 45678 910 18446744073709551615"
	f, ok := parseStat(stat)
	if !ok || f[0] != "S" || f[1] != "1" {
		t.Fatalf("parseStat = %q, %v; want state S, ppid 1 first", f, ok)
	}
	user, sys, ok := statTimes(f)
	if !ok || user != 2500*time.Millisecond || sys != 750*time.Millisecond {
		t.Errorf("statTimes = %v, %v, %v; want 2.5s, 750ms", user, sys, ok)
	}
	if _, _, ok := statTimes(f[:12]); ok {
		t.Error("statTimes of a short line: ok")
	}
	if _, ok := parseStat("no parenthesis"); ok {
		t.Error("parseStat without a comm: ok")
	}

	d, ok := parseSchedstat("1234567890 5000 42\n")
	if !ok || d != 1234567890*time.Nanosecond {
		t.Errorf("parseSchedstat = %v, %v; want 1.23456789s", d, ok)
	}
	for _, bad := range []string{"", "x 1 2", "-5 1 2"} {
		if _, ok := parseSchedstat(bad); ok {
			t.Errorf("parseSchedstat(%q): ok", bad)
		}
	}

	// This very process, as the scenario reads a proxy.
	if rss := rssKiB(os.Getpid()); rss <= 0 {
		t.Errorf("rssKiB(self) = %d", rss)
	}
	if _, err := os.Stat("/proc/self/schedstat"); err == nil {
		if cpu, ok := onCPU(os.Getpid()); !ok || cpu <= 0 {
			t.Errorf("onCPU(self) = %v, %v", cpu, ok)
		}
	}
}

func TestPercentOfCore(t *testing.T) {
	if got := percentOfCore(30*time.Millisecond, 10*time.Second); got < 0.2999 || got > 0.3001 {
		t.Errorf("30ms over 10s = %v%%, want 0.3", got)
	}
	if got := percentOfCore(time.Second, 0); got != 0 {
		t.Errorf("no window: %v", got)
	}
}

func TestParseStreamsConfig(t *testing.T) {
	cfg, err := parseStreamsConfig("1000, 5000,10000", 10*time.Second, 15*time.Second, 3)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(cfg.Sizes, []int{1000, 5000, 10000}); diff != "" {
		t.Errorf("sizes (-got +want):\n%s", diff)
	}
	if cfg.Repeats != 3 {
		t.Errorf("repeats %d, want 3", cfg.Repeats)
	}
	for _, bad := range []struct {
		sizes        string
		window, ping time.Duration
		runs         int
	}{{"1000,x", time.Second, time.Second, 1}, {"0", time.Second, time.Second, 1}, {"", time.Second, time.Second, 1}, {"10", 0, time.Second, 1}, {"10", time.Second, 0, 1}, {"10", time.Second, time.Second, 0}} {
		if _, err := parseStreamsConfig(bad.sizes, bad.window, bad.ping, bad.runs); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

// streamsFixture is a run of the three proxies at 5,000 and 10,000
// streams, tether at the figures of today.
func streamsFixture() *streamsResult {
	s := &streamsResult{streamsConfig: streamsConfig{Sizes: []int{5000, 10000}, Window: 10 * time.Second, Ping: 15 * time.Second}}
	add := func(proxy string, n int, kib, after, ping, idle float64) {
		s.Runs = append(s.Runs, &streamsRun{Proxy: proxy, Streams: n, RSSBefore: 17 << 10, RSSOpen: 17<<10 + int64(kib*float64(n)),
			KiBPerStream: kib, KiBPerStreamAfterEvents: after, CPUPinging: ping, CPUIdle: idle, OpenAtEnd: n})
	}
	for _, n := range s.Sizes {
		add("tether", n, 35, 39, 1.7, 0.22)
		add("nginx", n, 13.6, 13.6, 0.75, 0)
		add("HAProxy", n, 4.4, 4.4, 1.7, 0.03)
	}
	return s
}

func streamsRows(s *streamsResult) map[string]bool {
	met := map[string]bool{}
	s.streamsTargets(func(target, _ string, ok bool) { met[target] = ok })
	return met
}

// TestStreamsTargets checks that each open-stream goal is judged against
// the right figures of the same run, and a failed run meets none.
func TestStreamsTargets(t *testing.T) {
	s := streamsFixture()
	want := map[string]bool{
		"RSS per open stream ≤ HAProxy's, never above nginx's (KiB, idle / after events)": false,
		"10,000 idle streams within 80 MiB RSS":                                           false, // 17 + 35 × 10,000 KiB
		"CPU with 5,000 streams pinging every 15s ≤ nginx's":                              false,
		"CPU with open streams and nothing flowing 0.00%":                                 false,
	}
	if diff := cmp.Diff(streamsRows(s), want); diff != "" {
		t.Errorf("today's figures (-got +want):\n%s", diff)
	}

	// The goals met: 4 KiB per stream, idle and after events, CPU as
	// nginx's, nothing when idle.
	for _, r := range s.Runs {
		if r.Proxy == "tether" {
			r.KiBPerStream, r.KiBPerStreamAfterEvents, r.CPUPinging, r.CPUIdle = 4, 4.4, 0.75, 0.004
			r.RSSOpen = r.RSSBefore + int64(4*r.Streams)
		}
	}
	for k := range want {
		want[k] = true
	}
	if diff := cmp.Diff(streamsRows(s), want); diff != "" {
		t.Errorf("goals met (-got +want):\n%s", diff)
	}

	// Above HAProxy after events only: not met.
	s.run("tether", 5000).KiBPerStreamAfterEvents = 4.5
	if streamsRows(s)["RSS per open stream ≤ HAProxy's, never above nginx's (KiB, idle / after events)"] {
		t.Error("per-stream RSS met with more than HAProxy's after events")
	}
	s.run("tether", 5000).KiBPerStreamAfterEvents = 4.4

	// A proxy that dropped streams fails the run: nothing it measured counts.
	s.run("nginx", 5000).Failed = "3 of 5000 streams dropped"
	s.run("tether", 10000).Failed = "1 of 10000 streams dropped"
	got := streamsRows(s)
	for target, ok := range got {
		if ok {
			t.Errorf("%q met with failed runs", target)
		}
	}

	// Without 10,000 or 5,000 among the sizes: the largest size, and
	// the 10,000 row not measured.
	s = streamsFixture()
	s.Runs = s.Runs[:3]
	s.Sizes, s.Runs[0].Streams, s.Runs[1].Streams, s.Runs[2].Streams = []int{2000}, 2000, 2000, 2000
	got = streamsRows(s)
	if _, ok := got["CPU with 2,000 streams pinging every 15s ≤ nginx's"]; !ok {
		t.Errorf("no pinging CPU row at the largest size: %v", got)
	}
	if got["10,000 idle streams within 80 MiB RSS"] {
		t.Error("10,000 streams met without a run at 10,000")
	}
}

func TestStreamsMarkdown(t *testing.T) {
	s := streamsFixture()
	s.run("tether", 5000).GoroutinesBefore, s.run("tether", 5000).GoroutinesOpen = 14, 10014
	s.run("HAProxy", 10000).Failed = "3 of 10000 streams dropped"
	s.run("HAProxy", 10000).OpenAtEnd = 9997
	md := streamsMarkdown(s)
	for _, want := range []string{
		"| tether | 5,000 | 17.0 → 187.9 | 35.0 | 39.0 | 10,014 (2.00 per stream) | 1.70 | 0.22 | 5,000 |",
		"| nginx | 5,000 | 17.0 → 83.4 | 13.6 | 13.6 | n/a | 0.75 | 0.00 | 5,000 |",
		"| HAProxy | 10,000 | 17.0 → 60.0 | 4.4 | 4.4 | n/a | 1.70 | 0.03 | **failed**: 3 of 10000 streams dropped |",
	} {
		if !strings.Contains(md, want+"\n") {
			t.Errorf("no row %s in:\n%s", want, md)
		}
	}
	if diff := cmp.Diff(s.failures(), []string{"HAProxy at 10,000 streams: 3 of 10000 streams dropped"}); diff != "" {
		t.Errorf("failures (-got +want):\n%s", diff)
	}
	// A run that never had its streams open has no figures to show.
	s.Runs = append(s.Runs[:0], &streamsRun{Proxy: "tether", Streams: 5000, Failed: "12 of 5000 streams opened: status 503"})
	if md := streamsMarkdown(s); !strings.Contains(md, "| tether | 5,000 | – | – | – | – | – | – | **failed**: 12 of 5000 streams opened: status 503 |\n") {
		t.Errorf("failed run:\n%s", md)
	}
	if svg := streamsChart(s).String(); !strings.Contains(svg, "RSS per open idle stream") {
		t.Error("chart without its per-stream panel")
	}
}

// TestSSEBackendAndClients runs the scenario's backend and clients
// against each other: streams open, pings flow while asked for and stop,
// a mark reaches every open stream, and the backend counts its streams.
func TestSSEBackendAndClients(t *testing.T) {
	b := newSSEBackend()
	srv := httptest.NewServer(b)
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	ctx := context.Background()
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 10s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	count := func() string { return b.command("count") }

	c, err := openSSEClients(ctx, addr, 5, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	if c.opened() != 5 {
		t.Fatalf("%d streams opened, want 5", c.opened())
	}
	waitUntil("5 streams at the backend", func() bool { return count() == "count 5" })

	if got := b.command("ping 5ms"); got != "ok" {
		t.Fatalf("ping: %s", got)
	}
	waitUntil("pings on every stream", func() bool { return c.events.Load() >= 25 })
	if got := b.command("ping 0"); got != "ok" {
		t.Fatalf("ping 0: %s", got)
	}
	// After "ping 0" is answered no stream starts another ping; a mark
	// sent now arrives after any ping already written, so the count read
	// once every mark is in is final.
	if got := b.command("mark"); got != "ok" {
		t.Fatalf("mark: %s", got)
	}
	waitUntil("a mark on every stream", func() bool { return c.marks.Load() == 5 })
	stopped := c.events.Load()
	if got := b.command("mark"); got != "ok" {
		t.Fatalf("mark: %s", got)
	}
	waitUntil("the second mark on every stream", func() bool { return c.marks.Load() == 10 })
	if got := c.events.Load(); got != stopped {
		t.Errorf("%d pings after ping 0", got-stopped)
	}
	if c.ended.Load() != 0 {
		t.Errorf("%d streams ended", c.ended.Load())
	}

	// A stream opened later gets only the marks asked for after it.
	late, err := openSSEClients(ctx, addr, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil("6 streams at the backend", func() bool { return count() == "count 6" })
	b.command("mark")
	waitUntil("the third mark", func() bool { return c.marks.Load() == 15 && late.marks.Load() == 1 })
	late.close()
	if late.ended.Load() != 0 {
		t.Error("a stream closed by the client counted as ended")
	}
	waitUntil("5 streams at the backend again", func() bool { return count() == "count 5" })

	// The backend going away ends the streams at the client.
	srv.CloseClientConnections()
	waitUntil("every stream ended", func() bool { return c.ended.Load() == 5 })

	for _, bad := range []string{"ping x", "ping -1s", "pong", ""} {
		if got := b.command(bad); !strings.HasPrefix(got, "error") {
			t.Errorf("%q: %s", bad, got)
		}
	}
}

// A proxy that refuses a stream (tether past --max-streams) fails the
// opening, with what it said.
func TestSSEClientsRefused(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":"too many open streams; retry later"}`)
	}))
	defer srv.Close()
	c, err := openSSEClients(context.Background(), strings.TrimPrefix(srv.URL, "http://"), 3, 2)
	defer c.close()
	if err == nil || !strings.Contains(err.Error(), "status 503") || !strings.Contains(err.Error(), "too many open streams") {
		t.Errorf("err = %v, want the 503 and its body", err)
	}
	if c.opened() != 0 {
		t.Errorf("%d streams opened", c.opened())
	}
}

// A size needing more file descriptors than the machine allows is
// measured at the most that fits, said in a note.
func TestFitSizes(t *testing.T) {
	sizes, notes := fitSizes([]int{1000, 5000, 10000}, 20000)
	if diff := cmp.Diff(sizes, []int{1000, 5000, 9900}); diff != "" {
		t.Errorf("sizes (-got +want):\n%s", diff)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "10,000 streams need 20,128 file descriptors") || !strings.Contains(notes[0], "measured at 9,900") {
		t.Errorf("notes %q", notes)
	}
	sizes, notes = fitSizes([]int{1000, 10000, 12000}, 20000) // both lowered to one run
	if diff := cmp.Diff(sizes, []int{1000, 9900}); diff != "" || len(notes) != 2 {
		t.Errorf("sizes (-got +want):\n%s\nnotes %q", diff, notes)
	}
	if sizes, notes := fitSizes([]int{1000, 10000}, 1<<20); len(notes) != 0 || !slices.Equal(sizes, []int{1000, 10000}) {
		t.Errorf("under the limit: %v %q", sizes, notes)
	}
}

// Without a run at 10,000 (the machine's file descriptors stop short of
// it), the 10,000-stream goal is judged on a projection from the largest
// run, and says so.
func TestStreamsTargetProjected(t *testing.T) {
	s := streamsFixture()
	for _, r := range s.Runs {
		if r.Streams == 10000 {
			r.Streams = 9900
		}
	}
	s.Sizes = []int{5000, 9900}
	var measured string
	met := true
	s.streamsTargets(func(target, m string, ok bool) {
		if target == "10,000 idle streams within 80 MiB RSS" {
			measured, met = m, ok
		}
	})
	// 17 MiB + 10,000 × 35 KiB = 358.8 MiB
	if met || !strings.HasPrefix(measured, "358.8 MiB projected from 9,900 streams") {
		t.Errorf("measured %q, met %v", measured, met)
	}
	s.run("tether", 9900).KiBPerStream = 6 // 17 + 58.6 MiB
	s.streamsTargets(func(target, m string, ok bool) {
		if target == "10,000 idle streams within 80 MiB RSS" {
			measured, met = m, ok
		}
	})
	if !met {
		t.Errorf("projected %q not met", measured)
	}
}

// TestStreamsMedians checks that with several runs of a proxy at a size,
// its figures (the table's, the goals') are each the median of its runs,
// and that one failed run among them fails the size.
func TestStreamsMedians(t *testing.T) {
	s := streamsFixture()
	s.Repeats = 3
	var again []*streamsRun
	for _, r := range s.Runs {
		for _, k := range []float64{0.9, 1.3} {
			c := *r
			c.KiBPerStream, c.CPUPinging, c.RSSOpen = r.KiBPerStream*k, r.CPUPinging*k, r.RSSBefore+int64(float64(r.RSSOpen-r.RSSBefore)*k)
			again = append(again, &c)
		}
	}
	s.Runs = append(s.Runs, again...)
	for _, n := range s.Sizes {
		for _, px := range streamsProxies {
			runs := s.runsOf(px.name, n)
			if len(runs) != 3 {
				t.Fatalf("%s at %d: %d runs, want 3", px.name, n, len(runs))
			}
			m := s.run(px.name, n)
			if m.KiBPerStream != runs[0].KiBPerStream || m.CPUPinging != runs[0].CPUPinging || m.RSSOpen != runs[0].RSSOpen {
				t.Errorf("%s at %d: median %.2f KiB, %.3f%%, %d KiB RSS; want the middle run's %.2f, %.3f, %d",
					px.name, n, m.KiBPerStream, m.CPUPinging, m.RSSOpen, runs[0].KiBPerStream, runs[0].CPUPinging, runs[0].RSSOpen)
			}
			if lo, hi, ok := s.cpuRange(px.name, n); !ok || lo != runs[1].CPUPinging || hi != runs[2].CPUPinging {
				t.Errorf("%s at %d: CPU range %v–%v (%v), want %v–%v", px.name, n, lo, hi, ok, runs[1].CPUPinging, runs[2].CPUPinging)
			}
		}
	}
	md := streamsMarkdown(s)
	if !strings.Contains(md, "median of 3 runs") || !strings.Contains(md, "| 1.70 (1.53–2.21) |") {
		t.Errorf("the table does not give the medians and tether's range:\n%s", md)
	}

	// tether's runs meeting the per-stream goal, but for one failed run
	// at 5,000: that size's goal is not met.
	const perStream = "RSS per open stream ≤ HAProxy's, never above nginx's (KiB, idle / after events)"
	for _, r := range s.Runs {
		if r.Proxy == "tether" {
			r.KiBPerStream, r.KiBPerStreamAfterEvents = 4, 4.2
		}
	}
	if !streamsRows(s)[perStream] {
		t.Fatal("the per-stream goal is not met by runs that meet it")
	}
	s.runsOf("tether", 5000)[2].Failed = "streams dropped"
	if r := s.run("tether", 5000); r.Failed == "" {
		t.Error("a failed run among three is not reported")
	}
	if streamsRows(s)[perStream] {
		t.Error("a size with a failed run meets the per-stream goal")
	}
}
