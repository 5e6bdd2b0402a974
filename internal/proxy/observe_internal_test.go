package proxy

import (
	"fmt"
	"testing"
	"time"
)

// TestDecisionLogRecency: a session's requests keep its entry among the
// recent ones, to within promoteEvery: a request sooner than that after the
// last does not move the entry, a later one does.
func TestDecisionLogRecency(t *testing.T) {
	var d *decisionLog
	var a, b, c string
	// fresh makes d a log of two entries a shard, and a, b, c three
	// sessions of one shard (the shards' seed is the log's own).
	fresh := func() {
		d = newDecisionLog(2 * len(decisionLog{}.shards))
		var ids []string
		for i := 0; len(ids) < 3; i++ {
			id := fmt.Sprintf("s%d", i)
			if len(ids) == 0 || d.shard(id) == d.shard(ids[0]) {
				ids = append(ids, id)
			}
		}
		a, b, c = ids[0], ids[1], ids[2]
	}
	use := func(sid string, at time.Duration) {
		e := d.entry(sid, true, int64(at))
		e.lastAt.Store(int64(at)) // as recordDecision does
	}
	present := func(sid string) bool { return d.entry(sid, false, 0) != nil }

	start := 10 * time.Second
	fresh()
	use(a, start)
	use(b, start)
	use(a, start+promoteEvery/2) // too soon to move: a stays the oldest
	use(c, start+promoteEvery/2) // evicts the least recent
	if present(a) || !present(b) || !present(c) {
		t.Fatalf("after a request within promoteEvery: a %v, b %v, c %v; want a evicted", present(a), present(b), present(c))
	}

	fresh()
	use(a, start)
	use(b, start)
	use(a, start+promoteEvery) // a moves to the front
	use(c, start+promoteEvery)
	if !present(a) || present(b) || !present(c) {
		t.Fatalf("after a request promoteEvery later: a %v, b %v, c %v; want b evicted", present(a), present(b), present(c))
	}
}
