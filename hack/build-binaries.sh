#!/usr/bin/env bash
# Builds the upstream control-plane programs from the Go modules pinned under
# hack/cluster/, once per pin set. Each module's binaries land in a folder
# named after the hash of its go.mod and go.sum, under a per-user cache so a
# fresh clone on the same machine reuses them; .cache/bin in the work tree
# links to the current set. A pin change gives a new hash and a rebuild, and
# so do extra linker flags (helm's), which are part of the hash when given.
# A package added to a module's line is not in the hash: an entry that lacks
# one of the line's programs is built again, so a warm cache gets it too.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
store=${AMBIENT_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ambient-operator}
mkdir -p "$store" .cache/bin .cache/gateway-api .cache/istio

# The program `go build` makes of a package: its last path element, a major
# version suffix (/v3) skipped; etcd's server module is renamed etcd below.
program() { # program MODULE_DIR PACKAGE
  local pkg=$2
  if [[ ${pkg##*/} =~ ^v[0-9]+$ ]]; then pkg=${pkg%/*}; fi
  pkg=${pkg##*/}
  if [ "$1" = etcd ] && [ "$pkg" = server ]; then pkg=etcd; fi
  printf '%s' "$pkg"
}

build() { # build MODULE_DIR [--ldflags FLAGS] [--tags TAGS] [--cgo|--static] [--into DIR] PACKAGE...
  local dir=$1; shift
  local extra="" tags="" cgo="" into=.cache/bin
  while [[ ${1:-} == --* ]]; do
    case $1 in
      --ldflags) extra=$2; shift 2 ;;
      --tags) tags=$2; shift 2 ;;
      --cgo) cgo=1; shift ;;
      --static) cgo=0; shift ;;
      --into) into=$2; shift 2 ;;
      *) echo "build: unknown option $1" >&2; exit 1 ;;
    esac
  done
  # Build tags and cgo (on, or off: --static) change the program, so they are
  # part of the hash when given; a build without them keeps the hash it always had.
  local hash
  # A module's own Go source (coredns's main) is part of it too; tools.go only
  # pins, and leaving it out keeps the hashes of the modules that have nothing else.
  hash=$({ cat "hack/cluster/$dir/go.mod" "hack/cluster/$dir/go.sum"
    find "hack/cluster/$dir" -name '*.go' ! -name tools.go -print0 | LC_ALL=C sort -z | xargs -0r cat
    [ -z "$extra" ] || printf '%s' "$extra"
    [ -z "$tags" ] || printf 'tags=%s' "$tags"; [ "$cgo" != 1 ] || printf 'cgo'
    [ "$cgo" != 0 ] || printf 'static'; } \
    | sha256sum | cut -c1-16)
  local out="$store/$dir-$hash"
  local complete=yes pkg
  [ -f "$out/.complete" ] || complete=""
  for pkg in "$@"; do [ -f "$out/$(program "$dir" "$pkg")" ] || complete=""; done
  if [ -z "$complete" ]; then
    echo "building $dir ($*) into $out" >&2
    local began=$SECONDS
    rm -rf "$out.tmp" && mkdir -p "$out.tmp"
    (cd "hack/cluster/$dir" && env ${cgo:+CGO_ENABLED=$cgo} go build -trimpath ${tags:+-tags "$tags"} \
      -ldflags="-s -w${extra:+ $extra}" -o "$out.tmp/" "$@")
    # etcd's server module builds its main package under the name "server".
    if [ "$dir" = etcd ]; then mv "$out.tmp/server" "$out.tmp/etcd"; fi
    touch "$out.tmp/.complete"
    rm -rf "$out" && mv "$out.tmp" "$out"
    echo "built $dir in $((SECONDS - began))s" >&2
  fi
  mkdir -p "$root/$into"
  for f in "$out"/*; do ln -sfn "$f" "$root/$into/$(basename "$f")"; done
}

# Debian packages a build or the real node needs, installed when missing
# (sessions and CI run as root): libseccomp's headers for runc's seccomp
# support, nft and iptables for kube-proxy and the CNI plugins, which call
# those programs rather than talking netlink themselves.
apt_need() { # apt_need PACKAGE...
  local missing=() p
  for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing ${missing[*]} with apt-get" >&2
  # `make test` runs the image build beside this one, and it may install
  # packages too: apt takes turns on a lock of ours (hack/images' APT_LOCK)
  # rather than failing on dpkg's.
  (
    flock 9
    apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
  ) 9>/run/lock/ambient-operator-apt.lock
}

# The Gateway API CRDs are data, not programs: copy the standard channel of
# each pinned release out of the module cache.
crds() { # crds MODULE_DIR NAME
  local dir=$1 name=$2
  local src
  src=$(cd "hack/cluster/$dir" && go mod download -json sigs.k8s.io/gateway-api | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf ".cache/gateway-api/$name" && mkdir -p ".cache/gateway-api/$name"
  cp "$src"/config/crd/standard/*.yaml ".cache/gateway-api/$name/"
  chmod u+w ".cache/gateway-api/$name"/*.yaml
}

# Istio's Helm charts are data too: the ones the tests install or compare
# against, copied from the pinned istio.io/istio module with their profiles,
# and the module's own VERSION file (its development line, e.g. 1.31).
istio_charts() {
  local src
  src=$(cd hack/cluster/istio && go mod download -json istio.io/istio | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  rm -rf .cache/istio/charts.tmp && mkdir -p .cache/istio/charts.tmp
  for chart in base istio-control/istio-discovery ztunnel istio-cni; do
    cp -r "$src/manifests/charts/$chart" ".cache/istio/charts.tmp/$(basename "$chart")"
  done
  cp "$src/VERSION" .cache/istio/charts.tmp/VERSION
  chmod -R u+w .cache/istio/charts.tmp
  rm -rf .cache/istio/charts && mv .cache/istio/charts.tmp .cache/istio/charts
}

# SKIP_KUBERNETES=1 builds the rest only (used while bootstrapping).
build etcd go.etcd.io/etcd/server/v3
[ -n "${SKIP_KUBERNETES:-}" ] || build kubernetes k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
build kwok sigs.k8s.io/kwok/cmd/kwok
# helm, stamped as Helm's own release builds (its Makefile) stamp it: with its
# version, and with the Kubernetes version of the client-go it is built with
# (major + 1, minor: client-go v0.37.x is Kubernetes 1.37), which `helm
# template` and `helm lint` assume when no cluster is asked. A plain build
# assumes v1.20, which the chart refuses.
helm_version=$(cd hack/cluster/helm && go list -m -f '{{.Version}}' helm.sh/helm/v3)
client_go=$(cd hack/cluster/helm && go list -m -f '{{.Version}}' k8s.io/client-go)
IFS=. read -r k8s_major k8s_minor _ <<<"${client_go#v}"
if ! [[ $k8s_major =~ ^[0-9]+$ && $k8s_minor =~ ^[0-9]+$ ]]; then
  echo "cannot tell the Kubernetes version of k8s.io/client-go $client_go" >&2
  exit 1
fi
helm_flags="-X helm.sh/helm/v3/internal/version.version=$helm_version"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  helm_flags+=" -X $pkg.k8sVersionMajor=$((k8s_major + 1)) -X $pkg.k8sVersionMinor=$k8s_minor"
done
build helm --ldflags "$helm_flags" helm.sh/helm/v3/cmd/helm
# istiod, run out of cluster against the local API server by the tests and the demo.
# Static, as Istio's release builds are (CGO_ENABLED=0): then the Go build cache
# holds its packages as the install-cni image's build (hack/images) compiles
# them, and a cold run compiles the istio.io/istio tree once rather than twice.
build istio --static istio.io/istio/pilot/cmd/pilot-discovery
# istioctl from the same istio.io/istio (hack/cluster/istioctl pins it, a module
# of its own so that ../istio's entry stays): the tests run `istioctl analyze`.
build istioctl --static istio.io/istio/istioctl/cmd/istioctl
# krew, kubectl's plugin manager, and its manifest validator: the tests install
# the plugin from the archive hack/gen_krew.py builds, with its manifest.
build krew sigs.k8s.io/krew/cmd/krew sigs.k8s.io/krew/cmd/validate-krew-manifest
# A registry server (distribution) and a registry client we did not write
# (crane): the image tests push to the first on loopback and read back with
# the second (hack/images, docs/images.md).
build registry github.com/distribution/distribution/v3/cmd/registry github.com/google/go-containerregistry/cmd/crane
# The real Linux node (hack/devcluster's RealNode): containerd with its
# client and runc shim, runc with seccomp (cgo), the CNI reference plugins (in
# a folder of their own: containerd runs every program of its CNI folder by
# name), the kubelet and kube-proxy at the control plane's Kubernetes version
# (a module of their own: the kubelet needs go.sum entries that
# ../kubernetes lacks, and adding them there would rebuild the control plane),
# CoreDNS with just the plugins the node's Corefile names (cmd/coredns), and
# crictl (the node's stop removes its pods through the CRI, as the kubelet
# would, so that the CNI plugins undo what they did). SKIP_NODE=1 leaves them
# out.
if [ -z "${SKIP_NODE:-}" ]; then
  # ipset: the node's stop removes the sets istio-cni leaves on the host.
  apt_need libseccomp-dev nftables iptables ipset
  # Stamped with their versions as release builds are, since the Node's
  # status reports them (kubeletVersion, containerRuntimeVersion): a plain
  # build says v0.0.0-master and 2.4.2+unknown.
  containerd_version=$(cd hack/cluster/containerd && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
  build containerd --ldflags "-X github.com/containerd/containerd/v2/version.Version=${containerd_version#v}" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr
  build runc --cgo --tags seccomp github.com/opencontainers/runc
  build cni-plugins --into .cache/cni/bin github.com/containernetworking/plugins/plugins/main/bridge \
    github.com/containernetworking/plugins/plugins/ipam/host-local \
    github.com/containernetworking/plugins/plugins/main/loopback \
    github.com/containernetworking/plugins/plugins/meta/portmap
  kube_version=$(cd hack/cluster/node && go list -m -f '{{.Version}}' k8s.io/kubernetes)
  IFS=. read -r kube_major kube_minor _ <<<"${kube_version#v}"
  kube_flags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kube_flags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$kube_major"
    kube_flags+=" -X $pkg.gitMinor=$kube_minor -X $pkg.gitTreeState=clean"
  done
  build node --ldflags "${kube_flags# }" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
  build coredns ambient-operator/hack/cluster/coredns/cmd/coredns
  build cri-tools sigs.k8s.io/cri-tools/cmd/crictl
fi
istio_charts
crds gateway-api-v1.4 v1.4
crds gateway-api-v1.6 v1.6
ls .cache/bin >&2
