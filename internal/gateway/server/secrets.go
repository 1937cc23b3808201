package server

import (
	"context"
	"regexp"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
)

// secretName is what a policy's from_gateway may name.
var secretName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

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
	if !secretName.MatchString(name) {
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
