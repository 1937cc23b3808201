// Command schemagen prints the policy JSON Schema. Run it from the module
// root as: go run ./internal/policy/schemagen > schema/policy.schema.json
package main

import (
	"fmt"
	"os"

	"github.com/corral-sandbox/corral/internal/policy/schema"
)

func main() {
	b, err := schema.Generate()
	if err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
	if _, err := os.Stdout.Write(b); err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
}
