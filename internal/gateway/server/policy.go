package server

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"gopkg.in/yaml.v3"

	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/policy"
)

const policySource = "gateway"

// checkNewPolicy validates a sandbox's first policy as `corral policy
// check` does (the built-in default when text is empty), checks that the
// secrets it takes from_gateway are granted (any, when granted is nil)
// and that the gateway holds them, and returns what the store keeps.
func (s *Server) checkNewPolicy(ctx context.Context, text string, granted func(name string) bool) ([]byte, string, error) {
	p := policy.Default()
	if strings.TrimSpace(text) != "" {
		var err error
		if p, err = policy.Parse([]byte(text), policySource); err != nil {
			return nil, "", policyInvalid(err)
		}
	}
	yaml, sum, err := storedPolicy(p)
	if err != nil {
		return nil, "", err
	}
	// Before the gateway looks a name up, so that whether a secret exists
	// is told only to whoever may take it.
	if granted != nil {
		if err := checkGranted(p, granted); err != nil {
			return nil, "", err
		}
	}
	if err := s.checkGatewaySecrets(ctx, p); err != nil {
		return nil, "", err
	}
	return yaml, sum, nil
}

// storedPolicy is the whole effective policy as YAML with "extends: none"
// and its canonical hash. A set may be partial (the sections it leaves out
// stay as they run), but each stored version is whole, so a supervisor
// that skipped versions while away lands on exactly the newest one.
func storedPolicy(p *policy.Policy) ([]byte, string, error) {
	if _, err := p.Compile(); err != nil {
		return nil, "", policyInvalid(err)
	}
	whole := *p
	whole.Extends = policy.ExtendsNone
	data, err := yaml.Marshal(&whole)
	if err != nil {
		return nil, "", connect.NewError(connect.CodeInternal, fmt.Errorf("encode policy: %w", err))
	}
	return data, p.SHA256(), nil
}

// policyInvalid reports every problem the checker found, one a line, as
// `corral policy check` prints them.
func policyInvalid(err error) error {
	var ve *policy.ValidationError
	if errors.As(err, &ve) {
		lines := make([]string, len(ve.Problems))
		for i, pr := range ve.Problems {
			lines[i] = pr.String()
		}
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("invalid policy:\n%s", strings.Join(lines, "\n")))
	}
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("invalid policy: %w", err))
}

type policyService struct{ s *Server }

func (h *policyService) Get(ctx context.Context, req *connect.Request[gatewayv1.GetPolicyRequest]) (*connect.Response[gatewayv1.PolicyVersion], error) {
	pv, err := h.s.store.Policy(ctx, req.Msg.SandboxId, req.Msg.Version)
	if err != nil {
		return nil, storeErr(fmt.Sprintf("policy of sandbox %s", req.Msg.SandboxId), err)
	}
	return connect.NewResponse(policyProto(pv)), nil
}

func (h *policyService) History(ctx context.Context, req *connect.Request[gatewayv1.PolicyHistoryRequest]) (*connect.Response[gatewayv1.PolicyHistoryResponse], error) {
	id := req.Msg.SandboxId
	if _, err := h.s.store.GetSandbox(ctx, id); err != nil {
		return nil, storeErr("sandbox "+id, err)
	}
	pvs, err := h.s.store.PolicyHistory(ctx, id)
	if err != nil {
		return nil, storeErr("policy history of "+id, err)
	}
	out := &gatewayv1.PolicyHistoryResponse{}
	for _, pv := range pvs {
		out.Versions = append(out.Versions, policyProto(pv))
	}
	return connect.NewResponse(out), nil
}

func (h *policyService) Set(ctx context.Context, req *connect.Request[gatewayv1.SetPolicyRequest]) (*connect.Response[gatewayv1.PolicyVersion], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	id := req.Msg.SandboxId
	sb, err := h.s.store.GetSandbox(ctx, id)
	if err != nil {
		return nil, storeErr("sandbox "+id, err)
	}
	if sb.Phase.Ended() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("sandbox %s has %s; its policy can no longer change", id, sb.Phase))
	}
	prev, err := h.s.runningPolicy(ctx, id)
	if err != nil {
		return nil, err
	}
	running, err := policy.ParseOnto(prev.YAML, fmt.Sprintf("%s v%d", policySource, prev.Version), nil)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("stored policy v%d of %s: %w", prev.Version, id, err))
	}
	// Like `corral policy set`: sections the file leaves out stay as
	// they run.
	next, err := policy.ParseOnto([]byte(req.Msg.Yaml), policySource, running)
	if err != nil {
		return nil, policyInvalid(err)
	}
	if err := running.CheckReload(next); err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	data, sum, err := storedPolicy(next)
	if err != nil {
		return nil, err
	}
	if err := h.s.checkGatewaySecrets(ctx, next); err != nil {
		return nil, err
	}
	pv, err := h.s.store.AddPolicy(ctx, id, data, sum, p.Name)
	if err != nil {
		return nil, storeErr("store policy", err)
	}
	h.s.metrics.policyVersions.Inc()
	h.s.changes.Publish(change{sandboxID: id})
	h.s.log.Info("policy set", "sandbox", id, "version", pv.Version, "sha256", sum, "author", p.Name)
	h.s.publishSandbox(ctx, id)
	return connect.NewResponse(policyProto(pv)), nil
}

// runningPolicy is the version a new one is laid over: the newest the
// supervisor did not refuse. A refused version never ran, so what it
// changed must not carry into the next (version 1 is the floor: the
// sandbox cannot have started without it).
func (s *Server) runningPolicy(ctx context.Context, id string) (store.PolicyVersion, error) {
	pvs, err := s.store.PolicyHistory(ctx, id)
	if err != nil {
		return store.PolicyVersion{}, storeErr("policy history of "+id, err)
	}
	if len(pvs) == 0 {
		return store.PolicyVersion{}, connect.NewError(connect.CodeNotFound, fmt.Errorf("sandbox %s has no policy", id))
	}
	for _, pv := range pvs {
		if pv.Status != store.PolicyFailed {
			return pv, nil
		}
	}
	return pvs[len(pvs)-1], nil
}
