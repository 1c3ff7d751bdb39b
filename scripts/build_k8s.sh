#!/usr/bin/env bash
# Build etcd, kube-apiserver, kube-scheduler and kwok from their Go modules into .k8s/bin/ (ignored).
#
#   bash scripts/build_k8s.sh            # build once; later runs reuse .k8s/bin/ (version stamps)
#   bash scripts/build_k8s.sh --force    # rebuild even if the stamps match
#   K8S_BUILD_JOBS=1 bash scripts/build_k8s.sh   # go build -p (default 2); builds run under nice 19
#
# kwok (sigs.k8s.io/kwok v0.8.0, Apache-2.0) simulates nodes and pods against the real
# kube-apiserver (the fleet of fedsched.experiment.fleet). It has its own stamp (.k8s/bin/kwok.VERSION)
# and its own section below (between the `>>> kwok` / `<<< kwok` marks): the control plane's
# recipe hash leaves that section out, so a change to kwok's recipe rebuilds kwok alone and a
# change anywhere else rebuilds the control plane (kwok too: its hash covers the whole script).
# First build about 2 minutes on 2 cores (its k8s.io/* v0.36 staging modules are its own).
#
# Pinned: k8s.io/kubernetes v1.37.2 (every k8s.io/* staging module replaced by v0.37.2, the way
# kubernetes-sigs/scheduler-plugins' go.mod does it) and go.etcd.io/etcd/server/v3 v3.7.3 (the
# 3.7 line that k8s v1.37.2 itself requires). Everything comes from the Go module proxy; the
# module and build caches stay where `go env GOMODCACHE GOCACHE` says, so a rebuild is fast.
# Two generated modules live under .k8s/src/ (kubernetes/ and etcd/, kept apart so that etcd's
# newer patch release does not change the etcd client that kube-apiserver is built with).
#
# Starting the control plane by hand on loopback: these exact flags were checked with the
# binaries this script builds (v1.37.2 / etcd 3.7.3): /readyz answered "ok" 3 s after start,
# anonymous requests get 401, kube-scheduler's /healthz is "ok" and it takes the
# kube-system/kube-scheduler lease. Ports are off the defaults so a shared machine's own
# processes do not collide; pick free ones in the test fixture.
#   D=$(mktemp -d)
#   openssl genrsa -out $D/sa.key 2048
#   echo "fedsched-admin-token,admin,admin,system:masters" > $D/tokens.csv
#   .k8s/bin/etcd --data-dir $D/etcd \
#       --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
#       --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
#       --initial-cluster default=http://127.0.0.1:23800 --listen-metrics-urls '' --log-level warn &
#   .k8s/bin/kube-apiserver --etcd-servers http://127.0.0.1:23790 \
#       --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port 16443 \
#       --cert-dir $D/pki \
#       --service-account-key-file $D/sa.key --service-account-signing-key-file $D/sa.key \
#       --service-account-issuer https://kubernetes.default.svc.cluster.local \
#       --service-cluster-ip-range 10.96.0.0/12 --endpoint-reconciler-type none \
#       --authorization-mode AlwaysAllow --token-auth-file $D/tokens.csv &
#   curl -sk -H "Authorization: Bearer fedsched-admin-token" https://127.0.0.1:16443/readyz  # ok
# Notes: --cert-dir makes the apiserver write its own self-signed pair ($D/pki/apiserver.crt/.key,
# usable as the kubeconfig's certificate-authority). --endpoint-reconciler-type none is required
# with --advertise-address 127.0.0.1: the default lease reconciler refuses a loopback address
# ("cannot use public IP 127.0.0.1 with endpoint reconciler ... may not be in the loopback
# range") and the apiserver exits at once. AlwaysAllow turns anonymous auth off (a warning).
# kube-scheduler against it, with a kubeconfig whose user is `token: fedsched-admin-token`,
# cluster `server: https://127.0.0.1:16443`, `certificate-authority: $D/pki/apiserver.crt`:
#   .k8s/bin/kube-scheduler --kubeconfig $D/kubeconfig --authentication-kubeconfig $D/kubeconfig \
#       --authorization-kubeconfig $D/kubeconfig --bind-address 127.0.0.1 --secure-port 10359 \
#       --cert-dir $D/sched-pki &
#   curl -sk https://127.0.0.1:10359/healthz  # ok
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.7.3}"
JOBS="${K8S_BUILD_JOBS:-2}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
K8S_DIR="$ROOT/.k8s"
BIN="$K8S_DIR/bin"
SRC="$K8S_DIR/src"
STAMP="$BIN/VERSION"
BINARIES=(etcd kube-apiserver kube-scheduler)

FORCE=0
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -h|--help) sed -n '2,7p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "build_k8s: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

say() { echo "build_k8s: $*" >&2; }
die() { echo "build_k8s: ERROR: $*" >&2; exit 1; }
trap 'echo "build_k8s: FAILED (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR

command -v go >/dev/null || die "go is not on PATH (Go >= 1.26 is needed for k8s.io/kubernetes $K8S_VERSION)"
[[ "$K8S_VERSION" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "K8S_VERSION must look like v1.37.2, got $K8S_VERSION"
K8S_MINOR="${BASH_REMATCH[1]}"
STAGING_VERSION="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
(( K8S_MINOR >= 34 )) || die "Kubernetes 1.34 or newer is required, got $K8S_VERSION"

GO_VERSION="$(go env GOVERSION)"
# the script's own hash is in the stamp too: a changed recipe (flags, pins) rebuilds
# (the kwok section left out: a kwok-only change does not rebuild the control plane)
RECIPE="$(sed '/^# >>> kwok/,/^# <<< kwok/d' "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)"
WANT_STAMP="kubernetes=$K8S_VERSION staging=$STAGING_VERSION etcd=$ETCD_VERSION go=$GO_VERSION goarch=$(go env GOOS)/$(go env GOARCH) recipe=$RECIPE"

have_all() {
    local b
    for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
    [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT_STAMP" ]]
}

# >>> kwok ---------------------------------------------------------------------------------------
# sigs.k8s.io/kwok/cmd/kwok from its module (v0.8.0: go 1.26.0, so the Go 1.26 the control plane
# needs builds it without GOTOOLCHAIN; k8s.io/* v0.36.1; no replace directives, so a generated
# module that requires it builds it as released). Its own stamp.
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
KWOK_STAMP="$BIN/kwok.VERSION"
KWOK_WANT="kwok=$KWOK_VERSION go=$GO_VERSION goarch=$(go env GOOS)/$(go env GOARCH) recipe=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)"
build_kwok() {
    if [[ "$FORCE" -eq 0 && -x "$BIN/kwok" && -f "$KWOK_STAMP" && "$(cat "$KWOK_STAMP")" == "$KWOK_WANT" \
          && -f "$K8S_DIR/share/kwok/pod-ready.yaml" ]]; then
        say "kwok up to date in $BIN ($KWOK_WANT)"
        return 0
    fi
    [[ "$KWOK_VERSION" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "KWOK_VERSION must look like v0.8.0, got $KWOK_VERSION"
    say "building $KWOK_WANT"
    mkdir -p "$SRC/kwok" "$BIN"
    local gomod kwok_go
    gomod="$(cd /tmp && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" 2>&1)" \
        || die "cannot download sigs.k8s.io/kwok@$KWOK_VERSION (what the proxy offers: go list -m -versions sigs.k8s.io/kwok)"
    gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' <<<"$gomod")"
    kwok_go="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")"
    {
        echo "// Generated by scripts/build_k8s.sh; do not edit."
        echo "module fedsched.local/kwokbuild"
        echo
        echo "go $kwok_go"
        echo
        echo "require sigs.k8s.io/kwok $KWOK_VERSION"
        echo
        echo "tool sigs.k8s.io/kwok/cmd/kwok"
    } > "$SRC/kwok/go.mod.new"
    if [[ ! -f "$SRC/kwok/go.mod" ]] || ! cmp -s "$SRC/kwok/go.mod.new" "$SRC/kwok/go.mod.in"; then
        cp "$SRC/kwok/go.mod.new" "$SRC/kwok/go.mod"
        mv "$SRC/kwok/go.mod.new" "$SRC/kwok/go.mod.in"
        rm -f "$SRC/kwok/go.sum"
    else
        rm -f "$SRC/kwok/go.mod.new"
    fi
    local out
    out="$(mktemp -d "$K8S_DIR/out.XXXXXX")"
    (
        cd "$SRC/kwok"
        export CGO_ENABLED=0
        step "resolving kwok module graph (go mod tidy)" go mod tidy
        step "building kwok $KWOK_VERSION" go build -p "$JOBS" -trimpath -ldflags "-s -w" -o "$out/kwok" \
            sigs.k8s.io/kwok/cmd/kwok
    ) || { rm -rf "$out"; die "kwok build failed"; }
    local v
    v="$("$out/kwok" --version)" || { rm -rf "$out"; die "kwok --version failed"; }
    [[ "$v" == "kwok version $KWOK_VERSION "* ]] || { rm -rf "$out"; die "kwok reports '$v', expected $KWOK_VERSION"; }
    # kwok's released Stage configurations, the ones matching the binary, for the
    # fleet (fedsched.experiment.kwok reads them from .k8s/share/kwok/)
    local dir f
    dir="$(cd /tmp && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    rm -rf "$K8S_DIR/share/kwok.new" && mkdir -p "$K8S_DIR/share/kwok.new"
    for f in stage/node/fast/node-initialize.yaml stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
             stage/pod/fast/pod-ready.yaml stage/pod/fast/pod-delete.yaml; do
        [[ -f "$dir/kustomize/$f" ]] || { rm -rf "$out"; die "kwok $KWOK_VERSION has no kustomize/$f"; }
        cp "$dir/kustomize/$f" "$K8S_DIR/share/kwok.new/"
    done
    cp "$dir/LICENSE" "$K8S_DIR/share/kwok.new/LICENSE"
    rm -f "$KWOK_STAMP"
    mv -f "$out/kwok" "$BIN/kwok"
    rm -rf "$out" "$K8S_DIR/share/kwok"
    mv "$K8S_DIR/share/kwok.new" "$K8S_DIR/share/kwok"
    echo "$KWOK_WANT" > "$KWOK_STAMP"
    say "done: kwok in $BIN ($v), its stage configurations in $K8S_DIR/share/kwok"
}
# <<< kwok ---------------------------------------------------------------------------------------

# go build without a tty prints nothing until it is done: say when each step starts and ends.
step() {
    local what="$1"; shift
    local t0=$SECONDS
    say "$what ..."
    nice -n 19 "$@" || die "$what failed (command: $*)"
    say "$what done in $((SECONDS - t0))s"
}

if [[ "$FORCE" -eq 0 ]] && have_all; then
    say "up to date in $BIN ($WANT_STAMP); --force rebuilds"
    build_kwok
    exit 0
fi

say "building $WANT_STAMP"
say "GOMODCACHE=$(go env GOMODCACHE) GOCACHE=$(go env GOCACHE) GOPROXY=$(go env GOPROXY) jobs=$JOBS"
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-p=$JOBS"

# --- k8s.io/kubernetes: generated module with the staging replace block -------------------
say "fetching k8s.io/kubernetes@$K8S_VERSION go.mod from $(go env GOPROXY)"
KJSON="$(cd /tmp && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" 2>&1)" \
    || die "cannot download k8s.io/kubernetes@$K8S_VERSION: $(sed -n 's/^[[:space:]]*"Error": "\(.*\)".*/\1/p' <<<"$KJSON")
  (what the proxy offers: go list -m -versions k8s.io/kubernetes)"
KMOD="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' <<<"$KJSON")"
[[ -f "$KMOD" ]] || die "no go.mod for k8s.io/kubernetes@$K8S_VERSION"
GO_LINE="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$KMOD")"

# The staging modules are the `k8s.io/X => ./staging/src/k8s.io/X` replaces of the kubernetes
# go.mod; pin those that k8s.io/kubernetes actually requires (sample-cli-plugin and
# sample-controller are only replaced, never required, and the proxy does not serve them).
mapfile -t STAGING < <(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/src/.*#\1#p' "$KMOD")
[[ "${#STAGING[@]}" -gt 10 ]] || die "found no staging replaces in $KMOD"
REQUIRED=()
for m in "${STAGING[@]}"; do
    if grep -qE "^[[:space:]]*$(printf '%s' "$m" | sed 's/[.]/\\./g') v0\.0\.0( |$)" "$KMOD"; then
        REQUIRED+=("$m")
    fi
done
say "${#REQUIRED[@]} staging modules pinned to $STAGING_VERSION (of ${#STAGING[@]} in the kubernetes go.mod)"

mkdir -p "$SRC/kubernetes" "$SRC/etcd" "$BIN"
{
    echo "// Generated by scripts/build_k8s.sh; do not edit."
    echo "module fedsched.local/k8sbuild"
    echo
    echo "go $GO_LINE"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "tool ("
    echo "	k8s.io/kubernetes/cmd/kube-apiserver"
    echo "	k8s.io/kubernetes/cmd/kube-scheduler"
    echo ")"
    echo
    echo "replace ("
    for m in "${REQUIRED[@]}"; do echo "	$m => $m $STAGING_VERSION"; done
    echo ")"
} > "$SRC/kubernetes/go.mod.new"
if [[ ! -f "$SRC/kubernetes/go.mod" ]] || ! cmp -s "$SRC/kubernetes/go.mod.new" "$SRC/kubernetes/go.mod.in"; then
    # a new pin: start go.mod/go.sum afresh from the template
    cp "$SRC/kubernetes/go.mod.new" "$SRC/kubernetes/go.mod"
    mv "$SRC/kubernetes/go.mod.new" "$SRC/kubernetes/go.mod.in"
    rm -f "$SRC/kubernetes/go.sum"
else
    rm -f "$SRC/kubernetes/go.mod.new"
fi

# --- etcd: its own module (etcd's own go.mod has ../ replaces, so no `go install pkg@v`) -----
{
    echo "// Generated by scripts/build_k8s.sh; do not edit."
    echo "module fedsched.local/etcdbuild"
    echo
    echo "go $GO_LINE"
    echo
    echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    echo
    echo "tool go.etcd.io/etcd/server/v3"
} > "$SRC/etcd/go.mod.new"
if [[ ! -f "$SRC/etcd/go.mod" ]] || ! cmp -s "$SRC/etcd/go.mod.new" "$SRC/etcd/go.mod.in"; then
    cp "$SRC/etcd/go.mod.new" "$SRC/etcd/go.mod"
    mv "$SRC/etcd/go.mod.new" "$SRC/etcd/go.mod.in"
    rm -f "$SRC/etcd/go.sum"
else
    rm -f "$SRC/etcd/go.mod.new"
fi

# buildDate = the release's time on the proxy (not now), so a rebuild links the same binary and
# hits the build cache; the proxy gives no commit hash, so gitCommit keeps its default.
KINFO="${KMOD%.mod}.info"
BUILD_DATE="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$KINFO" 2>/dev/null || true)"
BUILD_DATE="${BUILD_DATE:-1970-01-01T00:00:00Z}"
ver_flags() {  # the -X flags hack/lib/version.sh sets, for component-base and client-go
    local pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        printf -- '-X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s ' \
            "$pkg" "$K8S_VERSION" "$pkg" "$pkg" "$K8S_MINOR"
        printf -- '-X %s.gitTreeState=clean -X %s.buildDate=%s ' "$pkg" "$pkg" "$BUILD_DATE"
    done
}

OUT="$(mktemp -d "$K8S_DIR/out.XXXXXX")"
trap 'rm -rf "$OUT"' EXIT

cd "$SRC/kubernetes"
step "resolving kubernetes module graph (go mod tidy, downloads on the first run)" go mod tidy
step "building kube-apiserver and kube-scheduler $K8S_VERSION" \
    go build -trimpath -ldflags "-s -w $(ver_flags)" -o "$OUT/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler

cd "$SRC/etcd"
step "resolving etcd module graph (go mod tidy)" go mod tidy
step "building etcd $ETCD_VERSION" \
    go build -trimpath -ldflags "-s -w" -o "$OUT/etcd" go.etcd.io/etcd/server/v3

say "checking the binaries run"
# (outputs captured first: `cmd | grep -q` can kill cmd with SIGPIPE, which pipefail reports)
v_api="$("$OUT/kube-apiserver" --version)" || die "kube-apiserver --version failed"
v_sched="$("$OUT/kube-scheduler" --version)" || die "kube-scheduler --version failed"
v_etcd="$("$OUT/etcd" --version)" || die "etcd --version failed"
say "kube-apiserver: $v_api; kube-scheduler: $v_sched; etcd: $(head -1 <<<"$v_etcd")"
[[ "$v_api" == "Kubernetes $K8S_VERSION" ]] || die "kube-apiserver reports '$v_api', expected Kubernetes $K8S_VERSION"
[[ "$v_sched" == "Kubernetes $K8S_VERSION" ]] || die "kube-scheduler reports '$v_sched', expected Kubernetes $K8S_VERSION"
[[ "$v_etcd" == *"etcd Version: ${ETCD_VERSION#v}"* ]] || die "etcd reports '$v_etcd', expected ${ETCD_VERSION#v}"

rm -f "$STAMP"
for b in "${BINARIES[@]}"; do mv -f "$OUT/$b" "$BIN/$b"; done
echo "$WANT_STAMP" > "$STAMP"
say "done: ${BINARIES[*]} in $BIN ($WANT_STAMP)"
build_kwok
