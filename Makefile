# Every target installs what it needs: the virtualenv at .venv and the
# control-plane binaries built from hack/cluster/*/go.mod (cached per pin set).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
NODES ?= operator/ambient_operator/samples/nodes-mixed.yaml
CLUSTER_STATE ?= .cache/cluster
# cluster-up runs a real Linux node beside the simulated ones (root, and the
# pause image of `make images`); REAL_NODE=0 leaves it out.
REAL_NODE ?= 1

.PHONY: all venv bins images test-tools lint typecheck test demo cluster-up cluster-down crd docs krew bench bench-cold bench-datapath bench-growth clean

all: test

# The dev cluster (hack/devcluster) is its own package: in the dev virtualenv,
# never in the operator's wheel or image.
$(VENV)/.installed: pyproject.toml hack/devcluster/pyproject.toml hack/images/pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]' -e hack/devcluster -e hack/images
	touch $@

venv: $(VENV)/.installed

bins:
	hack/build-binaries.sh

# The bundled images (docs/images.md) as OCI layouts in .cache/images/<name>/, built
# from pinned sources without Docker, each program cached per pin set. REGISTRY=
# host[:port]/prefix also pushes them (the Docker config's credentials); ONLY=a,b
# builds some. Sources come from GitHub, or from AMBIENT_SOURCES where it is set.
# The Windows bases are pulled by digest; AMBIENT_IMAGE_BASES=stand-in makes
# stand-ins where mcr.microsoft.com cannot be reached (the tests do).
images: venv
	$(PY) -m ambient_images $(if $(REGISTRY),--registry $(REGISTRY)) $(if $(ONLY),--only $(ONLY))

# The machine's tools a test runs for real (zsh for tests/test_completion.py),
# from Debian's apt when missing; a test without its tool fails, never skips.
test-tools:
	@command -v zsh >/dev/null || { apt-get update -q && apt-get install -y -q zsh; } \
		|| { echo "make test-tools: could not install zsh with apt-get (root and Debian's apt needed)" >&2; exit 1; }

lint: venv
	$(VENV)/bin/ruff check operator tests bench hack
	$(VENV)/bin/ruff format --check operator tests bench hack

typecheck: venv
	$(VENV)/bin/mypy

# Regenerate the CRDs from the pydantic models (a test fails if they drift):
# the top-level folder for `kubectl apply`, and the chart's, which Helm
# installs before the templates.
crd: venv
	$(VENV)/bin/ambient-operator crd --output crds/
	$(VENV)/bin/ambient-operator crd --output charts/ambient-operator/crds/

# Regenerate the AmbientMesh reference, the reason tables of the troubleshooting
# page, the permission tables (from the chart, rendered by the built helm), the
# architecture picture and the table of differences from Istio's charts (tests
# check all but the picture).
docs: venv bins
	$(PY) hack/gen_reference.py
	$(PY) hack/gen_troubleshooting.py
	$(PY) hack/gen_rbac.py
	$(PY) hack/gen_architecture.py
	$(PY) hack/gen_upstream_differences.py
	$(PY) hack/gen_helm_values.py
	$(PY) hack/gen_releases.py

# The krew release archive of `kubectl ambient` (into .cache/krew) and the manifest
# plugins/krew/ambient.yaml with its sha256 (tests/test_krew.py fails when it is stale).
krew: venv
	$(PY) hack/gen_krew.py

# The tests mostly wait for a control plane, so the files run on TEST_WORKERS
# processes, each with a local control plane of its own (conftest's session
# fixtures); a file stays on one worker, as its module fixtures need.
# TEST_WORKERS=0 runs them in this process, one after another; PYTEST_ARGS passes more
# (make test PYTEST_ARGS="tests/test_images.py -x").
TEST_WORKERS ?= 2

# The tests read the images' layouts (tests/test_images.py, the real node),
# built on stand-in Windows bases unless AMBIENT_IMAGE_BASES says otherwise:
# mcr.microsoft.com is out of reach on the machines the tests run on.
# hack/run_tests.py builds them beside `make bins lint typecheck` and pytest, at
# the lowest priority, and the tests that read them wait for the build's end.
test: venv test-tools
	$(PY) hack/run_tests.py --workers $(TEST_WORKERS) $(if $(PYTEST_ARGS),-- $(PYTEST_ARGS))

cluster-up: venv bins
	$(if $(filter 1,$(REAL_NODE)),$(PY) -m ambient_images --only pause)
	$(PY) -m ambient_devcluster up --state-dir $(CLUSTER_STATE) --nodes $(NODES) \
		$(if $(filter 1,$(REAL_NODE)),--real-node)

cluster-down: venv
	$(PY) -m ambient_devcluster down --state-dir $(CLUSTER_STATE)

# The simulated mixed cluster, then the real node's part (REAL_NODE=0 leaves it out):
# Istio's Linux agents for real pods, run by the operator's image.
demo: venv bins
	$(if $(filter 1,$(REAL_NODE)),$(PY) -m ambient_images --only ambient-operator,ztunnel,install-cni,sample-app,pause)
	$(PY) hack/demo.py $(if $(filter 1,$(REAL_NODE)),,--no-real-node)

# Every benchmark on private local clusters (about 75 minutes on 2 cores, 2026-12-07):
# a table, charts in bench/out/, and docs/performance.md.
bench: venv bins
	$(PY) bench/run_all.py
	$(MAKE) bench-datapath

# The data path on the real node (root; the images of `make images`): ztunnel's added
# latency, a new pod's redirection, the agents idle; a section of docs/performance.md.
bench-datapath: venv bins
	$(PY) -m ambient_images --only ambient-operator,ztunnel,install-cni,sample-app,pause
	$(PY) bench/datapath.py

# A cold `make test` in a fresh clone with every cache empty, timed (wall and CPU;
# docs/images.md). BUILDS_ONLY=1 times the builds alone, one after the other.
bench-cold: venv
	$(PY) bench/cold_test.py $(if $(filter 1,$(BUILDS_ONLY)),--builds-only)

# How cost grows with the cluster (S, M, L beside istiod and a floor; about 30 minutes
# on 2 cores): charts in bench/out/growth/ and docs/growth/, a section of docs/performance.md.
bench-growth: venv bins
	$(PY) bench/growth.py

clean:
	rm -rf $(VENV) .cache .mypy_cache .ruff_cache .pytest_cache
