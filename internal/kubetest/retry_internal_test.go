package kubetest

import (
	"net"
	"testing"
)

// A port found free and taken before the server binds it costs a restart
// on other ports, not the test: here every first pick is a port the test
// holds.
func TestStartRetriesALostBind(t *testing.T) {
	Require(t)
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldPort := held.Addr().(*net.TCPAddr).Port
	picks := 0
	findPorts = func(t testing.TB, host string, n int) []int {
		picks++
		ports := freePorts(t, host, n)
		if picks == 1 || picks == 3 { // etcd's first pick, the API server's
			ports[0] = heldPort
		}
		return ports
	}
	defer func() { findPorts = freePorts }()

	env := Start(t, Options{})
	if picks != 4 {
		t.Errorf("ports picked %d times, want 4 (etcd twice, the API server twice)", picks)
	}
	if _, err := env.AdminClient().Discovery().ServerVersion(); err != nil {
		t.Fatalf("API server after the retries: %v", err)
	}
}
