package testca

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
)

// A client that trusts the CA's PEM accepts the issued pair for 127.0.0.1
// and localhost, and sees the serial it was issued with.
func TestIssuedPairServesLoopback(t *testing.T) {
	ca := New(t)
	certFile, keyFile := ca.Issue(t, t.TempDir(), 42)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca.PEM) {
		t.Fatal("the CA's PEM holds no certificate")
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	for _, host := range []string{"127.0.0.1", "localhost"} {
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, ServerName: host})
		if err != nil {
			t.Errorf("%s:%s: %v", host, port, err)
			continue
		}
		if got := c.ConnectionState().PeerCertificates[0].SerialNumber.Int64(); got != 42 {
			t.Errorf("serial %d, want 42", got)
		}
		c.Close()
	}
}
