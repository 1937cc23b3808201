package server

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/gateway/secretbox"
	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
)

// TestSecretsWriteOnly: values go in, only names come out, and the store
// holds them sealed.
func TestSecretsWriteOnly(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	c := g.clients(g.user, nil)
	value := []byte("ghp_supersecretvalue")
	if _, err := c.secrets.Set(ctx, connect.NewRequest(&gatewayv1.SetSecretRequest{Name: "GH_TOKEN", Value: value})); err != nil {
		t.Fatal(err)
	}
	list, err := c.secrets.List(ctx, connect.NewRequest(&gatewayv1.ListSecretsRequest{}))
	if err != nil || len(list.Msg.Names) != 1 || list.Msg.Names[0] != "GH_TOKEN" {
		t.Fatalf("list: %v, %v", list, err)
	}
	stored, err := g.store.GetSecret(ctx, "GH_TOKEN")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(stored.Sealed, value) {
		t.Fatal("the store holds the secret in the clear")
	}
	if got, err := g.srv.cfg.Secrets.Open("GH_TOKEN", stored.Sealed); err != nil || !bytes.Equal(got, value) {
		t.Fatalf("sealed value does not open: %q, %v", got, err)
	}
	for _, bad := range []*gatewayv1.SetSecretRequest{{Name: "../x", Value: value}, {Name: "EMPTY"}} {
		if _, err := c.secrets.Set(ctx, connect.NewRequest(bad)); codeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("set %q: %v", bad.Name, err)
		}
	}
	if _, err := c.secrets.Delete(ctx, connect.NewRequest(&gatewayv1.DeleteSecretRequest{Name: "GH_TOKEN"})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.secrets.Delete(ctx, connect.NewRequest(&gatewayv1.DeleteSecretRequest{Name: "GH_TOKEN"})); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("second delete: %v", err)
	}
}

const routesYAML = `routes:
  - name: local
    base_url: http://127.0.0.1:8000/v1
    protocols: [openai_chat_completions]
`

// TestRoutesPushed: routes set by a user reach every subscribed
// supervisor at once; invalid ones are refused with the inference
// package's message.
func TestRoutesPushed(t *testing.T) {
	g := startGateway(t, gwOpts{})
	ctx := ctxT(t)
	c := g.clients(g.user, nil)
	var streams []*connect.ServerStreamForClient[gatewayv1.Update]
	for _, name := range []string{"a", "b"} {
		_, sup := createFake(t, g, name)
		s, err := sup.supervisor.Subscribe(ctx, connect.NewRequest(&gatewayv1.SubscribeRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if !s.Receive() || s.Msg().Routes != nil {
			t.Fatalf("first update: %v %v", s.Msg(), s.Err())
		}
		streams = append(streams, s)
	}
	if _, err := c.routes.Get(ctx, connect.NewRequest(&gatewayv1.GetRoutesRequest{})); codeOf(err) != connect.CodeNotFound {
		t.Fatalf("routes before any set: %v", err)
	}
	_, err := c.routes.Set(ctx, connect.NewRequest(&gatewayv1.SetRoutesRequest{Yaml: "routes:\n  - name: x\n    base_url: ftp://nowhere\n    protocols: [smoke_signals]\n"}))
	if codeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "inference routes") {
		t.Fatalf("bad routes: %v", err)
	}
	if _, err := c.routes.Set(ctx, connect.NewRequest(&gatewayv1.SetRoutesRequest{Yaml: "routes: []\nunknown: 1\n"})); codeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("routes with an unknown field: %v", err)
	}
	set, err := c.routes.Set(ctx, connect.NewRequest(&gatewayv1.SetRoutesRequest{Yaml: routesYAML}))
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range streams {
		if !s.Receive() {
			t.Fatal(s.Err())
		}
		u := s.Msg()
		if u.Routes == nil || u.Routes.Version != set.Msg.Version || u.Routes.Yaml != routesYAML || u.Policy != nil {
			t.Fatalf("supervisor %d got %+v", i, u)
		}
	}
	got, err := c.routes.Get(ctx, connect.NewRequest(&gatewayv1.GetRoutesRequest{}))
	if err != nil || got.Msg.Version != 1 || got.Msg.Author != "alice" {
		t.Fatalf("get routes: %+v, %v", got, err)
	}
	// A supervisor starting now gets them in its first message.
	_, sup := createFake(t, g, "c")
	s, err := sup.supervisor.Subscribe(ctx, connect.NewRequest(&gatewayv1.SubscribeRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Receive() || s.Msg().GetRoutes().GetVersion() != 1 || s.Msg().GetPolicy().GetVersion() != 1 {
		t.Fatalf("late subscriber: %v %v", s.Msg(), s.Err())
	}
}

// TestLostSecretKeyRefused: a gateway whose secret key file is gone while
// the database holds secrets sealed with it does not start with a new key
// unless told to (--new-secret-key), and a key that does not open them is
// reported at start.
func TestLostSecretKeyRefused(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "secret.key")
	st, err := store.OpenSQLite(filepath.Join(dir, "gateway.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := secretKey(ctx, st, keyPath, false, nil); err != nil {
		t.Fatalf("first start, nothing sealed: %v", err)
	}
	box, err := secretbox.LoadOrCreate(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := box.Seal("gh-token", []byte("ghp_value"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PutSecret(ctx, store.Secret{Name: "gh-token", Sealed: sealed}); err != nil {
		t.Fatal(err)
	}
	if _, err := secretKey(ctx, st, keyPath, false, nil); err != nil {
		t.Fatalf("restart with the key: %v", err)
	}
	if err := os.Remove(keyPath); err != nil {
		t.Fatal(err)
	}
	if _, err := secretKey(ctx, st, keyPath, false, nil); err == nil || !strings.Contains(err.Error(), "--new-secret-key") {
		t.Fatalf("start without the key: %v, want a refusal naming --new-secret-key", err)
	}
	if _, err := os.Stat(keyPath); err == nil {
		t.Fatal("a refused start made a key")
	}
	var logs bytes.Buffer
	if _, err := secretKey(ctx, st, keyPath, true, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
		t.Fatalf("start with --new-secret-key: %v", err)
	}
	if !strings.Contains(logs.String(), "does not open the stored secrets") {
		t.Errorf("no warning that the new key opens nothing:\n%s", logs.String())
	}
}
