package session_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-mcp/tether/internal/redistest"
	"github.com/tether-mcp/tether/internal/session"
)

// task returns a task record as the proxy builds it from a creation result.
func task(id string, ttl time.Duration) session.TaskRecord {
	return session.TaskRecord{
		TaskID:     id,
		BackendID:  "10.0.1.7:8080/pod-uid-0",
		BackendURL: "http://10.0.1.7:8080/mcp",
		Principal:  "v1:3q2-7w0nT2m6Yw8pZC1dXg",
		TTL:        ttl,
	}
}

type newTaskStoreFunc func(t *testing.T, now func() time.Time) session.TaskStore

// testTaskStore is the contract every TaskStore keeps.
func testTaskStore(t *testing.T, newStore newTaskStoreFunc) {
	t.Run("round trip and effective TTL", func(t *testing.T) {
		clock := newFakeClock()
		s := newStore(t, clock.Now)
		ctx := t.Context()
		for _, tt := range []struct {
			id       string
			ttl, eff time.Duration
		}{
			{"given", 90 * time.Second, 90 * time.Second},
			{"absent", 0, session.DefaultTaskTTL},
			{"unlimited", session.TaskTTLUnlimited, session.MaxTaskTTL},
			{"too long", 10 * session.MaxTaskTTL, session.MaxTaskTTL},
		} {
			in := task("task-"+tt.id, tt.ttl)
			if err := s.PutTask(ctx, in); err != nil {
				t.Fatalf("%s: %v", tt.id, err)
			}
			got, err := s.GetTask(ctx, in.TaskID)
			if err != nil {
				t.Fatalf("%s: %v", tt.id, err)
			}
			want := in
			want.Created, want.TTL = epoch, tt.eff
			if !got.Created.Equal(want.Created) {
				t.Errorf("%s: created %v, want %v", tt.id, got.Created, want.Created)
			}
			got.Created = want.Created
			if got != want {
				t.Errorf("%s: got %+v, want %+v", tt.id, got, want)
			}
		}
		if _, err := s.GetTask(ctx, "never-created"); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("unknown task: %v, want ErrNotFound", err)
		}
		if err := s.PutTask(ctx, task("", time.Minute)); err == nil {
			t.Error("a task without an id was stored")
		}
	})

	t.Run("expiry", func(t *testing.T) {
		clock := newFakeClock()
		s := newStore(t, clock.Now)
		ctx := t.Context()
		if err := s.PutTask(ctx, task("t", time.Minute)); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Minute - time.Millisecond)
		if _, err := s.GetTask(ctx, "t"); err != nil {
			t.Fatalf("1ms before its TTL: %v", err)
		}
		clock.Advance(time.Millisecond)
		if _, err := s.GetTask(ctx, "t"); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("at its TTL: %v, want ErrNotFound", err)
		}
		if err := s.DeleteTask(ctx, "t"); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("delete of an expired task: %v, want ErrNotFound", err)
		}
		// An expired id may be taken by another backend.
		other := task("t", time.Minute)
		other.BackendID = "10.0.1.8:8080/pod-uid-1"
		if err := s.PutTask(ctx, other); err != nil {
			t.Fatalf("put over an expired record: %v", err)
		}
		if got, err := s.GetTask(ctx, "t"); err != nil || got.BackendID != other.BackendID {
			t.Fatalf("got %+v, %v; want the new backend's record", got, err)
		}
	})

	t.Run("never changes hands", func(t *testing.T) {
		clock := newFakeClock()
		s := newStore(t, clock.Now)
		ctx := t.Context()
		first := task("t", time.Hour)
		if err := s.PutTask(ctx, first); err != nil {
			t.Fatal(err)
		}
		otherBackend := first
		otherBackend.BackendID = "10.0.1.8:8080/pod-uid-1"
		otherPrincipal := first
		otherPrincipal.Principal = "v1:someone-else"
		for name, r := range map[string]session.TaskRecord{"backend": otherBackend, "principal": otherPrincipal} {
			if err := s.PutTask(ctx, r); !errors.Is(err, session.ErrExists) {
				t.Errorf("put of another %s: %v, want ErrExists", name, err)
			}
		}
		got, err := s.GetTask(ctx, "t")
		if err != nil || got.BackendID != first.BackendID || got.Principal != first.Principal {
			t.Fatalf("after refused puts: %+v, %v; want the first record", got, err)
		}
		// The same backend and principal refresh the record (a new TTL).
		clock.Advance(30 * time.Minute)
		refreshed := first
		refreshed.TTL = 2 * time.Hour
		if err := s.PutTask(ctx, refreshed); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Hour) // past the first TTL, within the new one
		if got, err := s.GetTask(ctx, "t"); err != nil || got.TTL != 2*time.Hour {
			t.Fatalf("after a refresh: %+v, %v", got, err)
		}
	})

	t.Run("delete", func(t *testing.T) {
		clock := newFakeClock()
		s := newStore(t, clock.Now)
		ctx := t.Context()
		for _, id := range []string{"a", "b"} {
			if err := s.PutTask(ctx, task(id, time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.DeleteTask(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetTask(ctx, "a"); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("get after delete: %v", err)
		}
		if err := s.DeleteTask(ctx, "a"); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("second delete: %v", err)
		}
		if _, err := s.GetTask(ctx, "b"); err != nil {
			t.Errorf("the other task: %v", err)
		}
	})
}

func TestMemoryTaskStore(t *testing.T) {
	testTaskStore(t, func(t *testing.T, now func() time.Time) session.TaskStore {
		m := session.NewMemory(session.MemoryOptions{Now: now})
		t.Cleanup(func() { m.Close() })
		return m
	})
}

func TestRedisTaskStore(t *testing.T) {
	srv := redistest.Start(t)
	n := 0
	testTaskStore(t, func(t *testing.T, now func() time.Time) session.TaskStore {
		n++ // a fresh key space per subtest
		return newRedisStore(t, srv, session.RedisOptions{Prefix: "t" + string(rune('a'+n)) + ":", Now: now})
	})
}

func TestCacheTaskStore(t *testing.T) {
	srv := redistest.Start(t)
	n := 0
	testTaskStore(t, func(t *testing.T, now func() time.Time) session.TaskStore {
		n++
		shared := newRedisStore(t, srv, session.RedisOptions{Prefix: "c" + string(rune('a'+n)) + ":", Now: now})
		c := session.NewCache(session.CacheOptions{Shared: shared, Now: now})
		t.Cleanup(func() { c.Close() })
		return c
	})
}

// The memory store holds at most MaxTasks task records: past it, the least
// recently used go (expired ones first), counted, and sessions are not
// touched.
func TestMemoryTaskBound(t *testing.T) {
	clock := newFakeClock()
	var evicted atomic.Int64
	m := session.NewMemory(session.MemoryOptions{Now: clock.Now, MaxTasks: 3, OnTaskEvict: func() { evicted.Add(1) }})
	t.Cleanup(func() { m.Close() })
	ctx := t.Context()
	if err := m.Create(ctx, rec("session")); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if err := m.PutTask(ctx, task(id, time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.GetTask(ctx, "a"); err != nil { // a is used: b is now the oldest unused
		t.Fatal(err)
	}
	if err := m.PutTask(ctx, task("d", time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.GetTask(ctx, "b"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("b (least recently used): %v, want evicted", err)
	}
	for _, id := range []string{"a", "c", "d"} {
		if _, err := m.GetTask(ctx, id); err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}
	st := m.Stats()
	if st.Tasks != 3 || st.EvictedMaxTasks != 1 || evicted.Load() != 1 || st.Sessions != 1 {
		t.Errorf("stats %+v, OnTaskEvict told %d; want 3 tasks, 1 eviction, the session kept", st, evicted.Load())
	}

	// A task expired when the bound is reached leaves as an expiry, not an
	// eviction.
	m2 := session.NewMemory(session.MemoryOptions{Now: clock.Now, MaxTasks: 2, OnTaskEvict: func() { evicted.Add(1) }})
	t.Cleanup(func() { m2.Close() })
	evicted.Store(0)
	if err := m2.PutTask(ctx, task("short", time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := m2.PutTask(ctx, task("long", time.Hour)); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if err := m2.PutTask(ctx, task("new", time.Hour)); err != nil {
		t.Fatal(err)
	}
	if st := m2.Stats(); st.Tasks != 2 || st.EvictedMaxTasks != 0 || evicted.Load() != 0 {
		t.Errorf("after an expired task made room: stats %+v, OnTaskEvict told %d; want no eviction", st, evicted.Load())
	}
	for _, id := range []string{"long", "new"} {
		if _, err := m2.GetTask(ctx, id); err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}
}

// Expired task records are removed by the sweep, live ones kept.
func TestMemorySweepTasks(t *testing.T) {
	clock := newFakeClock()
	m := session.NewMemory(session.MemoryOptions{Now: clock.Now})
	t.Cleanup(func() { m.Close() })
	ctx := t.Context()
	for i, ttl := range []time.Duration{time.Minute, time.Minute, time.Hour} {
		if err := m.PutTask(ctx, task(string(rune('a'+i)), ttl)); err != nil {
			t.Fatal(err)
		}
	}
	if n := m.SweepTasks(clock.Now()); n != 0 {
		t.Errorf("swept %d live tasks", n)
	}
	clock.Advance(time.Minute)
	if n := m.SweepTasks(clock.Now()); n != 2 || m.Stats().Tasks != 1 {
		t.Errorf("swept %d, %d left; want 2 swept, 1 left", n, m.Stats().Tasks)
	}
	if _, err := m.GetTask(ctx, "c"); err != nil {
		t.Errorf("the live task: %v", err)
	}
}

// GetTask on the memory store does not allocate: it is on the path of
// every task poll.
func TestMemoryGetTaskDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	m := session.NewMemory(session.MemoryOptions{})
	t.Cleanup(func() { m.Close() })
	ctx := context.Background()
	if err := m.PutTask(ctx, task("t", time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := m.GetTask(ctx, "t"); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("GetTask allocates %.1f times", n)
	}
}

// Redis keeps one key per task, expiring with the task (PEXPIRE), and
// nothing else.
func TestRedisTaskKey(t *testing.T) {
	srv := redistest.Start(t)
	s := newRedisStore(t, srv, session.RedisOptions{})
	raw := rawClient(t, srv)
	ctx := t.Context()
	if err := s.PutTask(ctx, task("k", 90*time.Second)); err != nil {
		t.Fatal(err)
	}
	keys, err := raw.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(keys, ",") != "tether:t:k" {
		t.Fatalf("keys %q, want just tether:t:k", keys)
	}
	ttl, err := raw.PTTL(ctx, "tether:t:k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= 80*time.Second || ttl > 90*time.Second {
		t.Errorf("PTTL %v, want the task's 90s", ttl)
	}
	fields, err := raw.HGetAll(ctx, "tether:t:k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if fields["b"] != "10.0.1.7:8080/pod-uid-0" || fields["p"] != "v1:3q2-7w0nT2m6Yw8pZC1dXg" {
		t.Errorf("stored fields %v: backend and principal missing", fields)
	}
}

// Malformed replies to the task commands are errors for the one call,
// never a panic, a record, or a not-found.
func TestRedisTaskHostileReplies(t *testing.T) {
	good := map[string]string{"b": "pod-1", "u": "http://10.0.1.7:8080/mcp", "p": "", "c": "1772366400000", "e": "99999999999999"}
	record := func(field, value string) []byte {
		var ss []string
		for k, v := range good {
			if k == field {
				v = value
			}
			ss = append(ss, k, v)
		}
		return redistest.Bulks(ss...)
	}
	get := func(ctx context.Context, s *session.Redis) error {
		got, err := s.GetTask(ctx, "t")
		if got != (session.TaskRecord{}) {
			t.Errorf("GetTask returned a record %+v with %v", got, err)
		}
		return err
	}
	put := func(ctx context.Context, s *session.Redis) error { return s.PutTask(ctx, task("t", time.Minute)) }
	del := func(ctx context.Context, s *session.Redis) error { return s.DeleteTask(ctx, "t") }

	const bad, down = "bad reply", "unavailable"
	tests := []struct {
		name  string
		cmd   string
		reply []byte
		call  func(context.Context, *session.Redis) error
		want  string
	}{
		{"get: non-numeric expiry", "HGETALL", record("e", "soon"), get, bad},
		{"get: negative creation", "HGETALL", record("c", "-1"), get, bad},
		{"get: expiry beyond 2^53", "HGETALL", record("e", "99999999999999999999"), get, bad},
		{"get: no backend", "HGETALL", record("b", ""), get, bad},
		{"get: expiry before creation", "HGETALL", record("e", "1"), get, bad},
		{"get: integer instead of a hash", "HGETALL", redistest.Int(1), get, down},
		{"get: odd field count", "HGETALL", redistest.Bulks("b", "1", "c"), get, down},
		{"get: nil", "HGETALL", redistest.NilArray(), get, bad},
		{"get: map length out of range", "HGETALL", redistest.Raw("*99999999999998\r\n"), get, down},
		{"put: unknown result", "EVALSHA", redistest.Int(7), put, bad},
		{"put: string result", "EVALSHA", redistest.Bulk("x"), put, bad},
		{"put: array result", "EVALSHA", redistest.Array(), put, bad},
		{"put: nil", "EVALSHA", redistest.NilBulk(), put, bad},
		{"put: error reply", "EVALSHA", redistest.Error("ERR boom"), put, down},
		{"delete: unknown result", "EVALSHA", redistest.Int(-1), del, bad},
		{"delete: status result", "EVALSHA", redistest.Status("OK"), del, bad},
		{"delete: nesting 100 deep", "EVALSHA", redistest.Raw(strings.Repeat("*1\r\n", 100) + ":1\r\n"), del, down},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := fakeStore(t, answering(tt.cmd, tt.reply))
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			err := tt.call(ctx, s)
			switch {
			case err == nil:
				t.Fatal("no error")
			case errors.Is(err, session.ErrNotFound), errors.Is(err, session.ErrExists):
				t.Fatalf("error %v: a malformed reply must not look like an answer", err)
			case tt.want == bad && !errors.Is(err, session.ErrBadReply):
				t.Errorf("error %v, want ErrBadReply", err)
			case tt.want == down && !errors.Is(err, session.ErrUnavailable):
				t.Errorf("error %v, want ErrUnavailable", err)
			}
		})
	}
}

// Concurrent puts, reads and deletes over several shards keep the bound
// and never return another task's record.
func TestMemoryTasksConcurrent(t *testing.T) {
	const maxTasks, workers, perWorker = 4096, 4, 3000
	m := session.NewMemory(session.MemoryOptions{MaxTasks: maxTasks})
	t.Cleanup(func() { m.Close() })
	ctx := t.Context()
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := range perWorker {
				id := strconv.Itoa(w) + "-" + strconv.Itoa(i)
				r := task(id, time.Hour)
				r.BackendID = "pod-" + id
				if err := m.PutTask(ctx, r); err != nil {
					errs <- err
					return
				}
				got, err := m.GetTask(ctx, id)
				if err == nil && got.BackendID != r.BackendID {
					errs <- fmt.Errorf("task %s: got backend %s", id, got.BackendID)
					return
				}
				if i%3 == 0 {
					m.DeleteTask(ctx, id) // may race an eviction: either way it is gone
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// 8,000 tasks outlive their deletes: the bound was reached.
	if st := m.Stats(); st.Tasks > maxTasks || st.EvictedMaxTasks == 0 {
		t.Errorf("%d task records held and %d evicted, bound %d", st.Tasks, st.EvictedMaxTasks, maxTasks)
	}
}
