#!/usr/bin/env python3
"""Static checks of the deployment files (called by check_deploy.sh).

  check_deploy.py compose  <file produced by `docker-compose config`>
  check_deploy.py k8s      <dir>          every *.yaml / *.yml under it
  check_deploy.py docker   <Dockerfile>   against the CMake install rules
  check_deploy.py runtime-libs <Dockerfile> <binary>...   the runtime stage
        installs the Debian package of every shared library the binaries need

Prints one line per problem and exits 1 if there was any.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SOCKET_DIR = "/run/collectived"
SOCKET = SOCKET_DIR + "/collectived.sock"
PROBE = "collectived_health_probe"

problems = []


def problem(where, msg):
    problems.append(f"{where}: {msg}")


# ---------------------------------------------------------------------------
# docker-compose (the output of `docker-compose config`, all profiles merged)
# ---------------------------------------------------------------------------


def check_compose(path):
    doc = yaml.safe_load(Path(path).read_text())
    services = doc.get("services") or {}
    where = "docker-compose.yml"
    if "collectived" not in services:
        problem(where, "no service 'collectived'")
        return
    daemon = services["collectived"]
    build = daemon.get("build") or {}
    if not str(build.get("dockerfile", "")).endswith("deploy/Dockerfile"):
        problem(where, "service collectived is not built from deploy/Dockerfile")
    volumes = doc.get("volumes") or {}

    def argv_of(svc):
        return [str(a) for a in (svc.get("entrypoint") or []) + (svc.get("command") or [])]

    # etcd services: built from deploy/Dockerfile's etcd stage, health-
    # checked with etcdctl. They are neither daemons nor clients.
    etcds = {n: svc for n, svc in services.items()
             if ((svc.get("build") or {}).get("target") == "etcd")}
    for name, svc in etcds.items():
        if not str((svc.get("build") or {}).get("dockerfile", "")).endswith("deploy/Dockerfile"):
            problem(where, f"etcd service {name} is not built from deploy/Dockerfile")
        if "etcdctl" not in " ".join(map(str, (svc.get("healthcheck") or {}).get("test") or [])):
            problem(where, f"etcd service {name} has no etcdctl healthcheck")
        if not any(str(a).startswith("--advertise-client-urls=") for a in svc.get("command") or []):
            problem(where, f"etcd service {name} does not say where clients reach it")
    # Daemons: the services whose healthcheck runs the probe (clients
    # disable the image's healthcheck). The others are clients.
    daemons = {n: svc for n, svc in services.items()
               if PROBE in " ".join(map(str, (svc.get("healthcheck") or {}).get("test") or []))}
    if "collectived" not in daemons:
        problem(where, f"service collectived has no healthcheck running {PROBE}")
        daemons["collectived"] = daemon

    def socket_volume(name, svc):
        for v in svc.get("volumes") or []:
            spec = v if isinstance(v, str) else f"{v.get('source')}:{v.get('target')}"
            parts = spec.split(":")
            if len(parts) >= 2 and parts[1] == SOCKET_DIR:
                if parts[0] not in volumes:
                    problem(where, f"service {name}: {SOCKET_DIR} is not a named volume ({parts[0]})")
                return parts[0]
        problem(where, f"service {name} does not mount the socket directory at {SOCKET_DIR}")
        return None

    # Each daemon has a socket volume of its own (one per "host").
    daemon_of_volume = {}
    for name, svc in daemons.items():
        vol = socket_volume(name, svc)
        if vol in daemon_of_volume:
            problem(where, f"daemons {daemon_of_volume[vol]} and {name} share the socket volume {vol}")
        daemon_of_volume[vol] = name
        if name != "collectived" and svc.get("image") != daemon.get("image"):
            problem(where, f"daemon {name} does not run the image service collectived builds")
    # A cluster (daemons with --coordinator / --cluster): one coordinator per
    # profile, or an etcd service, every member daemon points at it (and
    # waits for it to be healthy), and all have a host id and the token.
    coordinators = {}
    etcd_profiles = set()
    for name, svc in daemons.items():
        for a in argv_of(svc):
            if a.startswith("--cluster=etcd://") or a.startswith("--cluster=etcds://"):
                etcd_profiles.add(tuple(svc.get("profiles") or []))
                coordinators.setdefault(tuple(svc.get("profiles") or []), [])
    for name, svc in daemons.items():
        argv = argv_of(svc)
        if "--coordinator" in argv:
            coordinators.setdefault(tuple(svc.get("profiles") or []), []).append(name)
    for profile, names in coordinators.items():
        if profile in etcd_profiles and names:
            problem(where, f"profile {list(profile)}: kept in etcd and served by {names} too")
        elif profile not in etcd_profiles and len(names) != 1:
            problem(where, f"profile {list(profile)}: {len(names)} coordinators ({names})")
    for name, svc in daemons.items():
        argv = argv_of(svc)
        clustered = "--coordinator" in argv or any(a.startswith("--cluster=") for a in argv)
        if not clustered:
            continue
        for flag in ("--tcp=", "--host-id=", "--cluster-token-file="):
            if not any(a.startswith(flag) for a in argv):
                problem(where, f"cluster daemon {name} has no {flag}...")
        for a in argv:
            if not a.startswith("--cluster="):
                continue
            value = a.split("=", 1)[1]
            scheme = value.split("://", 1)[0] if "://" in value else ""
            for target in value.split("://", 1)[-1].split(","):
                host = target.rsplit(":", 1)[0]
                if scheme in ("etcd", "etcds"):
                    if host not in etcds:
                        problem(where, f"cluster daemon {name} points at {target}, not at an "
                                       "etcd service")
                elif host not in coordinators.get(tuple(svc.get("profiles") or []), []):
                    problem(where, f"cluster daemon {name} points at {target}, not at its "
                                   "profile's coordinator service")
                dep = (svc.get("depends_on") or {}).get(host)
                if not isinstance(dep, dict) or dep.get("condition") != "service_healthy":
                    problem(where, f"cluster daemon {name}: depends_on {host} without "
                                   "condition: service_healthy")

    clients = [n for n in services if n not in daemons and n not in etcds]
    if not clients:
        problem(where, "no client (demo) services")
    # Members by mesh: the clients of one profile set run one demo mesh.
    members = {}
    for name in clients:
        svc = services[name]
        vol = socket_volume(name, svc)
        host = daemon_of_volume.get(vol)
        if host is None:
            problem(where, f"service {name} does not share a daemon's socket volume ({vol})")
            continue
        dep = (svc.get("depends_on") or {}).get(host)
        if not isinstance(dep, dict) or dep.get("condition") != "service_healthy":
            problem(where, f"service {name}: depends_on {host} without condition: service_healthy")
        for key in ("ipc", "pid"):
            if svc.get(key) == "host" or daemons[host].get(key) == "host":
                problem(where, f"service {name}: {key}: host is not needed")
        argv = argv_of(svc)
        if not argv or os.path.basename(argv[0]) != "collectived_demo":
            problem(where, f"service {name} does not run collectived_demo")
            continue
        if f"--socket={SOCKET}" not in argv:
            problem(where, f"service {name} does not pass --socket={SOCKET}")
        m = [a for a in argv if a.startswith("--member=")]
        if m:
            members.setdefault(tuple(svc.get("profiles") or []), []).append(
                (name, int(m[0].split("=", 1)[1]),
                 next((a for a in argv if a.startswith("--members=")), None), host))
    # The per-member form: indices 0..n-1 exactly once, all agreeing on n;
    # members spread over several daemons only when those form a cluster.
    for profile, group in members.items():
        sizes = {m[2] for m in group}
        if len(sizes) != 1 or None in sizes:
            problem(where, f"member services {[m[0] for m in group]} disagree on --members: "
                           f"{sorted(map(str, sizes))}")
        else:
            n = int(next(iter(sizes)).split("=", 1)[1])
            if sorted(i for _, i, _, _ in group) != list(range(n)):
                problem(where, f"member services cover indices {sorted(i for _, i, _, _ in group)}, "
                               f"not 0..{n - 1}")
        hosts = {m[3] for m in group}
        if len(hosts) > 1 and profile not in coordinators:
            problem(where, f"members of {list(profile)} use daemons {sorted(hosts)} that form no cluster")
    per_member = {m[0] for group in members.values() for m in group}
    for name in clients:
        if name in per_member:
            continue
        if not services[name].get("profiles"):
            problem(where, f"service {name} (all members in one container) runs by default next to "
                           "the per-member services: both would join mesh 'demo'")


# ---------------------------------------------------------------------------
# Kubernetes
# ---------------------------------------------------------------------------


def pod_spec(doc):
    kind = doc.get("kind")
    spec = doc.get("spec") or {}
    if kind == "Pod":
        return spec
    if kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
        return (spec.get("template") or {}).get("spec")
    if kind == "CronJob":
        return (((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}).get("spec")
    return None


def check_probe(where, probe):
    if probe is None:
        return
    handlers = [k for k in ("exec", "grpc", "httpGet", "tcpSocket") if k in probe]
    if len(handlers) != 1:
        problem(where, f"probe needs exactly one handler, has {handlers}")
        return
    if "exec" in probe:
        cmd = probe["exec"].get("command") or []
        if not cmd or cmd[0] != PROBE:
            problem(where, f"exec probe does not run {PROBE}: {cmd}")
        elif f"--socket={SOCKET}" not in cmd:
            problem(where, f"exec probe does not name --socket={SOCKET}")
    if "grpc" in probe and "port" not in probe["grpc"]:
        problem(where, "grpc probe without port")


def check_k8s(directory):
    files = sorted(p for p in Path(directory).rglob("*") if p.suffix in (".yaml", ".yml"))
    if not files:
        problem(directory, "no YAML files")
        return
    kinds = set()
    native_sidecar = False
    for f in files:
        rel = f.relative_to(REPO) if f.is_absolute() and REPO in f.parents else f
        try:
            docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
        except yaml.YAMLError as e:
            problem(rel, f"YAML error: {e}")
            continue
        if not docs:
            problem(rel, "no documents")
        for i, doc in enumerate(docs):
            where = f"{rel}[{i}]"
            if not isinstance(doc, dict):
                problem(where, "document is not a mapping")
                continue
            for key in ("apiVersion", "kind"):
                if not doc.get(key):
                    problem(where, f"missing {key}")
            name = (doc.get("metadata") or {}).get("name")
            if not name:
                problem(where, "missing metadata.name")
            kind = doc.get("kind")
            kinds.add(kind)
            where = f"{rel}: {kind}/{name}"
            spec = doc.get("spec") or {}
            if kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet"):
                sel = (spec.get("selector") or {}).get("matchLabels") or {}
                labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
                if not sel or any(labels.get(k) != v for k, v in sel.items()):
                    problem(where, "selector.matchLabels do not match the pod template labels")
            ps = pod_spec(doc)
            if ps is None:
                continue
            if kind == "Job" and ps.get("restartPolicy") not in ("Never", "OnFailure"):
                problem(where, "a Job's pods need restartPolicy Never or OnFailure")
            volumes = {v.get("name"): v for v in ps.get("volumes") or []}
            # A StatefulSet's claims are volumes of its pods too.
            for claim in spec.get("volumeClaimTemplates") or []:
                volumes[(claim.get("metadata") or {}).get("name")] = {"claim": True}
            containers = ps.get("containers") or []
            inits = ps.get("initContainers") or []
            if not containers:
                problem(where, "no containers")
            names = [c.get("name") for c in containers + inits]
            if len(names) != len(set(names)):
                problem(where, f"duplicate container names {names}")
            for c in containers + inits:
                cw = f"{where} container {c.get('name')}"
                if not c.get("name") or not c.get("image"):
                    problem(cw, "needs name and image")
                for vm in c.get("volumeMounts") or []:
                    if vm.get("name") not in volumes:
                        problem(cw, f"mounts undeclared volume {vm.get('name')}")
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    check_probe(f"{cw} {probe}", c.get(probe))
                if c in inits and c.get("restartPolicy") not in (None, "Always"):
                    problem(cw, "an init container's restartPolicy can only be Always (native sidecar)")
                if c in containers and "restartPolicy" in c:
                    problem(cw, "restartPolicy is only allowed on init containers")
                if c in inits and c.get("restartPolicy") == "Always":
                    native_sidecar = True
                    if c.get("readinessProbe") is None and c.get("startupProbe") is None:
                        problem(cw, "a sidecar daemon should have a startupProbe or readinessProbe")
                argv = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
                runs_daemon = (not c.get("command") and any(a.startswith("--socket=") for a in argv)) or (
                    argv and os.path.basename(argv[0]) == "collectived")
                if runs_daemon:
                    if f"--socket={SOCKET}" not in argv:
                        problem(cw, f"daemon not started with --socket={SOCKET}")
                    if c.get("livenessProbe") is None:
                        problem(cw, "daemon container without livenessProbe")
                    if any(a.startswith("--tcp=0.0.0.0") for a in argv):
                        problem(cw, "--tcp=0.0.0.0 exposes the plaintext control API")
                mounts = {vm.get("mountPath"): vm.get("name") for vm in c.get("volumeMounts") or []}
                uses_socket = runs_daemon or any("collectived_demo" in a for a in argv)
                if uses_socket and SOCKET_DIR not in mounts:
                    problem(cw, f"talks to the daemon but does not mount {SOCKET_DIR}")
            for flag in ("hostIPC", "hostPID"):
                if ps.get(flag):
                    problem(where, f"{flag} is not needed (buffers travel over the side socket)")
            if kind == "DaemonSet":
                hp = [v for v in volumes.values() if "hostPath" in v]
                if not any(v["hostPath"].get("path") == SOCKET_DIR for v in hp):
                    problem(where, f"DaemonSet without a hostPath volume at {SOCKET_DIR}")
    for needed in ("DaemonSet",):
        if needed not in kinds:
            problem(directory, f"no {needed} manifest")
    if not kinds & {"Deployment", "Pod", "Job"}:
        problem(directory, "no Pod/Deployment/Job (sidecar) manifest")
    if not native_sidecar:
        problem(directory, "no native sidecar (initContainer with restartPolicy: Always)")


# ---------------------------------------------------------------------------
# Dockerfile vs. CMake install rules
# ---------------------------------------------------------------------------


def installed_runtime_targets():
    """{target: CMakeLists path} for every install(TARGETS ... RUNTIME ...)."""
    found = {}
    for cm in REPO.rglob("CMakeLists.txt"):
        rel = cm.relative_to(REPO)
        if rel.parts[0].startswith("build") or rel.parts[0] in (".git", "out"):
            continue
        text = re.sub(r"#[^\n]*", "", cm.read_text())
        for m in re.finditer(r"install\s*\(\s*TARGETS\s+([^)]*)\)", text, re.S):
            words = m.group(1).split()
            targets = []
            for w in words:
                if w.isupper():
                    break
                targets.append(w)
            if "RUNTIME" in words or len(words) > len(targets):
                for t in targets:
                    found[t] = str(rel)
    return found


def dockerfile_instructions(text):
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def check_docker(dockerfile):
    where = str(Path(dockerfile).relative_to(REPO)) if Path(dockerfile).is_absolute() else dockerfile
    text = Path(dockerfile).read_text()
    ins = dockerfile_instructions(text)
    froms = [rest for w, rest in ins if w == "FROM"]
    if len(froms) < 2:
        problem(where, "not a multi-stage build")
    args = dict(
        (rest.split("=", 1) + [""])[:2] for w, rest in ins if w == "ARG"
    )
    def expand(s):
        return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), s)
    for f in froms:
        image = expand(f.split()[0])
        if not image.startswith("debian:bookworm"):
            problem(where, f"stage not based on debian:bookworm: FROM {f} ({image})")
    runs = " ".join(rest for w, rest in ins if w == "RUN")
    for needle in ("-DCOLLECTIVED_BUILD_TESTS=OFF", "CMAKE_INSTALL_PREFIX=/usr/local", "cmake --install"):
        if needle not in runs:
            problem(where, f"build stage does not use {needle}")
    for pkg in ("cmake", "g++", "libgrpc++-dev", "protobuf-compiler-grpc", "libprotobuf-dev",
                "protobuf-compiler", "libabsl-dev", "libgtest-dev", "libgmock-dev"):
        if not re.search(rf"(^|\s){re.escape(pkg)}(\s|$)", runs):
            problem(where, f"build dependency {pkg} not installed")

    installed = installed_runtime_targets()
    for target, cmake in (("collectived", "daemon/CMakeLists.txt"),
                          ("collectived_demo", "examples/CMakeLists.txt"),
                          (PROBE, "deploy/healthcheck/CMakeLists.txt")):
        if installed.get(target) != cmake:
            problem(where, f"{target} is not install()ed by {cmake} (install rules: {installed})")

    copies = [rest for w, rest in ins if w == "COPY" and "--from=" in rest]
    copied = set()
    for c in copies:
        parts = [p for p in c.split() if not p.startswith("--")]
        for src in parts[:-1]:
            if not src.startswith("/usr/local/bin/"):
                problem(where, f"COPY --from of {src}: not an installed binary path")
                continue
            name = os.path.basename(src)
            copied.add(name)
            if name not in installed:
                problem(where, f"COPY --from=build {src}: no install(TARGETS {name} RUNTIME ...) in the tree")
    for name in ("collectived", "collectived_demo", PROBE):
        if name not in copied:
            problem(where, f"runtime stage does not copy /usr/local/bin/{name}")

    users = [rest for w, rest in ins if w == "USER"]
    if not users or expand(users[-1]).split(":")[0] in ("0", "root"):
        problem(where, "the runtime stage does not switch to a non-root USER")
    entry = [rest for w, rest in ins if w == "ENTRYPOINT"]
    if not entry or yaml.safe_load(entry[-1]) != ["collectived"]:
        problem(where, f'ENTRYPOINT is not ["collectived"]: {entry}')
    health = [rest for w, rest in ins if w == "HEALTHCHECK"]
    if not health or PROBE not in health[-1]:
        problem(where, f"no HEALTHCHECK running {PROBE}")
    if "grpcurl" in " ".join(health):
        problem(where, "HEALTHCHECK needs grpcurl")
    if SOCKET not in text:
        problem(where, f"socket path {SOCKET} not used")
    if not (REPO / "deploy/healthcheck/collectived_health_probe.cc").is_file():
        problem(where, "deploy/healthcheck/collectived_health_probe.cc is missing")

    ignore = Path(str(dockerfile) + ".dockerignore")
    if ignore.is_file():
        needed = ["CMakeLists.txt", "cmake", "proto", "common", "plan", "exec", "daemon", "client",
                  "examples", "deploy/healthcheck"]
        for line in ignore.read_text().splitlines():
            pat = line.strip()
            if not pat or pat.startswith("#") or pat.startswith("!"):
                continue
            for n in needed:
                if pat.rstrip("/") == n or n.startswith(pat.rstrip("/") + "/") or pat in ("*", "**"):
                    problem(str(ignore.relative_to(REPO)), f"pattern '{pat}' excludes {n}, needed by the build")


# ---------------------------------------------------------------------------
# Runtime libraries
# ---------------------------------------------------------------------------

BASE_PACKAGES = {"libc6", "libc6-i386", "libgcc-s1", "libstdc++6"}


def check_runtime_libs(dockerfile, binaries):
    ins = dockerfile_instructions(Path(dockerfile).read_text())
    # Packages installed after the last FROM (the runtime stage).
    last_from = max(i for i, (w, _) in enumerate(ins) if w == "FROM")
    runs = " ".join(rest for w, rest in ins[last_from:] if w == "RUN")
    runtime_pkgs = set(re.findall(r"[a-z0-9][a-z0-9+.-]+", runs))
    needed = {}  # library file name -> binaries needing it
    for b in binaries:
        out = subprocess.run(["ldd", b], capture_output=True, text=True)
        if out.returncode != 0:
            problem(b, f"ldd failed: {out.stderr.strip()}")
            continue
        if "not found" in out.stdout:
            problem(b, f"unresolved libraries:\n{out.stdout}")
        for lib in re.findall(r"=>\s+(/\S+)", out.stdout):
            # The CUDA variant's libraries from the CUDA toolkit (libnccl):
            # the image builds the non-CUDA variant (its build stage has no
            # toolkit), so they are not the runtime stage's to install.
            if os.path.realpath(lib).startswith("/usr/local/cuda"):
                print(f"note {b}: {os.path.basename(lib)} comes from the CUDA toolkit "
                      "(CUDA variant; the image builds the non-CUDA variant)")
                continue
            needed.setdefault(os.path.basename(lib), []).append(b)
    if not needed:
        return
    # One dpkg -S for all of them (it scans every file list per call).
    q = subprocess.run(["dpkg", "-S", *[f"*/{n}" for n in sorted(needed)]],
                       capture_output=True, text=True)
    owners = {}
    for line in q.stdout.splitlines():
        pkgs, _, path = line.partition(": ")
        for pkg in pkgs.split(", "):
            owners.setdefault(os.path.basename(path.strip()), set()).add(pkg.split(":")[0])
    for name, users in sorted(needed.items()):
        pkgs = owners.get(name, set()) - {"libc6-i386"}
        if not pkgs:
            problem(", ".join(users), f"{name}: no Debian package owns it")
        elif not pkgs & (runtime_pkgs | BASE_PACKAGES):
            problem(", ".join(users), f"{name} (package {', '.join(sorted(pkgs))}) is not installed "
                                      "by the runtime stage of the Dockerfile")


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    what = argv[1]
    if what == "compose":
        check_compose(argv[2])
    elif what == "k8s":
        check_k8s(argv[2])
    elif what == "docker":
        check_docker(argv[2])
    elif what == "runtime-libs":
        check_runtime_libs(argv[2], argv[3:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for p in problems:
        print(f"FAIL {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
