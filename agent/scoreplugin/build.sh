#!/usr/bin/env bash
# Build kube-scheduler v1.37.2 with the fedsched Score plugin into .k8s/bin/kube-scheduler-fedsched
# (the ignored folder scripts/build_k8s.sh builds into).
#
#   bash agent/scoreplugin/build.sh            # build once; later runs reuse the binary (stamp)
#   bash agent/scoreplugin/build.sh --force    # rebuild even if the stamp matches
#   K8S_BUILD_JOBS=1 bash agent/scoreplugin/build.sh   # go build -p (default 2); under nice 19
#
# The module (go.mod here) pins k8s.io/kubernetes v1.37.2 and replaces every k8s.io/* staging
# module by v0.37.2, the pins of scripts/build_k8s.sh, so the Go module and build caches it
# filled (`go env GOMODCACHE GOCACHE`) serve this build too. Everything else comes from the Go
# module proxy. The stamp holds a hash of the sources, go.mod/go.sum, this script and the Go
# version: any change rebuilds, nothing else does.
set -euo pipefail

K8S_VERSION="v1.37.2" # must match go.mod (checked below)
JOBS="${K8S_BUILD_JOBS:-2}"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="$ROOT/.k8s/bin"
OUT_BIN="$BIN/kube-scheduler-fedsched"
STAMP="$OUT_BIN.VERSION"

FORCE=0
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -h|--help) sed -n '2,7p' "$SELF"; exit 0 ;;
        *) echo "scoreplugin build: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

say() { echo "scoreplugin build: $*" >&2; }
die() { echo "scoreplugin build: ERROR: $*" >&2; exit 1; }

command -v go >/dev/null || die "go is not on PATH (Go >= 1.26 is needed for k8s.io/kubernetes $K8S_VERSION)"
cd "$HERE"
grep -q "^	k8s.io/kubernetes $K8S_VERSION\$" go.mod || die "go.mod does not require k8s.io/kubernetes $K8S_VERSION"
K8S_MINOR="$(sed -n 's/^v1\.\([0-9]*\)\..*/\1/p' <<<"$K8S_VERSION")"

# the inputs of the binary: the module's non-test Go files (not hack/, a module of its own)
SRC_HASH="$( { find cmd pkg -name '*.go' ! -name '*_test.go' -type f | LC_ALL=C sort | xargs sha256sum; sha256sum go.mod go.sum "$SELF"; } \
    | sha256sum | cut -c1-16)"
WANT_STAMP="kubernetes=$K8S_VERSION go=$(go env GOVERSION) goarch=$(go env GOOS)/$(go env GOARCH) src=$SRC_HASH"
if [[ "$FORCE" -eq 0 && -x "$OUT_BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT_STAMP" ]]; then
    say "up to date: $OUT_BIN ($WANT_STAMP); --force rebuilds"
    exit 0
fi

# buildDate = the release's time on the proxy, as scripts/build_k8s.sh: a rebuild links the same
# binary and hits the build cache.
KINFO="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.info"
[[ -f "$KINFO" ]] || (cd /tmp && go mod download "k8s.io/kubernetes@$K8S_VERSION") >/dev/null 2>&1 || true
BUILD_DATE="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$KINFO" 2>/dev/null || true)"
BUILD_DATE="${BUILD_DATE:-1970-01-01T00:00:00Z}"
LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$K8S_MINOR"
    LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$BUILD_DATE"
done

mkdir -p "$BIN"
TMP="$(mktemp -d "$ROOT/.k8s/out.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
export CGO_ENABLED=0
say "building $WANT_STAMP (go build -p $JOBS under nice 19) ..."
t0=$SECONDS
nice -n 19 go build -p "$JOBS" -trimpath -ldflags "$LDFLAGS" -o "$TMP/kube-scheduler-fedsched" ./cmd/kube-scheduler \
    || die "go build failed"
say "built in $((SECONDS - t0))s"

v="$("$TMP/kube-scheduler-fedsched" --version)" || die "kube-scheduler-fedsched --version failed"
[[ "$v" == "Kubernetes $K8S_VERSION" ]] || die "the binary reports '$v', expected Kubernetes $K8S_VERSION"

rm -f "$STAMP"
mv -f "$TMP/kube-scheduler-fedsched" "$OUT_BIN"
echo "$WANT_STAMP" > "$STAMP"
say "done: $OUT_BIN ($v, plugin FedschedScore)"
