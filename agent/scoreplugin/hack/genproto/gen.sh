#!/usr/bin/env bash
# Regenerate the Go stubs of common/proto/decision.proto into agent/scoreplugin/pkg/decisionpb/
# without protoc: protocompile (pure Go) compiles the .proto and the pinned protoc-gen-go /
# protoc-gen-go-grpc (the `tool` lines of this module's go.mod) generate the code.
#
#   bash agent/scoreplugin/hack/genproto/gen.sh           # write pkg/decisionpb/*.pb.go
#   bash agent/scoreplugin/hack/genproto/gen.sh --check   # exit 1 when they are stale
#
# Everything comes from the Go module proxy (module cache: `go env GOMODCACHE`).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PLUGIN_ROOT="$(cd "$HERE/../.." && pwd)"
PROTO="$(cd "$PLUGIN_ROOT/../.." && pwd)/common/proto/decision.proto"
CHECK=()
for arg in "$@"; do
    case "$arg" in
        --check) CHECK=(-check) ;;
        *) echo "gen.sh: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cd "$HERE"
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-p=${GO_BUILD_JOBS:-2}"
nice -n 19 go build -o "$TMP/" google.golang.org/protobuf/cmd/protoc-gen-go \
    google.golang.org/grpc/cmd/protoc-gen-go-grpc
nice -n 19 go build -o "$TMP/genproto" .
"$TMP/genproto" -proto "$PROTO" -out "$PLUGIN_ROOT" \
    -protoc-gen-go "$TMP/protoc-gen-go" -protoc-gen-go-grpc "$TMP/protoc-gen-go-grpc" "${CHECK[@]}"
