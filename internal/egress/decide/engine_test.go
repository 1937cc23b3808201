package decide

// The tests evaluate users' rules too, and the property test holds the Go
// evaluation of the baked-in rules to OPA's: both need the engine that
// corral's full program carries.
import _ "github.com/corral-sandbox/corral/internal/egress/decide/rego"
