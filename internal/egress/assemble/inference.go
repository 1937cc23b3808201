package assemble

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/inference"
	"github.com/corral-sandbox/corral/internal/inference/keymask"
	"github.com/corral-sandbox/corral/internal/policy"
)

// newRouter creates the inference.local router on the routes in force:
// --inference-routes or the gateway's, else the policy's. It is served whether or not any
// route exists, so that a client without one is told how to configure it.
func (e *Egress) newRouter() error {
	routes := e.cfg.Policy.Inference
	if e.cfg.Inference != nil {
		routes = *e.cfg.Inference
		if len(routes.Routes) == 0 {
			e.cfg.Log.Info("inference routing is off: the routes given for the run (--inference-routes or the gateway's) list no route")
		}
	}
	r, err := inference.NewRouter(routes, inference.Options{Dial: e.dialBackend, OnRequest: e.inferenceEvent, Mask: keymask.New})
	if err != nil {
		return fmt.Errorf("inference routes: %w", err)
	}
	e.router = r
	e.AddService(inference.Host, r)
	return nil
}

// swapRoutes puts c's model routes in force, unless --inference-routes
// or SetRoutes fixed them for the run.
func (e *Egress) swapRoutes(c *policy.Compiled) error {
	e.routesMu.Lock()
	defer e.routesMu.Unlock()
	if e.cfg.Inference != nil || e.routesSet {
		return nil
	}
	if err := e.routeKeys("the reloaded policy's inference.routes", c.Inference.Routes); err != nil {
		return err
	}
	if err := e.router.Swap(c.Inference); err != nil {
		return fmt.Errorf("inference routes: %w", err)
	}
	return nil
}

// SetRoutes puts routes from outside the policy (the gateway's) in force
// on the running router, for the rest of the run: policy reloads no longer
// change them. Routes that do not build leave those in force.
func (e *Egress) SetRoutes(c inference.Config) error {
	e.routesMu.Lock()
	defer e.routesMu.Unlock()
	if err := e.routeKeys("the gateway's routes", c.Routes); err != nil {
		return err
	}
	if err := e.router.Swap(c); err != nil {
		return fmt.Errorf("inference routes: %w", err)
	}
	e.routesSet = true
	return nil
}

// routeKeys is Config.RouteKeys, or no check without one.
func (e *Egress) routeKeys(origin string, routes []inference.Route) error {
	if e.cfg.RouteKeys == nil {
		return nil
	}
	return e.cfg.RouteKeys(origin, routes)
}

// dialBackend connects to a route's backend through the guarded dialer,
// which lets a route (never a network policy) reach a model server on
// this host's loopback or a private network.
func (e *Egress) dialBackend(ctx context.Context, _, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("backend port %q: %w", port, err)
	}
	r := egress.Request{Host: host, Port: uint16(n), Via: "inference"}
	if ip, err := netip.ParseAddr(host); err == nil {
		r = egress.Request{IP: ip, Port: uint16(n), Via: "inference"}
	}
	return e.dial.Backend(ctx, r)
}

func (e *Egress) inferenceEvent(ctx context.Context, rec inference.Record) {
	if e.cfg.Audit == nil {
		return
	}
	r, _ := egress.RequestFrom(ctx)
	e.cfg.Audit.Log(audit.InferenceRequestEvent{
		Route: rec.Route, Protocol: rec.Protocol, ClientModel: rec.ClientModel, RoutedModel: rec.RoutedModel,
		Status: rec.Status, DurationMS: rec.Duration.Milliseconds(), TTFBMS: rec.TTFB.Milliseconds(),
		InputTokens: rec.InputTokens, OutputTokens: rec.OutputTokens, BytesIn: rec.BytesIn, BytesOut: rec.BytesOut,
		Binary: r.Identity.Binary, PID: r.Identity.PID, Error: rec.Err,
	})
}
