# The two commands a newcomer needs: `make up` runs the mesh, `make test` runs the tests.
# Everything else here is what those two install on a fresh clone.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NODE_DIR := tests/node
NODE_STAMP := $(NODE_DIR)/node_modules/.installed
PYTEST_ARGS ?=
# `make test` runs the suite in three pytest-xdist workers, also on a 2-core machine: the tests
# spend much of their time waiting (on sockets, JVMs and deadlines), so two workers leave the
# cores partly idle and a third finishes the suite sooner. --dist loadgroup keeps the mesh
# tests in one worker and in their order (tests/mesh_conftest_plugin.py, harness/xdist_groups.py);
# --no-loadscope-reorder hands groups out in collection order, that longest group first, instead
# of those with the most tests first. PYTEST_XDIST= runs it in one process.
PYTEST_XDIST ?= -n 3 --dist loadgroup --no-loadscope-reorder

.PHONY: test test-native up down status check java venv jars s3-deps s3-server node-clients syslog-clients bench clean

# The C modules (native/) are built by the install below, never when a process starts.
# LOGJAM_NATIVE_WERROR=1 in the environment (CI sets it) makes every warning an error.
NATIVE_SOURCES := setup.py logjam/constants.py $(wildcard native/*.c native/*.h native/*.py)
# logjam-spark's Hadoop local filesystem (native/jar.py): compiled against the installed pyspark,
# so after pip install.
JAVA_SOURCES := $(shell find native/java -name '*.java' 2>/dev/null)
# Jars from Maven Central, pinned by coordinates and sha256 (runtime/jars.py, runtime/jars.sha256),
# in build/jars/<set>/: `delta` (Delta Lake for Spark) with every install; `s3` (hadoop-aws and the
# AWS SDK's modules, for s3a://) by `make s3-deps`. Maven fetches a set once; after that a set that
# still matches its pins is left alone (checking takes a fraction of a second).
JARS_SOURCES := runtime/jars.py runtime/jars.sha256
# The tests' S3 server (harness/s3.py): versitygw, built from source by `go install` at harness/s3.py's VERSITYGW_VERSION
# into build/bin (about 4 min of CPU once, 84 MB; Go's build cache makes a rebuild quick).
VERSITYGW_VERSION := $(shell sed -n 's/^VERSITYGW_VERSION = "\([^"]*\)".*/\1/p' harness/s3.py)
VERSITYGW := build/bin/versitygw

venv: $(STAMP)

$(STAMP): pyproject.toml $(NATIVE_SOURCES) $(JAVA_SOURCES) $(JARS_SOURCES)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/python native/jar.py
	$(BIN)/python -m runtime.jars install delta
	@touch $@

# The `delta` set again, for a build/jars removed since the venv was made: a check when it is there.
jars: $(STAMP)
	@$(BIN)/python -m runtime.jars install delta

# What the S3 tests need (tests/test_s3_server.py): the `s3` jar set and versitygw.
s3-deps: $(STAMP) s3-server
	@$(BIN)/python -m runtime.jars install s3

# Rebuilt only when build/bin/versitygw is missing or another version (`go version -m` reads it).
s3-server:
	@if go version -m $(VERSITYGW) 2>/dev/null | grep -q "^[[:space:]]*mod[[:space:]]*github.com/versity/versitygw[[:space:]]*$(VERSITYGW_VERSION)[[:space:]]"; then :; else \
	  command -v go >/dev/null 2>&1 || { echo "error: Go is required to build versitygw, the tests' S3 server" >&2; exit 1; }; \
	  echo "building versitygw $(VERSITYGW_VERSION) into $(dir $(VERSITYGW)) (about 4 min of CPU, once)"; \
	  GOBIN=$(abspath $(dir $(VERSITYGW))) go install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION); \
	fi

# Spark 4 needs Java 17 or newer; say so plainly instead of failing deep inside py4j.
java:
	@command -v java >/dev/null 2>&1 || { echo "error: Java 17+ is required for Spark, and 'java' is not on PATH" >&2; exit 1; }
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1); \
	 if [ -z "$$v" ] || [ "$$v" -lt 17 ]; then echo "error: Java 17+ is required for Spark, found: $$(java -version 2>&1 | head -n1)" >&2; exit 1; fi

node-clients: $(NODE_STAMP)

$(NODE_STAMP): $(wildcard $(NODE_DIR)/package.json) $(wildcard $(NODE_DIR)/package-lock.json)
	@if [ -f $(NODE_DIR)/package.json ]; then \
	  command -v npm >/dev/null 2>&1 || { echo "error: npm is required for the interop test clients" >&2; exit 1; }; \
	  cd $(NODE_DIR) && npm ci --no-audit --no-fund --loglevel=error; \
	  mkdir -p node_modules && touch node_modules/.installed; \
	fi

# The real syslog senders of tests/test_syslog_interop.py, from Debian, when missing (as root:
# CI runs `make test` as root). rsyslog and syslog-ng-core conflict (both are the system's
# log daemon), so syslog-ng-core is only unpacked into tests/syslog-ng, never installed; the
# tests run both with their own config, pid file and work dir, on loopback ports. A policy-rc.d
# (exit 101, Debian's "do not start services") keeps the install from starting the system's rsyslog.
SYSLOG_DEBS := rsyslog rsyslog-relp rsyslog-openssl libivykis0 libnet1 libpcre3 libwrap0
SYSLOG_NG_DIR := tests/syslog-ng

syslog-clients:
	@command -v apt-get >/dev/null 2>&1 || { echo "note: no apt-get; the rsyslog/syslog-ng interop tests will skip" >&2; exit 0; }; \
	 missing=""; for p in $(SYSLOG_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	 if [ -n "$$missing" ]; then \
	   [ "$$(id -u)" = 0 ] || { echo "error: installing$$missing needs root (apt-get)" >&2; exit 1; }; \
	   guard=; if [ ! -e /usr/sbin/policy-rc.d ]; then guard=/usr/sbin/policy-rc.d; printf '#!/bin/sh\nexit 101\n' > $$guard; chmod 755 $$guard; fi; \
	   apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; rc=$$?; \
	   [ -z "$$guard" ] || rm -f $$guard; [ $$rc = 0 ] || exit $$rc; \
	 fi; \
	 if [ ! -x $(SYSLOG_NG_DIR)/usr/sbin/syslog-ng ]; then \
	   tmp=$$(mktemp -d) && chmod 755 $$tmp && (cd $$tmp && apt-get download -qq syslog-ng-core) \
	   && dpkg -x $$tmp/syslog-ng-core_*.deb $(SYSLOG_NG_DIR); rc=$$?; rm -rf $$tmp; exit $$rc; \
	 fi

# pytest's exit code 5 (no tests collected) is non-zero, so make fails on it too.
# One run: where the C path or its Python twin decides a test's outcome, the test itself runs
# under LOGJAM_NATIVE=require and off (tests/conftest.py native_mode, or both paths compared in
# one test), whatever LOGJAM_NATIVE the run has (CI: require).
test: java $(STAMP) jars s3-deps node-clients syslog-clients
	$(BIN)/python -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

# Just the native-sensitive tests (marker `native`), once: each covers both paths itself.
test-native: $(STAMP) node-clients
	LOGJAM_NATIVE=require $(BIN)/python -m pytest -m native $(PYTEST_ARGS)

up: java $(STAMP) jars
	$(BIN)/python -m tools.mesh up

down:
	$(BIN)/python -m tools.mesh down

status:
	$(BIN)/python -m tools.mesh status

# Every program of supervisord.conf with --check: flags, TOML, TLS files, writable dirs.
check: $(STAMP)
	$(BIN)/python -m tools.mesh check

bench: $(STAMP)
	@for b in $(filter-out benchmarks/__init__.py benchmarks/results.py benchmarks/perf_doc.py,$(wildcard benchmarks/*.py)); do \
	  echo "== $$b"; $(BIN)/python $$b || exit 1; done

# docs/performance.md from benchmarks/targets.toml and the latest result each benchmark wrote
# into build/results/ (a benchmark without one is listed as not run). It needs only the standard
# library, so it installs nothing: the venv's python when there is one, else $(PYTHON).
.PHONY: perf-doc
perf-doc:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) benchmarks/perf_doc.py

clean:
	rm -rf $(VENV) $(NODE_DIR)/node_modules $(SYSLOG_NG_DIR) .pytest_cache .hypothesis native/generated build
	find logjam devices bridges importer -name '_native*.so' -delete
	rm -rf warehouse/jars
