//go:build !tether_sidecar

package main

// The demo at MCP 2026-07-28 (tether demo --era 2026-07-28): the era without
// sessions. Clients at 2026-07-28 discover the server (server/discover)
// instead of initializing, get no Mcp-Session-Id, and send each request with
// its version in _meta and its routing headers (Mcp-Method, Mcp-Name); tether
// validates those and places every request on its own by load. So where the
// legacy demo shows sessions staying put, this one shows calls spreading:
// one client's calls reach several backends, and killing a backend moves
// nothing, since nothing lives there between calls.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tether-mcp/tether/internal/mcpbackend"
	"github.com/tether-mcp/tether/internal/server"
)

// demoMetricsWait bounds the wait for tether's request counter to catch up
// with the answers the clients have (it counts a request once answered).
const demoMetricsWait = 5 * time.Second

// runModern is the 2026-07-28 demonstration, steps 2 to 5 (step 1 is
// startDemo).
func (d *demo) runModern(ctx context.Context) error {
	o := d.opts
	var failures []string

	// 2. Connect and call.
	fmt.Fprintf(d.out, "2. connect %d clients at MCP %s through tether (server/discover: no initialize, no session); each calls whoami %d times\n",
		o.Sessions, eraModern, o.Calls)
	before := d.callAll(ctx, true)
	if ctx.Err() != nil {
		return interrupted(ctx)
	}
	spreadBefore, fs := d.reportModern(before, nil)
	failures = append(failures, fs...)
	failures = append(failures, d.checkModernClients(ctx, before)...)
	fmt.Fprintln(d.out)

	// 3. Kill the busiest backend.
	calls := callsByBackend(before)
	var victim *mcpbackend.Backend
	for _, b := range d.backends {
		if victim == nil || calls[b.Name] > calls[victim.Name] {
			victim = b
		}
	}
	if calls[victim.Name] == 0 {
		return errors.New("demo: no call reached a backend")
	}
	fmt.Fprintf(d.out, "3. kill %s (the most calls: %d) as a terminating pod: listener closed, %s grace, connections cut\n\n",
		victim.Name, calls[victim.Name], demoKillGrace)
	victim.Kill(demoKillGrace)

	// 4. Call again: there is nothing to move, each call is placed anew on
	// the backends left.
	fmt.Fprintf(d.out, "4. every client calls whoami %d more times: no session to move, each call is placed on the backends left\n", o.Calls)
	after := d.callAll(ctx, false)
	if ctx.Err() != nil {
		return interrupted(ctx)
	}
	spreadAfter, fs := d.reportModern(after, victim)
	failures = append(failures, fs...)
	if n := callsByBackend(after)[victim.Name]; n > 0 {
		fmt.Fprintf(d.out, "   %d calls were answered by the killed backend\n", n)
		failures = append(failures, fmt.Sprintf("%d calls answered by the killed backend", n))
	}
	fmt.Fprintln(d.out)

	// 5. Close and stop.
	n := 0
	for _, cs := range d.sessions {
		if cs != nil {
			n++
		}
	}
	closeErrs := d.closeSessions()
	fmt.Fprintf(d.out, "5. close %d clients: %d failed; stop tether and the backends\n\n", n, closeErrs)
	if closeErrs > 0 {
		failures = append(failures, fmt.Sprintf("%d client closes failed", closeErrs))
	}

	if len(failures) > 0 {
		fmt.Fprintf(d.out, "FAIL: %s\n", strings.Join(failures, "; "))
		return fmt.Errorf("demo (%s) failed: %s", eraModern, strings.Join(failures, "; "))
	}
	fmt.Fprintf(d.out, "PASS: 0 client errors, no sessions, each call placed on its own (max/mean %.2f before the kill, %.2f after), none on the killed backend\n",
		spreadBefore, spreadAfter)
	return nil
}

// callsByBackend sums a phase's calls by the backend that answered them.
func callsByBackend(p *phase) map[string]int {
	m := map[string]int{}
	for _, answered := range p.answered {
		for name, n := range answered {
			m[name] += n
		}
	}
	return m
}

// reportModern prints a phase's table of calls per backend and its checks,
// and returns the max/mean of calls over the live backends and the phase's
// failures. killed, if set, is listed as such.
func (d *demo) reportModern(p *phase, killed *mcpbackend.Backend) (float64, []string) {
	calls := callsByBackend(p)
	clients := map[string]int{} // clients with a call answered by the backend
	reached, withCalls := 0, 0  // backends each client reached, summed; clients that made a call
	for _, answered := range p.answered {
		for name := range answered {
			clients[name]++
		}
		if len(answered) > 0 {
			reached += len(answered)
			withCalls++
		}
	}
	total, most, live := 0, 0, 0
	nameWidth := len("backend")
	for _, b := range d.backends {
		total += calls[b.Name]
		most = max(most, calls[b.Name])
		if b != killed {
			live++
		}
		nameWidth = max(nameWidth, len(b.Name))
	}
	// One bar character per call, or per unit calls when there are more
	// than fit.
	unit := (d.opts.Sessions*d.opts.Calls + demoBarWidth - 1) / demoBarWidth

	fmt.Fprintf(d.out, "   %-*s  %6s  %5s  %7s\n", nameWidth, "backend", "calls", "share", "clients")
	for _, b := range d.backends {
		n := calls[b.Name]
		if b == killed && n == 0 {
			fmt.Fprintf(d.out, "   %-*s  %6s  %5s  %7s  (killed)\n", nameWidth, b.Name, "-", "-", "-")
			continue
		}
		share := 0.0
		if total > 0 {
			share = 100 * float64(n) / float64(total)
		}
		bar := strings.Repeat("#", (n+unit-1)/unit)
		row := fmt.Sprintf("   %-*s  %6d  %4.0f%%  %7d  %s", nameWidth, b.Name, n, share, clients[b.Name], bar)
		fmt.Fprintln(d.out, strings.TrimRight(row, " "))
	}
	spread := 0.0
	if total > 0 {
		scale := ""
		if unit > 1 {
			scale = fmt.Sprintf(" (# = %d calls)", unit)
		}
		spread = float64(most) / (float64(total) / float64(live))
		fmt.Fprintf(d.out, "   max/mean %.2f over %d backends%s\n", spread, live, scale)
		fmt.Fprintf(d.out, "   each client's calls reached %.1f backends on average: every call is its own pick\n",
			float64(reached)/float64(withCalls))
	}

	var failures []string
	n := countErrors(p.errs)
	fmt.Fprintf(d.out, "   %d client errors\n", n)
	if n > 0 {
		shown := 0
		for _, err := range p.errs {
			if err != nil && shown < 3 {
				fmt.Fprintf(d.out, "     %v\n", err)
				shown++
			}
		}
		failures = append(failures, fmt.Sprintf("%d client errors", n))
	}
	return spread, failures
}

// checkModernClients prints what makes this era after the first phase p:
// every client got 2026-07-28 and no session id, tether recorded no
// session, and tether counted every request as modern. It returns the
// failures.
func (d *demo) checkModernClients(ctx context.Context, p *phase) []string {
	var failures []string
	connected, otherVersion, withID := 0, 0, 0
	for _, cs := range d.sessions {
		if cs == nil {
			continue
		}
		connected++
		if cs.InitializeResult().ProtocolVersion != eraModern {
			otherVersion++
		}
		if cs.ID() != "" {
			withID++
		}
	}
	stored := server.StoreStats(d.tether.Store()).Sessions
	fmt.Fprintf(d.out, "   clients at %s: %d of %d; with a session id: %d; sessions in tether's store: %d\n",
		eraModern, connected-otherVersion, connected, withID, stored)
	if otherVersion > 0 {
		failures = append(failures, fmt.Sprintf("%d clients did not get %s", otherVersion, eraModern))
	}
	if withID+stored > 0 {
		failures = append(failures, fmt.Sprintf("sessions at %s: %d client ids, %d in tether's store", eraModern, withID, stored))
	}

	// tether counts a request once it has answered it, a moment after the
	// client has the answer: wait (boundedly) for one server/discover per
	// connected client and every call answered.
	want := connected
	for _, n := range p.calls {
		want += n
	}
	var byEra map[string]int
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(demoMetricsWait)
	for {
		var err error
		if byEra, err = d.requestsByEra(ctx); err != nil {
			return append(failures, err.Error())
		}
		if byEra["modern"]+byEra["legacy"] >= want {
			break
		}
		select {
		case <-tick.C:
			continue
		case <-deadline:
		case <-ctx.Done():
			return append(failures, interrupted(ctx).Error())
		}
		break
	}
	fmt.Fprintf(d.out, "   tether_requests_total: %d era=\"modern\", %d era=\"legacy\" (%d server/discover and %d tools/call, each validated and placed on its own)\n",
		byEra["modern"], byEra["legacy"], connected, want-connected)
	if byEra["legacy"] > 0 || byEra["modern"] == 0 {
		failures = append(failures, fmt.Sprintf("tether counted %d requests as legacy, %d as modern", byEra["legacy"], byEra["modern"]))
	}
	return failures
}

// requestsByEra sums tether_requests_total by its era label, as tether's
// admin endpoint reports it.
func (d *demo) requestsByEra(ctx context.Context) (map[string]int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.tether.AdminAddr().String()+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	resp, err := (&http.Client{Transport: d.transport}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: status %d", resp.StatusCode)
	}
	m := map[string]int{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "tether_requests_total{") {
			continue
		}
		_, rest, ok := strings.Cut(line, `era="`)
		if !ok {
			continue
		}
		era, _, _ := strings.Cut(rest, `"`)
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: %q: %w", line, err)
		}
		m[era] += int(v)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return m, nil
}
