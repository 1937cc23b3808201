package sandbox

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/policy"
)

func TestPlanDegradations(t *testing.T) {
	for _, c := range []struct {
		name string
		abi  int
		want []string
	}{
		{"landlock missing", 0, []string{degradedLandlock}},
		{"landlock abi 1", 1, nil},
		{"landlock abi 7", 7, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &plan.Plan{Landlock: plan.Landlock{Compatibility: policy.LandlockBestEffort, ABI: c.abi}}
			var got []string
			for _, d := range planDegradations(p) {
				got = append(got, d.what)
				if d.reason == "" {
					t.Errorf("%s degraded without a reason", d.what)
				}
			}
			if strings.Join(got, ",") != strings.Join(c.want, ",") {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
}

func TestDegradedEvent(t *testing.T) {
	var buf bytes.Buffer
	s := &supervisor{Options: Options{Audit: audit.New(&buf).For("sb", "default")}}
	p := &plan.Plan{Landlock: plan.Landlock{Compatibility: policy.LandlockBestEffort}}
	for _, d := range planDegradations(p) {
		s.degraded(d)
	}
	var e map[string]any
	if err := json.Unmarshal(buf.Bytes(), &e); err != nil {
		t.Fatalf("audit line %q: %v", buf.String(), err)
	}
	if e["event"] != "sandbox.protection_degraded" || e["what"] != "landlock" || e["sandbox_id"] != "sb" {
		t.Errorf("got %v", e)
	}
	if r, _ := e["reason"].(string); !strings.Contains(r, "mount namespace only") || !strings.Contains(r, "best_effort") {
		t.Errorf("reason %q does not say what the run goes without", r)
	}
}
