package discovery

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestNewStatic(t *testing.T) {
	s, err := NewStatic([]string{"http://127.0.0.1:9002/", " http://127.0.0.1:9001/mcp ", "https://[::1]:9443"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ep := range s.snapshot.Endpoints {
		if ep.State != Ready {
			t.Errorf("%s: state %v", ep.ID, ep.State)
		}
		got = append(got, ep.ID+" "+ep.URL.Path)
	}
	want := []string{"http://127.0.0.1:9001/mcp /mcp", "http://127.0.0.1:9002 ", "https://[::1]:9443 "}
	if diff := cmp.Diff(got, want); diff != "" {
		t.Errorf("endpoints (-got +want):\n%s", diff)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var snaps []Snapshot
	done := make(chan error)
	go func() { done <- s.Run(ctx, func(s Snapshot) { snaps = append(snaps, s) }) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 1 || len(snaps[0].Endpoints) != 3 {
		t.Errorf("Run published %v", snaps)
	}
}

func TestNewStaticErrors(t *testing.T) {
	for _, tt := range []struct {
		urls []string
		want string
	}{
		{nil, "empty"},
		{[]string{"127.0.0.1:9001"}, "scheme"},
		{[]string{"ftp://h:1"}, "scheme"},
		{[]string{"http://"}, "missing host"},
		{[]string{"http://u:p@h:1"}, "user info"},
		{[]string{"http://h:1/?a=b"}, "query"},
		{[]string{"http://h:1", "http://h:1/"}, "twice"},
	} {
		_, err := NewStatic(tt.urls)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewStatic(%q) = %v, want error containing %q", tt.urls, err, tt.want)
		}
	}
}
