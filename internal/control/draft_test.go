package control

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/statedir"
)

// draftHandler is a supervisor with a policy advisor.
type draftHandler struct {
	policyHandler
	op   string
	args DraftArgs
	by   Peer
}

func (h *draftHandler) Draft(_ context.Context, op string, args DraftArgs, by Peer) (any, error) {
	h.op, h.args, h.by = op, args, by
	if op == OpDraftUndo {
		return nil, errors.New("draft abc was approved before this supervisor started")
	}
	return map[string]string{"id": "abc"}, nil
}

// Draft operations reach a handler that has an advisor with their
// arguments and the client's credentials; their result comes back in
// Response.Draft, their error in Response.Error.
func TestDraftOps(t *testing.T) {
	state := t.TempDir()
	if err := os.MkdirAll(statedir.Run(state, "sb"), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := Listen(statedir.Control(state, "sb"))
	if err != nil {
		t.Fatal(err)
	}
	h := &draftHandler{policyHandler: policyHandler{version: 1}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Serve(ctx, l, h, allowAll, slog.New(slog.DiscardHandler))
	call := func(req Request) Response {
		t.Helper()
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		resp, err := Call(cctx, state, "sb", req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := call(Request{Op: OpDraftReject, Draft: &DraftArgs{IDs: []string{"abc"}, Reason: "no", Guidance: "use x"}})
	var got map[string]string
	if !resp.OK || json.Unmarshal(resp.Draft, &got) != nil || got["id"] != "abc" {
		t.Fatalf("reject: %+v", resp)
	}
	if h.op != OpDraftReject || h.args.Guidance != "use x" || h.by.UID != os.Getuid() {
		t.Errorf("handler got %s %+v from %+v", h.op, h.args, h.by)
	}
	if resp := call(Request{Op: OpDraftUndo, Draft: &DraftArgs{IDs: []string{"abc"}}}); resp.OK || resp.Error == "" {
		t.Errorf("a failed undo answered %+v", resp)
	}
	// A supervisor without an advisor says so.
	s := serve(t, allowAll)
	if resp := s.call(t, Request{Op: OpDraftList}); resp.OK {
		t.Errorf("draft.list without an advisor: %+v", resp)
	}
}
