package server

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/policy"
)

// maxSecretBytes bounds one credential; real ones are far smaller.
const maxSecretBytes = 64 << 10

// secretService is write-only: no call returns a value. Supervisors get
// values only over their own Subscribe stream.
type secretService struct{ s *Server }

func (h *secretService) Set(ctx context.Context, req *connect.Request[gatewayv1.SetSecretRequest]) (*connect.Response[gatewayv1.SetSecretResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	name, value := req.Msg.Name, req.Msg.Value
	if !policy.ValidGatewaySecretName(name) {
		return nil, invalid("secret name %q: use letters, digits, '.', '_' and '-' (at most 128), starting with a letter or digit", name)
	}
	if len(value) == 0 || len(value) > maxSecretBytes {
		return nil, invalid("secret %s: the value must have 1 to %d bytes, not %d", name, maxSecretBytes, len(value))
	}
	sealed, err := h.s.cfg.Secrets.Seal(name, value)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	if err := h.s.store.PutSecret(ctx, store.Secret{Name: name, Sealed: sealed}); err != nil {
		return nil, storeErr("store secret "+name, err)
	}
	h.s.log.Info("secret set", "name", name, "author", p.Name)
	h.s.changes.Publish(change{secret: name})
	return connect.NewResponse(&gatewayv1.SetSecretResponse{}), nil
}

func (h *secretService) List(ctx context.Context, _ *connect.Request[gatewayv1.ListSecretsRequest]) (*connect.Response[gatewayv1.ListSecretsResponse], error) {
	names, err := h.s.store.ListSecrets(ctx)
	if err != nil {
		return nil, storeErr("list secrets", err)
	}
	return connect.NewResponse(&gatewayv1.ListSecretsResponse{Names: names}), nil
}

func (h *secretService) Delete(ctx context.Context, req *connect.Request[gatewayv1.DeleteSecretRequest]) (*connect.Response[gatewayv1.DeleteSecretResponse], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	if err := h.s.store.DeleteSecret(ctx, req.Msg.Name); err != nil {
		return nil, storeErr("secret "+req.Msg.Name, err)
	}
	h.s.log.Info("secret deleted", "name", req.Msg.Name, "author", p.Name)
	return connect.NewResponse(&gatewayv1.DeleteSecretResponse{}), nil
}

// checkGatewaySecrets refuses a policy that takes from_gateway a secret
// the gateway does not hold: its sandbox could not start.
func (s *Server) checkGatewaySecrets(ctx context.Context, p *policy.Policy) error {
	var missing []string
	for _, name := range p.GatewaySecrets() {
		if _, err := s.store.GetSecret(ctx, name); errors.Is(err, store.ErrNotFound) {
			missing = append(missing, name)
		} else if err != nil {
			return storeErr("secret "+name, err)
		}
	}
	if len(missing) > 0 {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"the policy takes from_gateway the secret(s) %s, which this gateway does not hold; set each first: corral gateway secret set NAME < value-file",
			strings.Join(missing, ", ")))
	}
	return nil
}

// checkGranted refuses a joining sandbox's policy that takes from_gateway a
// secret its join token does not grant. The error names only the policy's
// own names, never whether the gateway holds them: the answer is the same
// for a secret that exists and for one that does not.
func checkGranted(p *policy.Policy, granted func(name string) bool) error {
	var refused []string
	for _, name := range p.GatewaySecrets() {
		if !granted(name) {
			refused = append(refused, name)
		}
	}
	if len(refused) > 0 {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf(
			"the policy takes from_gateway the secret(s) %s, which the join token does not grant; ask the gateway's operator for a join token made with --secret NAME for each: corral gateway token create --join --secret NAME",
			strings.Join(refused, ", ")))
	}
	return nil
}

// gatewaySecretNames are the secrets a stored policy version takes
// from_gateway.
func gatewaySecretNames(pv store.PolicyVersion) ([]string, error) {
	p, err := policy.ParseOnto(pv.YAML, fmt.Sprintf("%s v%d", policySource, pv.Version), nil)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("stored policy v%d: %w", pv.Version, err))
	}
	return p.GatewaySecrets(), nil
}

// secretValues unseals the named secrets for sandbox id's supervisor. One
// the gateway no longer holds is left out (and logged): the supervisor
// then says which is missing, rather than every secret being withheld.
// A sandbox that has ended gets none: its credential stays valid so that
// its last log lines arrive, but it has no use for a secret, and its
// credential may be kept in the ended sandbox's state directory.
func (s *Server) secretValues(ctx context.Context, id string, names []string) ([]*gatewayv1.SecretValue, error) {
	if len(names) == 0 {
		return nil, nil
	}
	sb, err := s.store.GetSandbox(ctx, id)
	if err != nil {
		return nil, storeErr("sandbox "+id, err)
	}
	if sb.Phase.Ended() {
		return nil, nil
	}
	var out []*gatewayv1.SecretValue
	for _, name := range names {
		sec, err := s.store.GetSecret(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			s.log.Warn("the policy of a sandbox takes a secret the gateway does not hold", "sandbox", id, "secret", name)
			continue
		}
		if err != nil {
			return nil, storeErr("secret "+name, err)
		}
		value, err := s.cfg.Secrets.Open(name, sec.Sealed)
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("unseal secret %s: %w", name, err))
		}
		out = append(out, &gatewayv1.SecretValue{Name: name, Value: value})
	}
	return out, nil
}
