// Command corral-gateway is corral's control plane: one server that
// creates, re-polices, watches and deletes many sandboxes and keeps their
// logs, credentials and model routes. It is a binary of its own so that
// gRPC, the SQL drivers and Prometheus never weigh on `corral run`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := newRootCmd().ExecuteContext(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "corral-gateway: %v\n", err)
		stop()
		os.Exit(1)
	}
}
