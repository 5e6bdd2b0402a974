package session_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-mcp/tether/internal/session"
)

// This file is the contract every Store keeps, written against the
// interface so that other stores (Redis) can run it too: call testStore
// with a constructor. The constructor's store must take Created and
// LastUsed from now, must not expire anything within a minute of fake
// time, and must have expired a record idle for two hours.

type newStoreFunc func(t *testing.T, now func() time.Time) session.Store

// fakeClock is a clock tests move by hand; safe for concurrent use.
type fakeClock struct{ ns atomic.Int64 }

var epoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newFakeClock() *fakeClock {
	c := new(fakeClock)
	c.ns.Store(epoch.UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// rec returns a record as the routing layer builds it for a new session.
func rec(id string) *session.Record {
	return &session.Record{
		ClientSID:       id,
		BackendID:       "10.0.1.7:8080/pod-uid-0",
		BackendURL:      "http://10.0.1.7:8080/mcp",
		BackendSID:      id,
		Init:            []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize"}`),
		ProtocolVersion: "2025-11-25",
		Principal:       "v1:3q2-7w0nT2m6Yw8pZC1dXg", // a keyed digest, as the proxy computes it
		// Each from its own request, as the proxy passes them.
		Host: strings.Clone("mcp.example.com:8443"),
		Path: strings.Clone("/tenants/acme/mcp"),
	}
}

// stored returns r as a store holds it after Create at now.
func stored(r *session.Record, now time.Time) *session.Record {
	c := r.Clone()
	c.Version = 1
	c.LastUsed = now
	if c.Created.IsZero() {
		c.Created = now
	}
	return c
}

func testStore(t *testing.T, newStore newStoreFunc) {
	t.Run("GetAbsent", func(t *testing.T) { testGetAbsent(t, newStore) })
	t.Run("CreateGet", func(t *testing.T) { testCreateGet(t, newStore) })
	t.Run("CreateCopies", func(t *testing.T) { testCreateCopies(t, newStore) })
	t.Run("CreateExists", func(t *testing.T) { testCreateExists(t, newStore) })
	t.Run("CreateReplacesExpired", func(t *testing.T) { testCreateReplacesExpired(t, newStore) })
	t.Run("CreateEmptyID", func(t *testing.T) { testCreateEmptyID(t, newStore) })
	t.Run("Swap", func(t *testing.T) { testSwap(t, newStore) })
	t.Run("SwapVersions", func(t *testing.T) { testSwapVersions(t, newStore) })
	t.Run("SwapKeepsPrincipal", func(t *testing.T) { testSwapKeepsPrincipal(t, newStore) })
	t.Run("Address", func(t *testing.T) { testAddress(t, newStore) })
	t.Run("Delete", func(t *testing.T) { testDelete(t, newStore) })
	t.Run("TouchAbsent", func(t *testing.T) { testTouchAbsent(t, newStore) })
}

func testGetAbsent(t *testing.T, newStore newStoreFunc) {
	s := newStore(t, newFakeClock().Now)
	got, err := s.Get(t.Context(), "nope")
	if !errors.Is(err, session.ErrNotFound) || got != nil {
		t.Fatalf("Get(absent) = %v, %v; want nil, ErrNotFound", got, err)
	}
}

func testCreateGet(t *testing.T, newStore newStoreFunc) {
	clock := newFakeClock()
	s := newStore(t, clock.Now)
	ctx := t.Context()

	withCreated := rec("b")
	withCreated.Created = epoch.Add(-time.Minute)
	withCreated.LastUsed = epoch.Add(-time.Minute) // the store's clock wins
	withCreated.Version = 42                       // the store's numbering wins

	for _, r := range []*session.Record{rec("a"), withCreated} {
		if err := s.Create(ctx, r); err != nil {
			t.Fatalf("Create(%q): %v", r.ClientSID, err)
		}
	}
	want := map[string]*session.Record{
		"a": stored(rec("a"), epoch),
		"b": func() *session.Record {
			w := stored(rec("b"), epoch)
			w.Created = epoch.Add(-time.Minute)
			return w
		}(),
	}
	for id, w := range want {
		got, err := s.Get(ctx, id)
		if err != nil {
			t.Fatalf("Get(%q): %v", id, err)
		}
		if diff := cmp.Diff(got, w); diff != "" {
			t.Errorf("Get(%q) (-got +want):\n%s", id, diff)
		}
	}
	if withCreated.Version != 42 {
		t.Errorf("Create modified its argument: Version = %d", withCreated.Version)
	}
}

func testCreateCopies(t *testing.T, newStore newStoreFunc) {
	s := newStore(t, newFakeClock().Now)
	ctx := t.Context()
	r := rec("a")
	if err := s.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	// The caller reuses its struct and its body buffer.
	r.BackendID = "changed"
	copy(r.Init, "XXXXXXXX")

	got, err := s.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, stored(rec("a"), epoch)); diff != "" {
		t.Errorf("stored record follows the caller's changes (-got +want):\n%s", diff)
	}
}

// Regression (issue 10, item 6): two backends minting the same session id
// swapped the two clients' sessions, the second Create overwriting the
// first record. A live record now keeps its id: the second Create stores
// nothing and says so.
func testCreateExists(t *testing.T, newStore newStoreFunc) {
	clock := newFakeClock()
	s := newStore(t, clock.Now)
	ctx := t.Context()
	if err := s.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	v1, err := s.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	v2, err := s.Swap(ctx, v1, v1.Clone())
	if err != nil {
		t.Fatal(err)
	}

	clock.Advance(time.Second)
	second := rec("a")
	second.BackendID = "10.0.2.3:8080/pod-uid-2"
	second.Principal = "v1:another-principal"
	if err := s.Create(ctx, second); !errors.Is(err, session.ErrExists) {
		t.Fatalf("Create over a live record = %v, want ErrExists", err)
	}
	got, err := s.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, v2); diff != "" {
		t.Errorf("the live record changed (-got +want):\n%s", diff)
	}
}

// An expired record does not hold its id: Create replaces it, and the new
// session's numbering and clocks start again.
func testCreateReplacesExpired(t *testing.T, newStore newStoreFunc) {
	clock := newFakeClock()
	s := newStore(t, clock.Now)
	ctx := t.Context()
	if err := s.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Hour)
	second := rec("a")
	second.BackendID = "10.0.2.3:8080/pod-uid-2"
	if err := s.Create(ctx, second); err != nil {
		t.Fatalf("Create over an expired record: %v", err)
	}
	got, err := s.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, stored(second, epoch.Add(2*time.Hour))); diff != "" {
		t.Errorf("Get after replacing an expired record (-got +want):\n%s", diff)
	}
}

func testCreateEmptyID(t *testing.T, newStore newStoreFunc) {
	s := newStore(t, newFakeClock().Now)
	if err := s.Create(t.Context(), rec("")); err == nil {
		t.Error("Create with an empty ClientSID succeeded")
	}
}

func testSwap(t *testing.T, newStore newStoreFunc) {
	const later = time.Second
	reinit := func(r *session.Record) *session.Record {
		n := r.Clone()
		n.BackendID = "10.0.2.3:8080/pod-uid-2"
		n.BackendURL = "http://10.0.2.3:8080/mcp"
		n.BackendSID = "new-backend-sid"
		n.Reinits++
		return n
	}
	// Each case starts from "a" created at epoch and read back as v1;
	// the swap happens one second later.
	tests := []struct {
		name string
		// prepare runs before the swap and returns (old, next).
		prepare func(t *testing.T, s session.Store, v1 *session.Record) (old, next *session.Record)
		want    func(v1 *session.Record) *session.Record // nil: want nil
		wantErr error
		// wantStored is what Get returns afterwards; nil: ErrNotFound.
		wantStored func(v1 *session.Record) *session.Record
	}{
		{
			name: "success",
			prepare: func(t *testing.T, s session.Store, v1 *session.Record) (*session.Record, *session.Record) {
				return v1, reinit(v1)
			},
			want: func(v1 *session.Record) *session.Record {
				w := reinit(v1)
				w.Version = 2
				w.LastUsed = epoch.Add(later)
				return w
			},
			wantStored: func(v1 *session.Record) *session.Record {
				w := reinit(v1)
				w.Version = 2
				w.LastUsed = epoch.Add(later)
				return w
			},
		},
		{
			name: "conflict returns current",
			prepare: func(t *testing.T, s session.Store, v1 *session.Record) (*session.Record, *session.Record) {
				// Another replica wins first.
				if _, err := s.Swap(t.Context(), v1, reinit(v1)); err != nil {
					t.Fatal(err)
				}
				n := v1.Clone()
				n.BackendID = "loser"
				return v1, n
			},
			want: func(v1 *session.Record) *session.Record {
				w := reinit(v1)
				w.Version = 2
				w.LastUsed = epoch.Add(later)
				return w
			},
			wantErr: session.ErrConflict,
			wantStored: func(v1 *session.Record) *session.Record {
				w := reinit(v1)
				w.Version = 2
				w.LastUsed = epoch.Add(later)
				return w
			},
		},
		{
			name: "not found after delete",
			prepare: func(t *testing.T, s session.Store, v1 *session.Record) (*session.Record, *session.Record) {
				if _, err := s.Delete(t.Context(), v1.ClientSID); err != nil {
					t.Fatal(err)
				}
				return v1, reinit(v1)
			},
			wantErr: session.ErrNotFound,
		},
		{
			name: "next must keep ClientSID",
			prepare: func(t *testing.T, s session.Store, v1 *session.Record) (*session.Record, *session.Record) {
				n := reinit(v1)
				n.ClientSID = "b"
				return v1, n
			},
			wantErr: errAny,
			wantStored: func(v1 *session.Record) *session.Record {
				return v1
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newFakeClock()
			s := newStore(t, clock.Now)
			ctx := t.Context()
			if err := s.Create(ctx, rec("a")); err != nil {
				t.Fatal(err)
			}
			v1, err := s.Get(ctx, "a")
			if err != nil {
				t.Fatal(err)
			}
			clock.Advance(later)
			old, next := tt.prepare(t, s, v1)
			nextBefore := next.Clone()

			got, err := s.Swap(ctx, old, next)
			if !matchErr(err, tt.wantErr) {
				t.Fatalf("Swap error = %v, want %v", err, tt.wantErr)
			}
			var want *session.Record
			if tt.want != nil {
				want = tt.want(v1)
			}
			if diff := cmp.Diff(got, want); diff != "" {
				t.Errorf("Swap record (-got +want):\n%s", diff)
			}
			if diff := cmp.Diff(next, nextBefore); diff != "" {
				t.Errorf("Swap modified next (-got +want):\n%s", diff)
			}

			gotStored, err := s.Get(ctx, "a")
			var wantStored *session.Record
			if tt.wantStored != nil {
				wantStored = tt.wantStored(v1)
			} else if !errors.Is(err, session.ErrNotFound) {
				t.Errorf("Get after Swap: err = %v, want ErrNotFound", err)
			}
			if diff := cmp.Diff(gotStored, wantStored); diff != "" {
				t.Errorf("Get after Swap (-got +want):\n%s", diff)
			}
		})
	}
}

// errAny in a table means "some error, not a sentinel".
var errAny = errors.New("any error")

func matchErr(err, want error) bool {
	switch want {
	case nil:
		return err == nil
	case errAny:
		return err != nil
	}
	return errors.Is(err, want)
}

// testSwapVersions follows one session through several swaps, reading with
// Get each time, and a stale writer that keeps losing.
func testSwapVersions(t *testing.T, newStore newStoreFunc) {
	s := newStore(t, newFakeClock().Now)
	ctx := t.Context()
	if err := s.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	stale, err := s.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	for want := uint64(2); want <= 6; want++ {
		cur, err := s.Get(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		next := cur.Clone()
		next.Reinits++
		got, err := s.Swap(ctx, cur, next)
		if err != nil {
			t.Fatalf("Swap to v%d: %v", want, err)
		}
		if got.Version != want || got.Reinits != uint32(want-1) {
			t.Fatalf("Swap = v%d reinits %d, want v%d reinits %d", got.Version, got.Reinits, want, want-1)
		}
		lost, err := s.Swap(ctx, stale, stale.Clone())
		if !errors.Is(err, session.ErrConflict) || lost == nil || lost.Version != want {
			t.Fatalf("stale Swap = %v, %v; want v%d, ErrConflict", lost, err, want)
		}
	}
}

// A re-initialization moves a session, never its owner: the stored record
// keeps the principal it was created with, whatever next says.
func testSwapKeepsPrincipal(t *testing.T, newStore newStoreFunc) {
	s := newStore(t, newFakeClock().Now)
	ctx := t.Context()
	if err := s.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	v1, err := s.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	next := v1.Clone()
	next.BackendID = "10.0.2.3:8080/pod-uid-2"
	next.Principal = "v1:someone-else"
	got, err := s.Swap(ctx, v1, next)
	if err != nil {
		t.Fatal(err)
	}
	if got.Principal != rec("a").Principal {
		t.Errorf("Swap returned principal %q, want the creator's %q", got.Principal, rec("a").Principal)
	}
	if cur, err := s.Get(ctx, "a"); err != nil || cur.Principal != rec("a").Principal || cur.BackendID != next.BackendID {
		t.Errorf("Get after Swap = %+v, %v; want the new backend and the creator's principal", cur, err)
	}
}

func testDelete(t *testing.T, newStore newStoreFunc) {
	s := newStore(t, newFakeClock().Now)
	ctx := t.Context()
	for _, id := range []string{"a", "b"} {
		if err := s.Create(ctx, rec(id)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Delete(ctx, "a")
	if err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if diff := cmp.Diff(got, stored(rec("a"), epoch)); diff != "" {
		t.Errorf("Delete returned (-got +want):\n%s", diff)
	}
	if got, err := s.Delete(ctx, "a"); !errors.Is(err, session.ErrNotFound) || got != nil {
		t.Errorf("second Delete = %v, %v; want nil, ErrNotFound", got, err)
	}
	if _, err := s.Get(ctx, "a"); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("Get after Delete: err = %v, want ErrNotFound", err)
	}
	if err := s.Touch(ctx, "a", epoch); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("Touch after Delete: err = %v, want ErrNotFound", err)
	}
	if _, err := s.Get(ctx, "b"); err != nil {
		t.Errorf("Get(other id) after Delete: %v", err)
	}
}

func testTouchAbsent(t *testing.T, newStore newStoreFunc) {
	s := newStore(t, newFakeClock().Now)
	if err := s.Touch(context.Background(), "nope", epoch); !errors.Is(err, session.ErrNotFound) {
		t.Errorf("Touch(absent) = %v, want ErrNotFound", err)
	}
}

// The initialize's Host and Path (where the session's MCP endpoint is, for
// a re-initialization without a client request) are stored, follow a Swap
// (next's), and are bounded: a longer one is refused, nothing stored.
func testAddress(t *testing.T, newStore newStoreFunc) {
	s := newStore(t, newFakeClock().Now)
	ctx := t.Context()
	long := strings.Repeat("x", session.MaxAddressLen+1)
	longHost, longPath := rec("long-host"), rec("long-path")
	longHost.Host, longPath.Path = long, "/"+long[1:]+"y"
	for _, r := range []*session.Record{longHost, longPath} {
		if err := s.Create(ctx, r); !errors.Is(err, session.ErrAddressTooLong) {
			t.Errorf("Create(%s) = %v, want ErrAddressTooLong", r.ClientSID, err)
		}
		if got, err := s.Get(ctx, r.ClientSID); !errors.Is(err, session.ErrNotFound) {
			t.Errorf("Get(%s) after a refused Create = %v, %v; want ErrNotFound", r.ClientSID, got, err)
		}
	}

	atBound := rec("at-bound")
	atBound.Host = long[1:]
	atBound.Path = "/" + long[2:]
	if err := s.Create(ctx, atBound); err != nil {
		t.Fatalf("Create with a Host and Path of MaxAddressLen: %v", err)
	}
	if got, err := s.Get(ctx, "at-bound"); err != nil || got.Host != atBound.Host || got.Path != atBound.Path {
		t.Fatalf("Get(at-bound) = %v, %v; want its Host and Path", got, err)
	}

	if err := s.Create(ctx, rec("a")); err != nil {
		t.Fatal(err)
	}
	v1, err := s.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if v1.Host != rec("a").Host || v1.Path != rec("a").Path {
		t.Fatalf("stored Host, Path = %q, %q; want %q, %q", v1.Host, v1.Path, rec("a").Host, rec("a").Path)
	}
	refused := v1.Clone()
	refused.BackendID = "10.0.2.3:8080/pod-uid-2"
	refused.Path = long
	if got, err := s.Swap(ctx, v1, refused); !errors.Is(err, session.ErrAddressTooLong) || got != nil {
		t.Errorf("Swap to a Path over the bound = %v, %v; want nil, ErrAddressTooLong", got, err)
	}
	if got, err := s.Get(ctx, "a"); err != nil || got.Version != 1 || got.Path != v1.Path {
		t.Errorf("Get after a refused Swap = %+v, %v; want v1 unchanged", got, err)
	}

	// A swap keeps what next says: the same (a clone of the record) or new.
	next := v1.Clone()
	next.BackendID = "10.0.2.3:8080/pod-uid-2"
	v2, err := s.Swap(ctx, v1, next)
	if err != nil || v2.Host != v1.Host || v2.Path != v1.Path {
		t.Fatalf("Swap of a clone = %+v, %v; want the Host and Path kept", v2, err)
	}
	next = v2.Clone()
	next.Host, next.Path = "mcp.example.org", "/v2/mcp"
	v3, err := s.Swap(ctx, v2, next)
	if err != nil || v3.Host != "mcp.example.org" || v3.Path != "/v2/mcp" {
		t.Fatalf("Swap to a new Host and Path = %+v, %v", v3, err)
	}
	if got, err := s.Get(ctx, "a"); err != nil || got.Host != "mcp.example.org" || got.Path != "/v2/mcp" {
		t.Errorf("Get after the Swap = %+v, %v; want next's Host and Path", got, err)
	}
	if got, err := s.Delete(ctx, "a"); err != nil || got.Host != "mcp.example.org" || got.Path != "/v2/mcp" {
		t.Errorf("Delete = %+v, %v; want the record with its Host and Path", got, err)
	}
}
