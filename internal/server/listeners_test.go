package server

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/testkit"
)

// The listeners' limits, as a client sees them.

// The h2c listener announces bounded settings: concurrent streams, the
// frame size (Go's default of 1 MiB lets every connection pin a 1 MiB read
// buffer) and the flow-control windows.
func TestH2CSettings(t *testing.T) {
	s := startServer(t, testConfig(t, testkit.PingBackend(t).URL))
	conn, err := net.Dial("tcp", s.ClientAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	// Client preface and an empty SETTINGS frame (RFC 9113 §3.4, §6.5).
	io.WriteString(conn, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	conn.Write([]byte{0, 0, 0, 0x4, 0, 0, 0, 0, 0})
	r := bufio.NewReader(conn)
	var hdr [9]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		t.Fatal(err)
	}
	length := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	if hdr[3] != 0x4 || length%6 != 0 || length > 1024 {
		t.Fatalf("first frame: type %d, length %d; want SETTINGS", hdr[3], length)
	}
	payload := make([]byte, length)
	if _, err := io.ReadFull(r, payload); err != nil {
		t.Fatal(err)
	}
	got := map[uint16]uint32{}
	for i := 0; i < length; i += 6 {
		got[binary.BigEndian.Uint16(payload[i:])] = binary.BigEndian.Uint32(payload[i+2:])
	}
	for id, want := range map[uint16]uint32{
		0x3: DefaultHTTP2MaxConcurrentStreams, // SETTINGS_MAX_CONCURRENT_STREAMS
		0x4: h2ReceiveBuffer,                  // SETTINGS_INITIAL_WINDOW_SIZE
		0x5: h2MaxReadFrameSize,               // SETTINGS_MAX_FRAME_SIZE
	} {
		if got[id] != want {
			t.Errorf("setting 0x%x = %d, want %d", id, got[id], want)
		}
	}
	if v, ok := got[0x6]; !ok || v > 2*clientMaxHeaderBytes { // SETTINGS_MAX_HEADER_LIST_SIZE
		t.Errorf("SETTINGS_MAX_HEADER_LIST_SIZE %d (sent: %v), want about %d", v, ok, clientMaxHeaderBytes)
	}
}

// The admin listener bounds what a client may send and how long it may
// take: oversized headers get 431, and a request whose body never comes
// is cut at the read timeout (old main: no read timeout, held for ever).
func TestAdminListenerLimits(t *testing.T) {
	t.Parallel()
	s := startServer(t, testConfig(t, testkit.PingBackend(t).URL))
	admin := s.AdminAddr().String()

	req, _ := http.NewRequest(http.MethodGet, "http://"+admin+"/healthz", nil)
	req.Header.Set("X-Padding", strings.Repeat("a", 2*adminMaxHeaderBytes))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("%d KiB of headers: %d, want 431", 2*adminMaxHeaderBytes>>10, resp.StatusCode)
	}

	conn, err := net.Dial("tcp", admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
	// Whatever the server answers, it must then close the connection.
	conn.SetReadDeadline(time.Now().Add(adminReadTimeout + 20*time.Second))
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Errorf("a request without its body held the admin connection: %v", err)
	}
}
