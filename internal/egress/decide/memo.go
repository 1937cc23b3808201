package decide

import (
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/corral-sandbox/corral/internal/egress"
)

// memoSize bounds the request decisions remembered per policy version.
const memoSize = 4096

// requestMemo remembers request decisions for one compiled policy. With
// the baked-in rules a decision is a pure function of the policy and the
// input, and an agent repeats itself (polling, retries, the same API
// calls per task), so most requests cost a map lookup instead of a Rego
// evaluation. A reload builds a new state and with it an empty memo, so
// a decision never outlives the policy that made it. User rules may not
// be pure (time.now_ns), so they are never memoised.
type requestMemo struct {
	mu sync.Mutex
	m  map[string]egress.HTTPDecision
}

func newRequestMemo() *requestMemo {
	return &requestMemo{m: make(map[string]egress.HTTPDecision)}
}

func (m *requestMemo) get(key string) (egress.HTTPDecision, bool) {
	if m == nil {
		return egress.HTTPDecision{}, false
	}
	m.mu.Lock()
	d, ok := m.m[key]
	m.mu.Unlock()
	return d, ok
}

func (m *requestMemo) put(key string, d egress.HTTPDecision) {
	if m == nil {
		return
	}
	m.mu.Lock()
	if len(m.m) >= memoSize {
		clear(m.m)
	}
	m.m[key] = d
	m.mu.Unlock()
}

// memoKey spells out every input a request decision reads, unambiguously:
// fields are separated by a byte no field can hold.
func memoKey(host, ip string, port uint16, id egress.Identity, h egress.HTTPRequest) string {
	var b strings.Builder
	field := func(s string) {
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	field(host)
	field(ip)
	field(strconv.Itoa(int(port)))
	field(id.Binary)
	field(strconv.Itoa(len(id.Ancestors)))
	for _, a := range id.Ancestors {
		field(a)
	}
	field(strconv.Itoa(len(id.CmdlinePaths)))
	for _, c := range id.CmdlinePaths {
		field(c)
	}
	field(id.Untrusted)
	field(h.Method)
	field(h.Path)
	names := make([]string, 0, len(h.Query))
	for n := range h.Query {
		names = append(names, n)
	}
	slices.Sort(names)
	field(strconv.Itoa(len(names)))
	for _, n := range names {
		field(n)
		field(strconv.Itoa(len(h.Query[n])))
		for _, v := range h.Query[n] {
			field(v)
		}
	}
	return b.String()
}
