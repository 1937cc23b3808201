package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestTokenCommands(t *testing.T) {
	data := t.TempDir()
	for flag, prefix := range map[string]string{"--name=alice": "cgw_u_", "--join": "cgw_j_"} {
		out, err := run(t, "token", "create", flag, "--data", data)
		if err != nil || !strings.HasPrefix(out, prefix) {
			t.Fatalf("token create %s: %q, %v", flag, out, err)
		}
	}
	if _, err := run(t, "token", "create", "--data", data); err == nil {
		t.Fatal("token create without a kind succeeded")
	}
	if _, err := run(t, "token", "create", "--sandbox", "nope", "--data", data); err == nil {
		t.Fatal("a token for an unknown sandbox was made")
	}
	out, err := run(t, "token", "list", "--data", data)
	if err != nil || !strings.Contains(out, "alice") || !strings.Contains(out, "join") || strings.Contains(out, "cgw_") {
		t.Fatalf("token list: %q, %v", out, err)
	}
	// A join token records the secrets it grants; only a join token grants.
	if _, err := run(t, "token", "create", "--join", "--name", "host-b", "--secret", "gh-token", "--secret", "db", "--data", data); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]string{{"--name", "bob", "--secret", "db"}, {"--join", "--secret", "../x"}} {
		if _, err := run(t, append([]string{"token", "create", "--data", data}, bad...)...); err == nil {
			t.Errorf("token create %q succeeded", bad)
		}
	}
	out, err = run(t, "token", "list", "--data", data)
	if err != nil || !regexp.MustCompile(`join\s+host-b\s+-\s+db,gh-token\s`).MatchString(out) {
		t.Fatalf("token list does not show the join token's secrets: %q, %v", out, err)
	}
	// A join token expires in a day unless --ttl says otherwise; a user
	// token only when given one.
	if _, err := run(t, "token", "create", "--name", "ttl-user", "--ttl", "2h", "--data", data); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "token", "create", "--name", "neg", "--ttl", "-1h", "--data", data); err == nil {
		t.Error("a negative --ttl was accepted")
	}
	out, err = run(t, "token", "list", "--data", data)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 7 {
			continue
		}
		var want time.Duration
		switch {
		case f[1] == "join":
			want = 24 * time.Hour
		case f[2] == "ttl-user":
			want = 2 * time.Hour
		}
		created, _ := time.Parse(time.RFC3339, f[len(f)-3])
		expires, err := time.Parse(time.RFC3339, f[len(f)-2])
		switch {
		case want == 0 && f[len(f)-2] != "-":
			t.Errorf("token %s expires (%s), want never", f[2], f[len(f)-2])
		case want != 0 && (err != nil || expires.Sub(created) < want-time.Minute || expires.Sub(created) > want+time.Minute):
			t.Errorf("token %s: created %s, expires %s; want %s later", f[2], f[len(f)-3], f[len(f)-2], want)
		}
	}
	id := strings.Fields(strings.Split(out, "\n")[1])[0]
	if _, err := run(t, "token", "delete", id, "--data", data); err != nil {
		t.Fatal(err)
	}
	if out2, _ := run(t, "token", "list", "--data", data); strings.Contains(out2, id) {
		t.Fatalf("deleted token still listed:\n%s", out2)
	}
}

func TestIssueClient(t *testing.T) {
	data, out := t.TempDir(), t.TempDir()
	if _, err := run(t, "issue-client", "--name", "carol", "--out", out, "--data", data); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"carol.pem", "carol-key.pem", "ca.pem"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(filepath.Join(out, "carol-key.pem"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key mode: %v, %v", fi.Mode(), err)
	}
	// Recorded by serial, listed, revocable once.
	b, err := os.ReadFile(filepath.Join(out, "carol.pem"))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	serial := cert.SerialNumber.Text(16)
	list, err := run(t, "list-clients", "--data", data)
	if err != nil || !regexp.MustCompile(serial+`\s+carol\s+\S+\s+\S+\s+-`).MatchString(list) {
		t.Fatalf("list-clients: %q, %v; want carol's serial %s, not revoked", list, err, serial)
	}
	if _, err := run(t, "revoke-client", strings.ToUpper(serial), "--data", data); err != nil {
		t.Fatalf("revoke-client: %v", err)
	}
	if _, err := run(t, "revoke-client", serial, "--data", data); err == nil {
		t.Error("revoking twice succeeded")
	}
	if list, _ := run(t, "list-clients", "--data", data); regexp.MustCompile(serial + `\s+carol\s+\S+\s+\S+\s+-`).MatchString(list) {
		t.Errorf("list-clients after revoke-client still shows it unrevoked:\n%s", list)
	}
}
