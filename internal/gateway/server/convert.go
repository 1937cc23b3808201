package server

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1"
)

var phaseToProto = map[store.Phase]gatewayv1.Phase{
	store.PhaseProvisioning: gatewayv1.Phase_PHASE_PROVISIONING,
	store.PhaseReady:        gatewayv1.Phase_PHASE_READY,
	store.PhaseExited:       gatewayv1.Phase_PHASE_EXITED,
	store.PhaseFailed:       gatewayv1.Phase_PHASE_FAILED,
}

var statusToProto = map[store.PolicyStatus]gatewayv1.PolicyStatus{
	store.PolicyPending: gatewayv1.PolicyStatus_POLICY_STATUS_PENDING,
	store.PolicyLoaded:  gatewayv1.PolicyStatus_POLICY_STATUS_LOADED,
	store.PolicyFailed:  gatewayv1.PolicyStatus_POLICY_STATUS_FAILED,
}

// sandboxProto is a sandbox with its newest policy version and status.
func (s *Server) sandboxProto(ctx context.Context, sb store.Sandbox) (*gatewayv1.Sandbox, error) {
	pb := &gatewayv1.Sandbox{
		Id:        sb.ID,
		Name:      sb.Name,
		Labels:    sb.Labels,
		Command:   sb.Command,
		Workdir:   sb.Workdir,
		Env:       sb.Env,
		Driver:    sb.Driver,
		Phase:     phaseToProto[sb.Phase],
		Reason:    sb.Reason,
		CreatedAt: timestamppb.New(sb.CreatedAt),
		UpdatedAt: timestamppb.New(sb.UpdatedAt),
	}
	if sb.ExitCode != nil {
		c := int32(*sb.ExitCode)
		pb.ExitCode = &c
	}
	pv, err := s.store.Policy(ctx, sb.ID, 0)
	switch {
	case err == nil:
		pb.PolicyVersion = pv.Version
		pb.PolicyStatus = statusToProto[pv.Status]
	case !errors.Is(err, store.ErrNotFound):
		return nil, fmt.Errorf("policy of %s: %w", sb.ID, err)
	}
	return pb, nil
}

func policyProto(pv store.PolicyVersion) *gatewayv1.PolicyVersion {
	pb := &gatewayv1.PolicyVersion{
		SandboxId: pv.SandboxID,
		Version:   pv.Version,
		Yaml:      string(pv.YAML),
		Sha256:    pv.SHA256,
		Author:    pv.Author,
		CreatedAt: timestamppb.New(pv.CreatedAt),
		Status:    statusToProto[pv.Status],
		Error:     pv.Error,
	}
	if !pv.StatusAt.IsZero() {
		pb.StatusAt = timestamppb.New(pv.StatusAt)
	}
	return pb
}

func routesProto(r store.Routes) *gatewayv1.Routes {
	return &gatewayv1.Routes{
		Version:   r.Version,
		Yaml:      string(r.YAML),
		Author:    r.Author,
		CreatedAt: timestamppb.New(r.CreatedAt),
	}
}

func logProto(e store.LogEntry) *gatewayv1.LogEntry {
	return &gatewayv1.LogEntry{
		Seq:       e.Seq,
		SandboxId: e.SandboxID,
		Time:      timestamppb.New(e.Time),
		Level:     e.Level,
		Source:    e.Source,
		Event:     e.Event,
		Message:   e.Message,
		Fields:    e.Fields,
	}
}
