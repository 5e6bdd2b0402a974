package session_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
)

func newRedisStore(t *testing.T, srv *redistest.Server, opts session.RedisOptions) *session.Redis {
	t.Helper()
	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	opts.Client = session.NewRedisClient(opt, 200*time.Millisecond) // -race on 2 cores is slow
	if opts.Timeout == 0 {
		opts.Timeout = 200 * time.Millisecond
	}
	s := session.NewRedis(opts)
	t.Cleanup(func() { s.Close() })
	return s
}

// The Redis store keeps the same contract as the memory store.
func TestRedisStoreContract(t *testing.T) {
	srv := redistest.Start(t)
	n := 0
	testStore(t, func(t *testing.T, now func() time.Time) session.Store {
		n++ // a fresh key space per subtest
		return newRedisStore(t, srv, session.RedisOptions{Prefix: "t" + string(rune('a'+n)) + ":", Now: now})
	})
}

func TestRedisTTLAndMaxAge(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	s := newRedisStore(t, srv, session.RedisOptions{TTL: 10 * time.Minute, MaxAge: 25 * time.Minute, Now: clock.Now})
	ctx := t.Context()
	if err := s.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}

	clock.Advance(9 * time.Minute)
	if err := s.Touch(ctx, "a", clock.Now()); err != nil { // idle TTL now ends at 19m
		t.Fatal(err)
	}
	clock.Advance(9 * time.Minute) // 18m: alive thanks to the touch
	if _, err := s.Get(ctx, "a"); err != nil {
		t.Fatalf("at 18m after a touch at 9m: %v", err)
	}
	if err := s.Touch(ctx, "a", clock.Now()); err != nil { // would be 28m, capped at 25m
		t.Fatal(err)
	}
	clock.Advance(6 * time.Minute) // 24m
	if _, err := s.Get(ctx, "a"); err != nil {
		t.Fatalf("at 24m: %v", err)
	}
	clock.Advance(time.Minute) // 25m: the absolute cap
	if _, err := s.Get(ctx, "a"); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("at the max age: %v, want ErrNotFound", err)
	}
	if err := s.Touch(ctx, "a", clock.Now()); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("touch revived an expired record: %v", err)
	}

	// Idle expiry without touches.
	if err := s.Create(ctx, rec("b")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(10 * time.Minute)
	if _, err := s.Get(ctx, "b"); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("after the idle TTL: %v, want ErrNotFound", err)
	}
}

// Redis itself drops records: the key carries the remaining lifetime.
func TestRedisPhysicalExpiry(t *testing.T) {
	srv := redistest.Start(t)
	s := newRedisStore(t, srv, session.RedisOptions{TTL: 300 * time.Millisecond})
	ctx := t.Context()
	if err := s.Create(ctx, rec("gone")); err != nil {
		t.Fatal(err)
	}
	opt, _ := redis.ParseURL(srv.URL())
	raw := redis.NewClient(opt)
	defer raw.Close()
	ttl, err := raw.PTTL(ctx, "tether:s:gone").Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= 0 || ttl > 300*time.Millisecond {
		t.Errorf("key TTL %v, want (0, 300ms]", ttl)
	}
}

// Fleet-wide live sessions per backend come from the sorted sets, which
// follow creates, moves, deletes and expiry.
func TestRedisBackendSessions(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	s := newRedisStore(t, srv, session.RedisOptions{TTL: time.Minute, Now: clock.Now})
	ctx := t.Context()
	for _, id := range []string{"a", "b", "c"} {
		r := rec(id)
		r.BackendID = "pod-1"
		if err := s.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := s.Get(ctx, "a")
	moved := a.Clone()
	moved.BackendID = "pod-2"
	if _, err := s.Swap(ctx, a, moved); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	got, err := s.BackendSessions(ctx, []string{"pod-1", "pod-2", "pod-3"})
	if err != nil {
		t.Fatal(err)
	}
	if got["pod-1"] != 1 || got["pod-2"] != 1 || got["pod-3"] != 0 {
		t.Errorf("sessions per backend %v, want pod-1:1 pod-2:1 pod-3:0", got)
	}
	clock.Advance(2 * time.Minute)
	got, _ = s.BackendSessions(ctx, []string{"pod-1", "pod-2"})
	if got["pod-1"] != 0 || got["pod-2"] != 0 {
		t.Errorf("after expiry %v, want none", got)
	}
}

// Swap and Delete announce the change so that other replicas drop their
// cached copy.
func TestRedisInvalidations(t *testing.T) {
	srv := redistest.Start(t)
	s := newRedisStore(t, srv, session.RedisOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got := make(chan string, 4)
	go s.Invalidations(ctx, func(sid string) { got <- sid }, func() {}, nil)
	// Subscribing is asynchronous: publish until the subscriber hears it.
	if err := s.Create(ctx, rec("x")); err != nil {
		t.Fatal(err)
	}
	for {
		cur, err := s.Get(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Swap(ctx, cur, cur.Clone()); err != nil {
			t.Fatal(err)
		}
		select {
		case sid := <-got:
			if sid != "x" {
				t.Fatalf("invalidation for %q", sid)
			}
			if _, err := s.Delete(ctx, "x"); err != nil {
				t.Fatal(err)
			}
			select {
			case sid := <-got:
				for sid == "x" && len(got) > 0 { // drain earlier swaps
					sid = <-got
				}
				return
			case <-ctx.Done():
				t.Fatal("no invalidation for Delete")
			}
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("no invalidation for Swap")
		}
	}
}

// A Redis that is down or frozen answers within the call budget with
// ErrUnavailable, never after go-redis' 5 s default read timeout.
func TestRedisOutageIsBounded(t *testing.T) {
	srv := redistest.Start(t)
	s := newRedisStore(t, srv, session.RedisOptions{Timeout: 50 * time.Millisecond})
	ctx := t.Context()
	if err := s.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	for name, breakIt := range map[string]func(){"frozen": srv.Freeze, "killed": srv.Kill} {
		breakIt()
		start := time.Now()
		_, err := s.Get(ctx, "a")
		if !errors.Is(err, session.ErrUnavailable) {
			t.Errorf("%s: Get = %v, want ErrUnavailable", name, err)
		}
		// Generous bound (race detector, loaded machine); the point is that
		// it is nowhere near the 5 s default.
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%s: Get took %v", name, d)
		}
		srv.Thaw()
	}
}

// Regression: a session deleted through one replica while another was
// writing back its cached copy (after Redis lost its data) came back. A
// delete leaves a tombstone that refuses write-backs; a new session may
// still take the id.
func TestRedisDeleteLeavesTombstone(t *testing.T) {
	srv := redistest.Start(t)
	s := newRedisStore(t, srv, session.RedisOptions{})
	ctx := t.Context()
	r := &session.Record{ClientSID: "gone", BackendID: "b1", BackendURL: "http://b1", BackendSID: "gone", Init: []byte(`{}`)}
	if err := s.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	cached, err := s.Get(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(ctx, cached); !errors.Is(err, session.ErrDeleted) {
		t.Fatalf("Restore of a deleted session = %v, want ErrDeleted", err)
	}
	if got, err := s.Get(ctx, "gone"); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("Get after Delete and a write-back = %v, %v; want ErrNotFound", got, err)
	}
	if _, err := s.Delete(ctx, "gone"); !errors.Is(err, session.ErrNotFound) {
		t.Fatalf("second Delete = %v, want ErrNotFound", err)
	}
	if err := s.Create(ctx, r); err != nil {
		t.Fatalf("Create over a tombstone = %v, want nil", err)
	}
	if _, err := s.Get(ctx, "gone"); err != nil {
		t.Fatalf("Get of the new session = %v", err)
	}
}

// Records written before tether stored the initialize's Host and Path (no
// h and pa fields) still decode, with "" for both, are listed with their
// backend, and a Swap gives them next's.
func TestRedisRecordWithoutAddress(t *testing.T) {
	srv := redistest.Start(t)
	s := newRedisStore(t, srv, session.RedisOptions{})
	raw := rawClient(t, srv)
	ctx := t.Context()
	// As the create script of the release before wrote it.
	now := time.Now().UnixMilli()
	exp := now + time.Hour.Milliseconds()
	if err := raw.HSet(ctx, "tether:s:old", "v", "1", "b", "pod-1", "u", "http://10.0.1.7:8080/mcp", "bs", "old",
		"i", `{"jsonrpc":"2.0","id":1,"method":"initialize"}`, "pv", "2025-11-25", "p", "",
		"c", now, "l", now, "e", exp, "r", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := raw.ZAdd(ctx, "tether:b:pod-1", redis.Z{Score: float64(exp), Member: "old"}).Err(); err != nil {
		t.Fatal(err)
	}
	old, err := s.Get(ctx, "old")
	if err != nil || old.BackendID != "pod-1" || old.Host != "" || old.Path != "" {
		t.Fatalf("Get(old) = %+v, %v; want the record on pod-1 with no Host or Path", old, err)
	}
	if got, err := s.SessionsOn(ctx, "pod-1", 10); err != nil || len(got) != 1 || got[0] != "old" {
		t.Errorf("SessionsOn(pod-1) = %q, %v; want [old]", got, err)
	}
	next := old.Clone()
	next.BackendID, next.Host, next.Path = "pod-2", "mcp.example.com", "/mcp"
	if _, err := s.Swap(ctx, old, next); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "old"); err != nil || got.Host != "mcp.example.com" || got.Path != "/mcp" || got.Version != 2 {
		t.Errorf("Get after the Swap = %+v, %v; want next's Host and Path, version 2", got, err)
	}
}
