package server

import (
	"context"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
	"github.com/corral-sandbox/corral/internal/inference"
)

type routeService struct{ s *Server }

// checkRoutes reads routes YAML as an --inference-routes file is read.
func checkRoutes(text string) error {
	if _, err := inference.ParseRoutes([]byte(text)); err != nil {
		return invalid("inference routes: %w", err)
	}
	return nil
}

func (h *routeService) Set(ctx context.Context, req *connect.Request[gatewayv1.SetRoutesRequest]) (*connect.Response[gatewayv1.Routes], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkRoutes(req.Msg.Yaml); err != nil {
		return nil, err
	}
	r, err := h.s.store.AddRoutes(ctx, []byte(req.Msg.Yaml), p.Name)
	if err != nil {
		return nil, storeErr("store routes", err)
	}
	h.s.changes.Publish(change{routes: true})
	h.s.log.Info("routes set", "version", r.Version, "author", p.Name)
	return connect.NewResponse(routesProto(r)), nil
}

func (h *routeService) Get(ctx context.Context, _ *connect.Request[gatewayv1.GetRoutesRequest]) (*connect.Response[gatewayv1.Routes], error) {
	r, err := h.s.store.CurrentRoutes(ctx)
	if err != nil {
		return nil, storeErr("routes", err)
	}
	return connect.NewResponse(routesProto(r)), nil
}
