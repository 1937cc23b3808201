package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"connectrpc.com/connect"

	"github.com/corral-sandbox/corral/internal/gateway/auth"
	"github.com/corral-sandbox/corral/internal/gateway/driver"
	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
)

type sandboxService struct{ s *Server }

func (h *sandboxService) Create(ctx context.Context, req *connect.Request[gatewayv1.CreateSandboxRequest]) (*connect.Response[gatewayv1.Sandbox], error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	drvName := m.Driver
	if drvName == "" {
		drvName = "local"
	}
	drv, ok := h.s.drivers[drvName]
	if !ok {
		return nil, invalid("driver %q: this gateway has %s", drvName, strings.Join(slices.Sorted(maps.Keys(h.s.drivers)), ", "))
	}
	if drvName != DriverExternal && len(m.Command) == 0 {
		return nil, invalid("command: the %s driver needs a command to run in the sandbox", drvName)
	}
	if c, ok := drv.(driver.Checker); ok {
		if err := c.Check(store.Sandbox{Name: m.Name, Command: m.Command, Workdir: m.Workdir, Env: m.Env}); err != nil {
			return nil, invalid("%v", err)
		}
	}
	sb := store.Sandbox{Name: m.Name, Labels: m.Labels, Command: m.Command, Workdir: m.Workdir, Env: m.Env, Driver: drvName}
	// A user's policy is the operator's own: it may take any secret.
	secret, err := h.s.register(ctx, &sb, m.Policy, p.Name, nil)
	if err != nil {
		return nil, err
	}
	// The supervisor outlives this request: a cancelled call must not
	// take it down half started.
	dctx := context.WithoutCancel(ctx)
	ref, err := drv.Create(dctx, sb, driver.Link{URL: h.s.cfg.URL, CAFile: h.s.cfg.PKI.CAFile(), Token: secret})
	if err != nil {
		h.s.setPhase(dctx, sb.ID, store.PhaseFailed, nil, "driver "+drvName+": "+err.Error())
		return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("start sandbox %s with driver %s: %w", sb.ID, drvName, err))
	}
	if ref != "" {
		if err := h.s.store.SetDriverRef(dctx, sb.ID, ref); err != nil {
			return nil, storeErr("record driver reference", err)
		}
	}
	h.s.log.Info("sandbox created", "sandbox", sb.ID, "name", sb.Name, "driver", drvName, "author", p.Name)
	h.s.publishSandbox(dctx, sb.ID)
	return h.get(dctx, sb.ID)
}

// register checks policyYAML (the default when empty) and that the
// secrets it takes from_gateway are granted (nil: any), gives sb its
// id and first phase, and stores it with that policy as version 1 and its
// own credential, whose secret it returns; on failure it leaves nothing
// behind.
func (s *Server) register(ctx context.Context, sb *store.Sandbox, policyYAML, author string, granted func(name string) bool) (secret string, retErr error) {
	yaml, sum, err := s.checkNewPolicy(ctx, policyYAML, granted)
	if err != nil {
		return "", err
	}
	sb.ID, sb.Phase = auth.NewID(), store.PhaseProvisioning
	if err := s.store.CreateSandbox(ctx, *sb); err != nil {
		return "", storeErr("create sandbox", err)
	}
	defer func() {
		if retErr != nil {
			if err := s.store.DeleteSandbox(context.WithoutCancel(ctx), sb.ID); err != nil {
				s.log.Error("remove half-created sandbox", "sandbox", sb.ID, "err", err)
			}
		}
	}()
	if _, err := s.store.AddPolicy(ctx, sb.ID, yaml, sum, author); err != nil {
		return "", storeErr("store policy", err)
	}
	s.metrics.policyVersions.Inc()
	secret = auth.NewSecret(store.TokenSandbox)
	err = s.store.AddToken(ctx, store.Token{
		ID:        auth.NewID(),
		Name:      "sandbox " + sb.ID,
		Kind:      store.TokenSandbox,
		SandboxID: sb.ID,
		Hash:      auth.Hash(secret),
	})
	if err != nil {
		return "", storeErr("store sandbox credential", err)
	}
	return secret, nil
}

func (h *sandboxService) get(ctx context.Context, id string) (*connect.Response[gatewayv1.Sandbox], error) {
	sb, err := h.s.store.GetSandbox(ctx, id)
	if err != nil {
		return nil, storeErr("sandbox "+id, err)
	}
	pb, err := h.s.sandboxProto(ctx, sb)
	if err != nil {
		return nil, storeErr("sandbox "+id, err)
	}
	return connect.NewResponse(pb), nil
}

func (h *sandboxService) List(ctx context.Context, req *connect.Request[gatewayv1.ListSandboxesRequest]) (*connect.Response[gatewayv1.ListSandboxesResponse], error) {
	sbs, err := h.s.store.ListSandboxes(ctx, req.Msg.Selector)
	if err != nil {
		return nil, storeErr("list sandboxes", err)
	}
	out := &gatewayv1.ListSandboxesResponse{}
	for _, sb := range sbs {
		pb, err := h.s.sandboxProto(ctx, sb)
		if err != nil {
			return nil, storeErr("list sandboxes", err)
		}
		out.Sandboxes = append(out.Sandboxes, pb)
	}
	return connect.NewResponse(out), nil
}

func (h *sandboxService) Get(ctx context.Context, req *connect.Request[gatewayv1.GetSandboxRequest]) (*connect.Response[gatewayv1.Sandbox], error) {
	return h.get(ctx, req.Msg.Id)
}

func (h *sandboxService) Delete(ctx context.Context, req *connect.Request[gatewayv1.DeleteSandboxRequest]) (*connect.Response[gatewayv1.DeleteSandboxResponse], error) {
	id := req.Msg.Id
	sb, err := h.s.store.GetSandbox(ctx, id)
	if err != nil {
		return nil, storeErr("sandbox "+id, err)
	}
	last, err := h.s.sandboxProto(ctx, sb)
	if err != nil {
		return nil, storeErr("sandbox "+id, err)
	}
	ctx = context.WithoutCancel(ctx)
	if d, ok := h.s.drivers[sb.Driver]; ok {
		if err := d.Delete(ctx, sb); err != nil {
			return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("stop sandbox %s: %w", id, err))
		}
	}
	if err := h.s.store.DeleteSandbox(ctx, id); err != nil {
		return nil, storeErr("delete sandbox "+id, err)
	}
	h.s.tail.Drop(id)
	h.s.ingest.Lock()
	delete(h.s.dropped, id)
	h.s.ingest.Unlock()
	h.s.changes.Publish(change{sandboxID: id, deleted: true})
	h.s.sandboxEvents.Publish(sandboxEvent{sb: last, deleted: true})
	p, _ := principal(ctx)
	h.s.log.Info("sandbox deleted", "sandbox", id, "author", p.Name)
	return connect.NewResponse(&gatewayv1.DeleteSandboxResponse{}), nil
}

func (h *sandboxService) Watch(ctx context.Context, req *connect.Request[gatewayv1.WatchSandboxesRequest], stream *connect.ServerStream[gatewayv1.SandboxEvent]) error {
	id, selector := req.Msg.Id, req.Msg.Selector
	match := func(sb *gatewayv1.Sandbox) bool {
		if id != "" {
			return sb.Id == id
		}
		for k, v := range selector {
			if got, ok := sb.Labels[k]; !ok || got != v {
				return false
			}
		}
		return true
	}
	// Subscribe before reading the current state, so no change falls in
	// between; a change seen twice is harmless, as each event is a whole
	// state.
	sub := h.s.sandboxEvents.Subscribe(streamBuffer, func(e sandboxEvent) bool { return match(e.sb) })
	defer sub.Close()
	var current []store.Sandbox
	if id != "" {
		sb, err := h.s.store.GetSandbox(ctx, id)
		if err != nil {
			return storeErr("sandbox "+id, err)
		}
		current = []store.Sandbox{sb}
	} else {
		var err error
		if current, err = h.s.store.ListSandboxes(ctx, selector); err != nil {
			return storeErr("list sandboxes", err)
		}
	}
	sendHeaders(ctx)
	for _, sb := range current {
		pb, err := h.s.sandboxProto(ctx, sb)
		if err != nil {
			return storeErr("sandbox "+sb.ID, err)
		}
		if err := stream.Send(&gatewayv1.SandboxEvent{Sandbox: pb}); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return streamEnded(ctx)
		case e, ok := <-sub.C:
			if !ok {
				return connect.NewError(connect.CodeResourceExhausted, errors.New("the watcher fell too far behind; watch again"))
			}
			if err := stream.Send(&gatewayv1.SandboxEvent{Sandbox: e.sb, Deleted: e.deleted}); err != nil {
				return err
			}
			if e.deleted && id != "" {
				return nil // the one sandbox watched is gone
			}
		}
	}
}
