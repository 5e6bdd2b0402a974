package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/server"
	"github.com/tether-mcp/tether/internal/testkit"
)

// startServer runs tether on ephemeral loopback ports in front of backends.
func startServer(t *testing.T, backends ...string) *server.Server {
	t.Helper()
	return startServerWith(t, nil, backends...)
}

// startServerWith is startServer with tune applied to the configuration.
func startServerWith(t *testing.T, tune func(*config), backends ...string) *server.Server {
	t.Helper()
	return startServerPrepared(t, tune, nil, backends...)
}

// startServerPrepared is startServerWith with prepare applied to the
// server's configuration, as the flags give it, before the server starts.
func startServerPrepared(t *testing.T, tune func(*config), prepare func(*server.Config), backends ...string) *server.Server {
	t.Helper()
	cfg := defaultConfig()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Backends = backends
	if tune != nil {
		tune(&cfg)
	}
	sc, err := serverConfig(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		prepare(&sc)
	}
	s, err := listen(sc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	testkit.Eventually(t, 10*time.Second, func() bool { return testkit.Status("http://"+s.AdminAddr().String()+"/readyz") == 200 }, "ready")
	return s
}

// The client listener speaks HTTP/2 without TLS to clients that know it
// (prior knowledge), and never upgrades an HTTP/1.1 connection.
func TestClientListenerH2CPriorKnowledgeOnly(t *testing.T) {
	s := startServer(t, testkit.PingBackend(t).URL)
	addr := s.ClientAddr().String()

	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: &protos, TLSClientConfig: &tls.Config{}}}
	resp, err := h2c.Post("http://"+addr+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Errorf("h2c prior knowledge: %s %s, want HTTP/2.0 200", resp.Proto, resp.Status)
	}

	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	r, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != 200 || r.ProtoMajor != 1 {
		t.Errorf("Upgrade: h2c answered %s %s, want HTTP/1.1 200 (no upgrade)", r.Proto, r.Status)
	}
}

func TestAdminEndpoints(t *testing.T) {
	s := startServer(t, testkit.PingBackend(t).URL)
	admin := "http://" + s.AdminAddr().String()
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/nope": 404} {
		if got := testkit.Status(admin + path); got != want {
			t.Errorf("GET %s: %d, want %d", path, got, want)
		}
	}
}
