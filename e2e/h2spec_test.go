package e2e

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/testkit"
)

// h2spec (github.com/summerwind/h2spec) is the HTTP/2 conformance suite;
// hack/h2spec.sh builds it (make h2spec) and caches it outside the
// repository, at the version below.
const (
	h2specRelease = "v2.2.1"
	// h2specRequireEnv turns a missing h2spec from a skip into a failure;
	// make test (and so CI) sets it.
	h2specRequireEnv = "TETHER_REQUIRE_H2SPEC"
	// h2specTimeout is h2spec's wait, in seconds, for each answer it
	// expects: its default (2) is short for a -race tether on a busy
	// machine. A test that fails waits it out: two of net/http's own do.
	h2specTimeout = 5
)

// netHTTPOwnH2SpecFailures are the h2spec tests a plain net/http h2c server
// (Go 1.26, http.Server with Protocols.SetUnencryptedHTTP2) fails, by
// h2spec's section and number, each with what net/http does. tether serves
// h2c with net/http's server, and may fail these and no other.
var netHTTPOwnH2SpecFailures = map[string]string{
	"http2/3.5/2": "an invalid connection preface: a server that also speaks HTTP/1 reads it as an HTTP/1 " +
		"request and answers 400 before it closes, where h2spec wants the connection closed at once",
	"http2/4.2/3": "a HEADERS frame over 16 KiB: net/http's SETTINGS_MAX_FRAME_SIZE is 1 MiB by default, so " +
		"it serves the request (tether sets MaxReadFrameSize to 16 KiB, and passes)",
	"http2/6.5.3/1": "a SETTINGS frame that repeats SETTINGS_INITIAL_WINDOW_SIZE: net/http closes the " +
		"connection (PROTOCOL_ERROR, settings_big_or_dups) where h2spec wants both values applied in order",
	"http2/8.1.2.2/1": "a connection-specific field (Connection) in a request: net/http answers 400 Bad " +
		"Request, not the stream error PROTOCOL_ERROR h2spec wants",
	"http2/8.1.2.2/2": `"TE" other than "trailers" in a request: net/http answers 400 Bad Request, not ` +
		"the stream error PROTOCOL_ERROR h2spec wants",
}

// h2specBinary is hack/h2spec.sh's binary: $TETHER_H2SPEC, else
// ${TETHER_H2SPEC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tether/h2spec}/h2spec-<v>/h2spec.
// When it is missing the test skips, or fails when $TETHER_REQUIRE_H2SPEC
// is set, so that CI never passes by skipping.
func h2specBinary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("TETHER_H2SPEC")
	if bin == "" {
		root := os.Getenv("TETHER_H2SPEC_CACHE")
		if root == "" {
			cache := os.Getenv("XDG_CACHE_HOME")
			if cache == "" {
				home, _ := os.UserHomeDir()
				cache = filepath.Join(home, ".cache")
			}
			root = filepath.Join(cache, "tether", "h2spec")
		}
		bin = filepath.Join(root, "h2spec-"+h2specRelease, "h2spec")
	}
	if fi, err := os.Stat(bin); err != nil || fi.Mode()&0o111 == 0 {
		reason := fmt.Sprintf("h2spec not built at %s: run hack/h2spec.sh (make h2spec)", bin)
		if os.Getenv(h2specRequireEnv) != "" {
			t.Fatalf("%s (and %s is set)", reason, h2specRequireEnv)
		}
		t.Skipf("%s (set %s=1 to fail instead)", reason, h2specRequireEnv)
	}
	return bin
}

// TestH2Spec runs h2spec against tether's client listener over h2c (prior
// knowledge), in front of a backend that answers every request, and against
// a plain net/http h2c server: tether must pass every test net/http
// passes. Each failure of tether must be one the plain server has in the
// same run, and be listed, with its reason, in netHTTPOwnH2SpecFailures.
func TestH2Spec(t *testing.T) {
	h2spec := h2specBinary(t)
	plain := startPlainH2C(t)
	tether := startTether(t, buildTether(t), "--backends", testkit.PingBackend(t).URL)
	tether.waitStatus("/readyz", 200, 60*time.Second)

	type run struct {
		results h2specResults
		took    time.Duration
		err     error
	}
	// The two runs at once: most of a run is h2spec waiting out its
	// timeout in the tests that fail.
	runs := make(map[string]chan run)
	for name, addr := range map[string]string{"tether": tether.listen, "net/http": plain} {
		ch := make(chan run, 1)
		runs[name] = ch
		dir := t.TempDir()
		go func() {
			start := time.Now()
			res, err := runH2Spec(h2spec, addr, dir)
			ch <- run{res, time.Since(start), err}
		}()
	}
	got, want := <-runs["tether"], <-runs["net/http"]
	for name, r := range map[string]run{"tether": got, "net/http": want} {
		if r.err != nil {
			t.Fatalf("h2spec against %s: %v", name, r.err)
		}
		t.Logf("h2spec %s against %s: %s in %s", h2specRelease, name, r.results.summary(), r.took.Round(100*time.Millisecond))
	}
	if len(got.results) == 0 || len(got.results) != len(want.results) {
		t.Fatalf("h2spec ran %d tests against tether, %d against net/http", len(got.results), len(want.results))
	}

	for _, id := range got.results.ids() {
		r := got.results[id]
		if r.outcome != "failed" {
			continue
		}
		if want.results[id].outcome != "failed" {
			t.Errorf("h2spec %s %q: tether fails it, plain net/http does not (%s):\n%s", id, r.title, want.results[id].outcome, r.message)
		} else if _, listed := netHTTPOwnH2SpecFailures[id]; !listed {
			t.Errorf("h2spec %s %q: tether fails it, as plain net/http does, but it is not in netHTTPOwnH2SpecFailures:\n%s", id, r.title, r.message)
		}
	}
	for id := range netHTTPOwnH2SpecFailures {
		if want.results[id].outcome != "failed" {
			t.Logf("h2spec %s: listed as net/http's own failure, but plain net/http %s it now", id, want.results[id].outcome)
		}
	}
}

// startPlainH2C serves h2c (and HTTP/1) with net/http's server alone,
// answering every request as the backend behind tether does.
func startPlainH2C(t *testing.T) string {
	t.Helper()
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Protocols: &protos,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return ln.Addr().String()
}

// h2specResult is one h2spec test's outcome: "passed", "failed" or
// "skipped".
type h2specResult struct {
	title   string
	outcome string
	message string
}

// h2specResults are a run's results by test: its package (section) and
// number within it, as h2spec's report names them ("http2/6.5.3/1").
type h2specResults map[string]h2specResult

func (rs h2specResults) ids() []string {
	ids := make([]string, 0, len(rs))
	for id := range rs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (rs h2specResults) summary() string {
	n := map[string]int{}
	for _, r := range rs {
		n[r.outcome]++
	}
	return fmt.Sprintf("%d tests, %d passed, %d skipped, %d failed", len(rs), n["passed"], n["skipped"], n["failed"])
}

// runH2Spec runs h2spec's whole suite (generic, http2, hpack) against
// addr over h2c and reads its JUnit report.
func runH2Spec(bin, addr, dir string) (h2specResults, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	report := filepath.Join(dir, "h2spec.xml")
	// A whole run takes some 10 s; this bounds a wedged one.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-h", host, "-p", port, "-o", strconv.Itoa(h2specTimeout), "-j", report)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return nil, fmt.Errorf("%v\n%s", err, out)
	}
	// h2spec exits non-zero when a test fails: the report tells.
	b, rerr := os.ReadFile(report)
	if rerr != nil {
		return nil, fmt.Errorf("no report (%v, exit %v):\n%s", rerr, err, out)
	}
	return parseH2SpecReport(b)
}

// h2specReport is the JUnit report h2spec writes (reporter/junit_report.go).
type h2specReport struct {
	Suites []struct {
		Package string `xml:"package,attr"`
		Cases   []struct {
			Title   string  `xml:"classname,attr"`
			Error   *string `xml:"error"`
			Failure *string `xml:"failure"`
			Skipped *string `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func parseH2SpecReport(b []byte) (h2specResults, error) {
	var rep h2specReport
	if err := xml.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("h2spec report: %v", err)
	}
	rs := make(h2specResults)
	for _, s := range rep.Suites {
		for i, c := range s.Cases {
			r := h2specResult{title: c.Title, outcome: "passed"}
			switch {
			case c.Error != nil:
				r.outcome, r.message = "failed", strings.TrimSpace(*c.Error)
			case c.Failure != nil:
				r.outcome, r.message = "failed", strings.TrimSpace(*c.Failure)
			case c.Skipped != nil:
				r.outcome = "skipped"
			}
			rs[fmt.Sprintf("%s/%d", s.Package, i+1)] = r
		}
	}
	return rs, nil
}
