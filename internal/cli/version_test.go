package cli

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestWriteVersion(t *testing.T) {
	for _, tc := range []struct {
		name string
		info *debug.BuildInfo
		want string
	}{
		{"no build info", nil, "corral dev (unknown revision; "},
		{"go run", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "corral dev (unknown revision; "},
		{"go build in a checkout", &debug.BuildInfo{
			Main: debug.Module{Version: "v0.0.0-20261124020000-f504dd8aaaaa"},
			Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "f504dd8aaaaa"},
				{Key: "vcs.time", Value: "2026-11-24T02:00:00Z"},
				{Key: "vcs.modified", Value: "true"},
			},
		}, "corral v0.0.0-20261124020000-f504dd8aaaaa (f504dd8aaaaa+dirty 2026-11-24T02:00:00Z; "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			if err := writeVersion(&b, tc.info); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(b.String(), tc.want) {
				t.Errorf("got %q, want prefix %q", b.String(), tc.want)
			}
		})
	}
}
