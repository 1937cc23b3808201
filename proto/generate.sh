#!/usr/bin/env bash
# Regenerates the Go code for proto/ with pinned generators. CI runs it and
# fails when the committed code differs. protoc itself comes from Debian's
# protobuf-compiler; the plugins are built at the versions below.
set -euo pipefail
cd "$(dirname "$0")/.."

PROTOC_GEN_GO=google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_CONNECT_GO=connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1

if ! command -v protoc >/dev/null; then
	echo "protoc not found: apt-get install protobuf-compiler" >&2
	exit 1
fi
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
GOBIN=$bin GOFLAGS= go install "$PROTOC_GEN_GO"
GOBIN=$bin GOFLAGS= go install "$PROTOC_GEN_CONNECT_GO"

module=github.com/corral-sandbox/corral
PATH=$bin:$PATH protoc -I proto \
	--go_out=. --go_opt=module=$module \
	--connect-go_out=. --connect-go_opt=module=$module \
	$(cd proto && find corral -name "*.proto" | sort | sed "s|^|proto/|")
