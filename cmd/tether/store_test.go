package main

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tether-mcp/tether/internal/session"
	"github.com/tether-mcp/tether/internal/telemetry"
)

// --max-sessions and --max-session-init-bytes bound the memory store, and
// its evictions show on /metrics by reason.
func TestStoreBoundsAndEvictionMetric(t *testing.T) {
	cfg := defaultConfig()
	cfg.MaxSessions, cfg.MaxSessionInitBytes = 2, 1<<20
	var expired []string
	store, err := newStore(cfg, slog.New(slog.DiscardHandler), nil, func(r *session.Record) { expired = append(expired, r.ClientSID) })
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for _, id := range []string{"a", "b", "c"} {
		if err := store.Create(context.Background(), &session.Record{ClientSID: id, BackendID: "pod-1", Init: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if len(expired) != 1 || expired[0] != "a" {
		t.Errorf("evicted %v, want [a]", expired)
	}
	m := telemetry.NewMetrics(telemetry.MetricsOptions{Store: func() telemetry.StoreStat { return storeStat(store) }})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`tether_session_evictions_total{reason="max_sessions"} 1`,
		`tether_session_evictions_total{reason="max_init_bytes"} 0`,
		"tether_session_records 2",
		"tether_session_init_bytes 2",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
