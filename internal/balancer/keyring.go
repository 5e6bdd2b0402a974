package balancer

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Key affinity: consistent hashing with bounded loads (V. Mirrokni,
// M. Thorup, M. Zadimoghaddam, "Consistent Hashing with Bounded Loads",
// SODA 2018, arXiv:1608.01350). Each eligible endpoint owns virtualNodes
// points on a 64-bit ring; a key hashes to a point and goes to the first
// endpoint clockwise whose load is below the capacity
//
//	ceil((1+ε) × (total load + 1) / n)
//
// over the n eligible endpoints, the +1 being the request being placed. So
// while the endpoint set is stable and no endpoint is full a key always
// lands on the same endpoint (its home), a key moves only when its home
// leaves or is full, and no placement makes an endpoint's load pass
// (1+ε) times the mean. An endpoint that leaves hands its arcs to the next
// endpoints clockwise (about 1/n of the keys move); one that joins takes
// its arcs from the others (again about 1/n).
//
// The load is Endpoint.Inflight, the requests this replica is forwarding
// to the endpoint now, and not Load's sessions + in-flight:
//   - moving a key costs its handle's warm state on the instance, so keys
//     should spill only when their home is overloaded now; the session
//     count is re-based on the fleet's every second (with Redis) and would
//     move keys on every re-base without any request having changed;
//   - in-flight counts only what this replica placed and finished, so the
//     bound holds over exactly the load the algorithm placed (each replica
//     keeps its own endpoints within its (1+ε)× mean, so the fleet's
//     load on an endpoint is within the sum of the replicas' capacities);
//   - at low load no endpoint is full and every replica sends a key to its
//     home, which is what keeps independent replicas agreeing.
//
// One deviation from the paper: the capacity is never below ceil(1/ε).
// While the mean is below 1/ε, (1+ε) × mean is less than one request above
// the mean, so the bound would demand near-perfect balance of a handful of
// requests and move keys over a single one: two concurrent calls on one
// handle, or a client's next call arriving before its previous one was
// counted out (the proxy ends its count after the response is relayed). No
// endpoint is overloaded at such loads, so keys stay home; the bound is
// max(ceil((1+ε) × mean), ceil(1/ε)), and the paper's once the mean
// reaches 1/ε (4 in-flight requests per endpoint at ε = 0.25).
//
// Picks race like every load reading does: two picks that read the same
// load below capacity may both land, so concurrent picks can overshoot the
// capacity by at most the number of picks in flight between read and
// Begin. The placement bound is exact for serialized picks (the tests
// assert it).

// virtualNodes is the number of ring points per endpoint. With v points an
// endpoint's share of the ring deviates from 1/n by about 1/sqrt(v) (10%
// at 100); the bounded load absorbs the rest. It is a constant, not a
// setting, because replicas that disagreed on it would route the same key
// to different endpoints.
const virtualNodes = 100

// DefaultAffinityEpsilon is ε when AffinityOptions.Epsilon is 0: no
// endpoint receives a keyed request while it carries 25% more than the
// mean. A smaller ε balances tighter and moves more keys off their home
// under load (the paper bounds the expected moves per change by
// O(1/ε²)); a larger one keeps keys home longer and lets hot keys pile up.
const DefaultAffinityEpsilon = 0.25

// MaxAffinityEpsilon bounds ε: beyond it the bound never binds in
// practice (plain consistent hashing), and the integer capacity
// arithmetic stays far from overflow.
const MaxAffinityEpsilon = 100

// AffinityOptions turns on PickByKey.
type AffinityOptions struct {
	// Epsilon is ε of the capacity ceil((1+ε) × mean); 0 means
	// DefaultAffinityEpsilon. See CheckAffinityEpsilon for the valid range.
	Epsilon float64
}

// ErrNoAffinity means PickByKey was called on a Balancer built without
// Options.Affinity, which builds no ring.
var ErrNoAffinity = errors.New("balancer: PickByKey without Options.Affinity")

// CheckAffinityEpsilon reports whether eps is a usable ε: positive and at
// most MaxAffinityEpsilon. (ε = 0 would be perfect balance, which moves
// keys off their home on every imbalance of one request.)
func CheckAffinityEpsilon(eps float64) error {
	if !(eps > 0 && eps <= MaxAffinityEpsilon) { // also rejects NaN
		return fmt.Errorf("affinity epsilon must be in (0, %d], got %v", MaxAffinityEpsilon, eps)
	}
	return nil
}

// capScale is the fixed-point denominator of 1+ε: the capacity is computed
// in integers, so it is exact and the same on every platform. 1+ε is
// rounded down to a multiple of 1/capScale, so the capacity is never above
// the paper's.
const capScale = 1 << 16

func capacityFactor(eps float64) int64 { return int64(math.Floor((1 + eps) * capScale)) }

// capacityFloor is the least capacity, ceil(1/ε) (see the package comment
// on key affinity).
func capacityFloor(eps float64) int64 { return int64(math.Ceil(1 / eps)) }

// KeyAffinity reports whether the Balancer was built with
// Options.Affinity, that is, whether PickByKey can pick.
func (b *Balancer) KeyAffinity() bool { return b.capFactor != 0 }

// keyRing is the ring of one generation: points sorted ascending, and
// owners[i] the endpoint that owns points[i]. Immutable once built.
type keyRing struct {
	points []uint64
	owners []*Endpoint
}

// newKeyRing places VirtualNodes points per endpoint of eligible. The
// points depend only on the endpoint IDs (discovery's identity, the same
// on every replica), and ties between two endpoints' points, vanishingly
// rare with 64 bits, go to the smaller ID, so every replica builds the same
// ring from the same set.
func newKeyRing(eligible []*Endpoint) *keyRing {
	type vnode struct {
		point uint64
		owner *Endpoint
	}
	vnodes := make([]vnode, 0, len(eligible)*virtualNodes)
	for _, e := range eligible {
		base := fnv1a(e.ID)
		for i := range uint64(virtualNodes) {
			// mix64 is a bijection, so an endpoint's points are distinct.
			vnodes = append(vnodes, vnode{mix64(base + i*0x9e3779b97f4a7c15), e})
		}
	}
	slices.SortFunc(vnodes, func(x, y vnode) int {
		if x.point != y.point {
			if x.point < y.point {
				return -1
			}
			return 1
		}
		return strings.Compare(x.owner.ID, y.owner.ID)
	})
	r := &keyRing{points: make([]uint64, len(vnodes)), owners: make([]*Endpoint, len(vnodes))}
	for i, v := range vnodes {
		r.points[i], r.owners[i] = v.point, v.owner
	}
	return r
}

// PickByKey returns the endpoint for key by consistent hashing with bounded
// loads (see VirtualNodes and AffinityOptions): among the eligible
// endpoints (Ready and not ejected) other than exclude, the first clockwise
// from the key's ring point whose in-flight count is below
// ceil((1+ε) × mean). It fails with ErrNoEndpoints when no endpoint is
// eligible, and with ErrNoAffinity when the Balancer was built without
// Options.Affinity. Like Pick, it does not count the request (call Begin)
// and takes no lock and allocates nothing.
//
// The same key on two Balancers built with the same endpoint set (two
// replicas) gets the same endpoint while neither has a full endpoint on
// the key's way: the ring and the key's hash are the same in every
// process.
func (b *Balancer) PickByKey(key string, exclude *Endpoint) (*Endpoint, error) {
	if b.capFactor == 0 {
		return nil, ErrNoAffinity
	}
	g := b.current.Load()
	// The mean is over the endpoints the key may go to, as in the paper,
	// where the bins are the live servers.
	n, total := int64(0), int64(0)
	for _, e := range g.eligible {
		if e != exclude {
			n++
			total += e.Inflight()
		}
	}
	if n == 0 {
		return nil, ErrNoEndpoints
	}
	// ceil(factor × (total+1) / (capScale × n)). The +1 is the request
	// being placed; since factor ≥ capScale, capacity × n > total, so some
	// endpoint is below it (at the time of the reads above).
	capacity := (b.capFactor*(max(total, 0)+1) + capScale*n - 1) / (capScale * n)
	capacity = max(capacity, b.capFloor)

	r := g.keys
	i := r.search(hashKey(key))
	// Concurrent picks may fill every endpoint between the reads above and
	// the walk; after one lap the least loaded endpoint seen takes the key.
	var fallback *Endpoint
	fallbackLoad := int64(math.MaxInt64)
	for range len(r.points) {
		if e := r.owners[i]; e != exclude {
			load := e.Inflight()
			if load < capacity {
				return e, nil
			}
			if load < fallbackLoad {
				fallback, fallbackLoad = e, load
			}
		}
		if i++; i == len(r.points) {
			i = 0
		}
	}
	return fallback, nil
}

// search returns the index of the first point at or after h, clockwise
// (wrapping to 0 past the largest point). r has at least one point.
func (r *keyRing) search(h uint64) int {
	lo, hi := 0, len(r.points)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if r.points[mid] < h {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == len(r.points) {
		return 0
	}
	return lo
}

// hashKey is the ring position of key: FNV-1a 64 of its bytes, finished by
// mix64.
//
// Why this hash: every replica must place a key at the same point, in
// every process and every version, so hash/maphash (seeded per process) is
// out. FNV-1a 64 is specified (hash/fnv implements the same function),
// needs no dependency (xxhash is only an indirect one here), and is fast
// enough for handles of tens of bytes; written out over the string it
// allocates nothing. Its high bits mix poorly for keys that differ in
// their last bytes (workspace-1, workspace-2, ...), and the ring search
// compares whole words, so mix64 spreads them.
func hashKey(key string) uint64 { return mix64(fnv1a(key)) }

// fnv1a is FNV-1a 64 (the constants of hash/fnv's New64a) over s.
func fnv1a(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix64 is MurmurHash3's 64-bit finalizer (fmix64), a bijection in which
// every input bit affects every output bit.
func mix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}
