package auth

import (
	"strings"

	"github.com/corral-sandbox/corral/internal/gateway/store"
	"github.com/corral-sandbox/corral/internal/gatewayapi/gatewayv1/gatewayv1connect"
)

// userServices are the services a user may call, whole.
var userServices = map[string]bool{
	gatewayv1connect.SandboxServiceName: true,
	gatewayv1connect.PolicyServiceName:  true,
	gatewayv1connect.LogServiceName:     true,
	gatewayv1connect.SecretServiceName:  true,
	gatewayv1connect.RouteServiceName:   true,
}

// Allowed says whether a principal of kind may call procedure
// ("/package.Service/Method"). Anything not named here is denied: a new
// procedure is unreachable until someone decides who may call it.
func Allowed(kind store.TokenKind, procedure string) bool {
	service, _, ok := strings.Cut(strings.TrimPrefix(procedure, "/"), "/")
	if !ok {
		return false
	}
	switch kind {
	case store.TokenUser:
		return userServices[service]
	case store.TokenSandbox:
		return service == gatewayv1connect.SupervisorServiceName &&
			procedure != gatewayv1connect.SupervisorServiceJoinProcedure
	case store.TokenJoin:
		return procedure == gatewayv1connect.SupervisorServiceJoinProcedure
	}
	return false
}
