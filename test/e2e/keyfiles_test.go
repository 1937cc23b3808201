package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A masked secret's or an inference route key's from_file must not be
// readable inside the sandbox, however the policy names it: through a
// symlink into the workdir, as a hard link of a file in it, or as a route
// key. corral refuses to start (exit 125) with a message naming the field
// and the way out; the workload never runs. A file the sandbox cannot
// reach starts it as usual.

const keyFilesScript = `#!/bin/bash
echo "GH_TOKEN=$GH_TOKEN"
for f in "$W"/.secrets/*; do echo "FILE $f: $(cat "$f" 2>&1)"; done
echo "=== end"
`

const keyFilesInferencePolicy = `network:
  mode: proxy
inference:
  routes:
    - name: hosted
      base_url: https://api.openai.com/v1
      protocols: [openai_chat_completions]
      api_key: {from_file: %s}
`

func TestKeyFilesReadableInsideRefused(t *testing.T) {
	requireRoot(t)
	realGH := "ghp_" + randomAlnum(36)
	realAI := "sk-proj-" + randomAlnum(40)
	forEachMode(t, true, func(t *testing.T, m *mode) {
		for _, tc := range []struct {
			name string
			// policy is given the workdir's .secrets, a symlink to it in
			// aux, and a directory of keys in aux the sandbox cannot see.
			policy func(sec, link, keys string) string
			want   string // in corral's error, {W} the workdir; "" for a run that starts
			// routes, when set, is given the same and is passed as
			// --inference-routes.
			routes func(sec, link, keys string) string
		}{
			{"secret in the workdir", func(sec, _, _ string) string {
				return secretHostPolicy("echo.test", "from_file: "+filepath.Join(sec, "gh"))
			}, "secrets.GH_TOKEN.from_file {W}/.secrets/gh is inside {W}, which the sandbox mounts (workdir)", nil},
			{"secret through a symlink", func(_, link, _ string) string {
				return secretHostPolicy("echo.test", "from_file: "+filepath.Join(link, "gh"))
			}, "resolves to {W}/.secrets/gh, which is inside {W}, which the sandbox mounts (workdir)", nil},
			{"secret hard-linked into the workdir", func(_, _, keys string) string {
				return secretHostPolicy("echo.test", "from_file: "+filepath.Join(keys, "gh-link"))
			}, "has 2 hard links", nil},
			{"inference key in the workdir", func(sec, _, _ string) string {
				return fmt.Sprintf(keyFilesInferencePolicy, filepath.Join(sec, "openai"))
			}, `inference.routes[0].api_key.from_file (route "hosted") {W}/.secrets/openai is inside {W}`, nil},
			{"inference key through a symlink", func(_, link, _ string) string {
				return fmt.Sprintf(keyFilesInferencePolicy, filepath.Join(link, "openai"))
			}, "resolves to {W}/.secrets/openai, which is inside {W}", nil},
			{"inference key in the workdir, --inference-routes", func(_, _, _ string) string {
				return "network:\n  mode: proxy\n"
			}, `--inference-routes {A}/routes.yaml[0].api_key.from_file (route "hosted") {W}/.secrets/openai is inside {W}`, func(sec, _, _ string) string {
				return strings.TrimPrefix(fmt.Sprintf(keyFilesInferencePolicy, filepath.Join(sec, "openai")), "network:\n  mode: proxy\ninference:\n")
			}},
			{"keys outside every mount", func(_, _, keys string) string {
				return secretHostPolicy("echo.test", "from_file: "+filepath.Join(keys, "gh")) +
					strings.TrimPrefix(fmt.Sprintf(keyFilesInferencePolicy, filepath.Join(keys, "openai")), "network:\n  mode: proxy\n")
			}, "", nil},
		} {
			t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
				fx := newFixture(t, m)
				writeOwned(t, m, filepath.Join(fx.W, "kf.sh"), []byte(keyFilesScript), 0o755)
				sec := filepath.Join(fx.W, ".secrets")
				keys := filepath.Join(fx.aux, "keys")
				link := filepath.Join(fx.aux, "vault")
				for _, d := range []string{sec, keys} {
					if err := os.Mkdir(d, 0o700); err != nil {
						t.Fatal(err)
					}
					for name, v := range map[string]string{"gh": realGH, "openai": realAI} {
						if err := os.WriteFile(filepath.Join(d, name), []byte(v+"\n"), 0o600); err != nil {
							t.Fatal(err)
						}
					}
					if err := chownTree(d, m.uid, m.gid); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.Symlink(sec, link); err != nil {
					t.Fatal(err)
				}
				if err := os.Link(filepath.Join(sec, "gh"), filepath.Join(keys, "gh-link")); err != nil {
					t.Fatal(err)
				}
				if tc.want == "" {
					// Only the copies in aux hold the values now.
					if err := os.RemoveAll(sec); err != nil {
						t.Fatal(err)
					}
				}
				flags := []string{"--env", "W=" + fx.W}
				if tc.routes != nil {
					routes := filepath.Join(fx.aux, "routes.yaml")
					if err := os.WriteFile(routes, []byte(tc.routes(sec, link, keys)), 0o644); err != nil {
						t.Fatal(err)
					}
					flags = append(flags, "--inference-routes", routes)
				}
				r := runCorral(t, fx, runOpts{
					args:   []string{"/usr/bin/bash", filepath.Join(fx.W, "kf.sh")},
					policy: basePolicy(tc.policy(sec, link, keys)),
					flags:  flags,
				})
				for _, real := range []string{realGH, realAI} {
					if strings.Contains(r.stdout, real) {
						t.Errorf("the workload read a real value from a key file (%.8s...)\n%s", real, r)
					}
				}
				if tc.want == "" {
					if r.code != 0 || !strings.Contains(r.stdout, "=== end") || !strings.Contains(r.stdout, "GH_TOKEN=ghp_") {
						t.Errorf("want the run to start with the surrogate, the key files out of reach\n%s", r)
					}
					return
				}
				want := strings.NewReplacer("{W}", fx.W, "{A}", fx.aux).Replace(tc.want)
				if r.code != 125 || strings.Contains(r.stdout, "=== end") || !strings.Contains(r.stderr, want) ||
					!strings.Contains(r.stderr, "keep the file outside every path the policy exposes") {
					t.Errorf("want exit 125 before the workload runs, saying %q and how to fix it\n%s", want, r)
				}
			})
		}
	})
}
