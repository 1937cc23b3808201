package sanitize

import (
	"strings"
	"testing"
)

func TestLine(t *testing.T) {
	tests := []struct {
		name   string
		argv   []string
		want   string
		secret []string // must not survive
	}{
		{"bearer header", []string{"curl", "-H", "Authorization: Bearer ghx1234567890abcdefSECRET", "https://api.example.com/x"},
			"curl -H 'Authorization: [REDACTED]' https://api.example.com/x", []string{"SECRET"}},
		{"attached header flag", []string{"curl", "-HAuthorization: token s3cr3tvalue99", "https://x"},
			"curl '-HAuthorization: [REDACTED]' https://x", []string{"s3cr3t"}},
		{"header flag with equals", []string{"curl", "--header=X-Api-Key: abcd1234efgh", "https://x"},
			"curl '--header=X-Api-Key: [REDACTED]' https://x", []string{"abcd1234"}},
		{"cookie header", []string{"curl", "-H", "Cookie: session=abc123; csrftoken=zzz", "https://x"},
			"curl -H 'Cookie: [REDACTED]' https://x", []string{"abc123", "zzz"}},
		{"curl cookie flag", []string{"curl", "-b", "sid=deadbeefcafe", "https://x"},
			"curl -b [REDACTED] https://x", []string{"deadbeef"}},
		{"curl user", []string{"curl", "-u", "alice:hunter2", "https://x"},
			"curl -u alice:[REDACTED] https://x", []string{"hunter2"}},
		{"curl user attached", []string{"curl", "-ualice:hunter2", "https://x"},
			"curl -ualice:[REDACTED] https://x", []string{"hunter2"}},
		{"git clone with token in url", []string{"git", "clone", "https://x-access-token:ghs_16C7e42F292c6912E7710c838347Ae178B4a@github.com/o/r.git"},
			"git clone https://x-access-token:[REDACTED]@github.com/o/r.git", []string{"ghs_16C7"}},
		{"password in url", []string{"psql", "postgres://app:pa55w0rd@db.internal:5432/app"},
			"psql postgres://app:[REDACTED]@db.internal:5432/app", []string{"pa55w0rd"}},
		{"github pat bare", []string{"gh", "auth", "login", "--with-token", "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz"},
			"gh auth login --with-token [REDACTED]", []string{"github_pat_11"}},
		{"ghp token env in shell", []string{"bash", "-c", "GITHUB_TOKEN=ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345 git push"},
			"bash -c 'GITHUB_TOKEN=[REDACTED] git push'", []string{"ghp_aB"}},
		{"openai key flag", []string{"python3", "agent.py", "--api-key", "sk-proj-AbCdEf0123456789XYZabc"},
			"python3 agent.py --api-key [REDACTED]", []string{"sk-proj"}},
		{"anthropic key with equals", []string{"node", "cli.js", "--api-key=sk-ant-api03-AbCdEf0123456789XYZabc"},
			"node cli.js --api-key=[REDACTED]", []string{"sk-ant"}},
		{"slack token", []string{"curl", "-d", "token=xoxb-1234567890-abcdefghij", "https://slack.com/api/chat.postMessage"},
			"curl -d token=[REDACTED] https://slack.com/api/chat.postMessage", []string{"xoxb-"}},
		{"aws key env", []string{"env", "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE", "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws", "s3", "ls"},
			"env AWS_ACCESS_KEY_ID=[REDACTED] AWS_SECRET_ACCESS_KEY=[REDACTED] aws s3 ls", []string{"AKIAIOSFODNN7", "wJalr"}},
		{"bare aws key id", []string{"tool", "AKIAIOSFODNN7EXAMPLE"}, "tool [REDACTED]", []string{"AKIA"}},
		{"jwt", []string{"curl", "https://x/cb?x=1", "-d", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"},
			"curl 'https://x/cb?x=1' -d [REDACTED]", []string{"eyJ"}},
		{"query token", []string{"wget", "https://api.example.com/v1/data?access_token=abc123def&page=2"},
			"wget 'https://api.example.com/v1/data?access_token=[REDACTED]&page=2'", []string{"abc123def"}},
		{"password flag", []string{"mysqladmin", "--password", "hunter2", "status"},
			"mysqladmin --password [REDACTED] status", []string{"hunter2"}},
		{"password flag equals", []string{"app", "--password=hunter2"}, "app --password=[REDACTED]", []string{"hunter2"}},
		{"token flag", []string{"glab", "--token", "glpat-xxxxxxxxxxxxxxxxxxxx"}, "glab --token [REDACTED]", []string{"glpat"}},
		{"mysql attached password", []string{"mysql", "-uroot", "-phunter2", "-h", "db"},
			"mysql -uroot -p[REDACTED] -h db", []string{"hunter2"}},
		{"ssh port kept", []string{"ssh", "-p", "2222", "git@example.com"}, "ssh -p 2222 git@example.com", nil},
		{"-p non-numeric value redacted", []string{"tool", "-p", "s3cret"}, "tool -p [REDACTED]", []string{"s3cret"}},
		{"redis-cli auth", []string{"redis-cli", "-h", "cache", "-a", "s3cret", "ping"},
			"redis-cli -h cache -a [REDACTED] ping", []string{"s3cret"}},
		{"shell string with header and flag", []string{"sh", "-c", `curl -sS -H "Authorization: Bearer abcdefgh12345678" --token=zzz999 https://x`},
			`sh -c 'curl -sS -H "Authorization: [REDACTED]" --token=[REDACTED] https://x'`, []string{"abcdefgh1234", "zzz999"}},
		{"basic auth value", []string{"http", "GET", "https://x", "Basic dXNlcjpwYXNzd29yZA=="},
			"http GET https://x 'Basic [REDACTED]'", []string{"dXNlcjpw"}},
		{"huggingface token", []string{"huggingface-cli", "login", "hf_abcdefghijklmnopqrstuvwxyzABCDEF"},
			"huggingface-cli login [REDACTED]", []string{"hf_abc"}},
		{"nothing secret", []string{"/usr/bin/curl", "-sSf", "https://api.example.com/repos/a/b"},
			"/usr/bin/curl -sSf https://api.example.com/repos/a/b", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Line(tt.argv)
			if got != tt.want {
				t.Errorf("Line(%q)\n got %s\nwant %s", tt.argv, got, tt.want)
			}
			for _, s := range tt.secret {
				if strings.Contains(got, s) {
					t.Errorf("secret %q survived in %s", s, got)
				}
			}
		})
	}
}

func TestLineBounded(t *testing.T) {
	got := Line([]string{"sh", "-c", strings.Repeat("é", 2000)})
	if len(got) > MaxLine+len("…") {
		t.Errorf("len %d, want at most %d", len(got), MaxLine+len("…"))
	}
	if !strings.HasSuffix(got, "…") {
		t.Errorf("truncated line %q does not say so", got[len(got)-10:])
	}
}

func TestArgsDoesNotModifyInput(t *testing.T) {
	argv := []string{"curl", "-u", "a:b"}
	Args(argv)
	if argv[2] != "a:b" {
		t.Errorf("input changed: %q", argv)
	}
}
