#!/usr/bin/env bash
# Regenerate fedsched.common.proto's Python modules from common/proto/decision.proto:
#   common/proto/decision_pb2.py, decision_pb2.pyi, decision_pb2_grpc.py
#
# grpcio-tools runs in a throwaway venv so the project's pins (flwr 1.42 brings grpcio and
# protobuf 6.33.x) stay untouched. The generated decision_pb2.py refuses a protobuf runtime
# older than the protoc that made it, or of another major version, so the tools must embed a
# protoc no newer than the runtime: grpcio-tools 1.81.1 embeds libprotoc 33.5 (gencode 6.33.5,
# fine with the runtime 6.33.6); 1.82 and later embed protoc 35 (protobuf 7), which 6.x rejects.
#
# The proto is compiled under the virtual path fedsched/common/proto/ (protoc's -IVIRTUAL=DIR),
# so the grpc module imports its messages as `from fedsched.common.proto import decision_pb2`.
#
#   bash scripts/gen_proto.sh            # uses/creates /tmp/fedsched-protogen
#   GEN_VENV=/some/dir bash scripts/gen_proto.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GEN_VENV="${GEN_VENV:-/tmp/fedsched-protogen}"
GRPC_TOOLS_VERSION="${GRPC_TOOLS_VERSION:-1.81.1}"
PROTOBUF_VERSION="${PROTOBUF_VERSION:-6.33.6}"
PY="${PYTHON:-python3}"

if [[ ! -x "$GEN_VENV/bin/python" ]]; then
    "$PY" -m venv "$GEN_VENV"
fi
if ! "$GEN_VENV/bin/python" -m grpc_tools.protoc --version >/dev/null 2>&1 \
    || [[ "$("$GEN_VENV/bin/pip" show grpcio-tools 2>/dev/null | sed -n 's/^Version: //p')" != "$GRPC_TOOLS_VERSION" ]]; then
    "$GEN_VENV/bin/pip" install -q "grpcio-tools==$GRPC_TOOLS_VERSION" "protobuf==$PROTOBUF_VERSION"
fi

OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
"$GEN_VENV/bin/python" -m grpc_tools.protoc \
    -I"fedsched/common/proto=$ROOT/common/proto" \
    --python_out="$OUT" --pyi_out="$OUT" --grpc_python_out="$OUT" \
    "fedsched/common/proto/decision.proto"

for f in decision_pb2.py decision_pb2.pyi decision_pb2_grpc.py; do
    cp "$OUT/fedsched/common/proto/$f" "$ROOT/common/proto/$f"
done
echo "generated $ROOT/common/proto/decision_pb2.py, decision_pb2.pyi, decision_pb2_grpc.py ($("$GEN_VENV/bin/python" -m grpc_tools.protoc --version), grpcio-tools $GRPC_TOOLS_VERSION)"
