#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/):
request (one serialized OpSpec per file), side_socket (packet scripts, see
side_socket_fuzzer.cc), fast_queue (queue contents, see fast_queue_fuzzer.cc)
and host_handshake (handshake bytes and frames, see host_handshake_fuzzer.cc).

Run by hand from the repository root (needs grpcio-tools):
    python3 tests/fuzz/make_corpus.py
"""
import importlib
import os
import sys
import tempfile

from grpc_tools import protoc

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
corpus = os.path.join(root, "tests", "fuzz", "corpus")


def write(target, seeds):
    out = os.path.join(corpus, target)
    os.makedirs(out, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(seeds)} seeds to {out}")


def packet(text, fds=0, substitute=False, reconnect=False, no_reply=False):
    flags = {0: 0, 1: 1, 2: 2, 40: 3}[fds] | (4 if substitute else 0) | (8 if reconnect else 0)
    flags |= 16 if no_reply else 0
    data = text.encode() if isinstance(text, str) else text
    return bytes([flags, len(data) & 0xFF, len(data) >> 8]) + data


def entry(data, claim=None, opspec=True):
    claim = len(data) if claim is None else claim
    return bytes([1 if opspec else 0, claim & 0xFF, (claim >> 8) & 0xFF,
                  len(data) & 0xFF, len(data) >> 8]) + data


def queue(*entries, overwrite=None):
    data = bytes([len(entries)]) + b"".join(entries)
    if overwrite is not None:
        which, value = overwrite
        data += bytes([which]) + value.to_bytes(4, "little")
    return data



def host_handshake_seeds():
    """Seeds of host_handshake_fuzzer.cc: its first byte picks the case."""
    import hashlib
    import struct

    def field(b):
        return struct.pack("<Q", len(b)) + b

    def tag(mesh, generation):
        return hashlib.sha256(field(b"collectived mesh tag v1") + field(mesh)
                              + struct.pack("<Q", generation)).digest()

    def hello(lane, frm, to, t, nonce=b"n" * 32):
        return b"CDLINK01" + struct.pack("<IIII", lane, frm, to, 0) + t + nonce

    def frame(kind, length, slot, total, offset, payload=b""):
        return struct.pack("<IIQQQ", kind, length, slot, total, offset) + payload

    good = tag(b"fuzz/mesh", 1)
    return {
        "server_hello_bad_proof": b"\x00\x00" + hello(0, 1, 0, good) + b"p" * 32,
        "server_hello_in_pieces": b"\x00\x03\x01\x07\x10" + hello(1, 3, 0, good) + b"q" * 32,
        "server_other_mesh": b"\x00\x00" + hello(0, 1, 0, tag(b"fuzz/mesh", 2)),
        "server_http": b"\x00\x00GET / HTTP/1.1\r\n\r\n",
        "client_challenge": b"\x01CDLINK01" + b"c" * 64 + b"A",
        "frames_data": b"\x02" + frame(2, 4, 0, 4, 0, b"abcd"),
        "frames_ready_break": b"\x02" + frame(1, 0, 5, 16, 0) + frame(3, 6, 10, 0, 0, b"reason"),
        "frames_query_answer": b"\x02" + frame(4, 0, 7, 0, 0) + frame(5, 3, 7, 0, 0, b"ans"),
        "frames_too_long": b"\x02" + frame(2, 128, 1, 128, 0, b"x" * 128),
        "frames_split": b"\x02" + frame(2, 2, 2, 4, 0, b"ab") + frame(2, 2, 2, 4, 2, b"cd"),
        "frames_unknown": b"\x02" + frame(99, 0, 0, 0, 0),
        "frames_partial_header": b"\x02" + frame(2, 4, 0, 4, 0)[:17],
    }



with tempfile.TemporaryDirectory() as gen:
    if protoc.main(["protoc", f"-I{root}/proto", f"--python_out={gen}",
                    f"{root}/proto/collectived/v1/collective.proto"]) != 0:
        sys.exit("protoc failed")
    sys.path.insert(0, gen)
    pb = importlib.import_module("collectived.v1.collective_pb2")

    def op(kind, shape, dtype=pb.FLOAT32, axes=("i",), **params):
        o = pb.OpSpec(mesh_id="m-0", kind=kind, dtype=dtype, shape=shape, axes=list(axes))
        o.input.buffer_id = "b-0"
        for name, value in params.items():
            getattr(o, name).CopyFrom(value)
        return o

    seeds = {
        "psum": op(pb.PSUM, [4, 3]),
        "pmean_int8": op(pb.PMEAN, [7], pb.INT8),
        "pmax_bf16": op(pb.PMAX, [1031], pb.BFLOAT16),
        "pmean_f8e4m3fn": op(pb.PMEAN, [33], pb.FLOAT8_E4M3FN),
        "psum_f8e5m2": op(pb.PSUM, [2, 5], pb.FLOAT8_E5M2),
        "pmin_bool": op(pb.PMIN, [], pb.BOOL),
        "all_gather": op(pb.ALL_GATHER, [2, 3], all_gather=pb.AllGatherParams(axis=1, tiled=True)),
        "ppermute": op(pb.PPERMUTE, [5], ppermute=pb.PpermuteParams(
            perm=[pb.PermutePair(source=0, dest=0)])),
        "psum_scatter": op(pb.PSUM_SCATTER, [8, 3], psum_scatter=pb.PsumScatterParams(tiled=True)),
        "all_to_all": op(pb.ALL_TO_ALL, [1, 2, 3], all_to_all=pb.AllToAllParams(
            split_axis=0, concat_axis=2)),
        "broadcast": op(pb.BROADCAST, [16], broadcast=pb.BroadcastParams(root=0)),
        "barrier": pb.OpSpec(mesh_id="m-0", kind=pb.BARRIER),
        "two_axes": op(pb.PSUM, [2], axes=("y", "x")),
        "huge_shape": op(pb.PSUM, [1 << 30, 1 << 30, 1 << 30]),
        "negative_offset": op(pb.PSUM, [4]),
    }
    seeds["negative_offset"].input.offset = -8
    seeds["out_of_place"] = op(pb.PSUM, [4])
    seeds["out_of_place"].output.buffer_id = "b-0"
    seeds["out_of_place"].output.offset = 4096
    ops = {name: message.SerializeToString() for name, message in seeds.items()}
    write("request", ops)

    write("side_socket", {
        "attach_fd_queue": packet("ATTACH $S $T", substitute=True) + packet("FD $B", substitute=True)
        + packet("QUEUE") + packet("QUEUE"),
        "attach_twice": packet("ATTACH $S $T", substitute=True) + packet("ATTACH $S $T", substitute=True),
        "wrong_token": packet("ATTACH $S nope", substitute=True),
        "fd_before_attach": packet("FD $B", substitute=True),
        "two_descriptors": packet("FD b-x", fds=2) + packet("QUEUE", reconnect=True),
        "many_descriptors": packet("ATTACH $S $T", fds=40, substitute=True),
        "one_descriptor": packet("QUEUE", fds=1),
        "empty_and_garbage": packet("") + packet(b"\x00\xff ATTACH", reconnect=True) + packet("X" * 5000),
        "no_reply_flood": b"".join(packet("FD b-unknown", no_reply=True) for _ in range(32)),
        "reconnects": packet("ATTACH $S $T", substitute=True) + packet("FD $B", substitute=True, reconnect=True),
    })

    psum = ops["psum"]
    write("fast_queue", {
        "one_valid": queue(entry(psum)),
        "mixed": queue(entry(ops["all_gather"]), entry(b"garbage", opspec=False), entry(ops["barrier"]),
                       entry(ops["out_of_place"]), entry(ops["huge_shape"])),
        "len_too_big": queue(entry(psum, claim=0xFFFF)),
        "len_zero": queue(entry(psum, claim=0)),
        "len_short": queue(entry(psum, claim=3)),
        "tail_far_ahead": queue(entry(psum), overwrite=(0, 0x7FFFFFFF)),
        "head_rewritten": queue(entry(psum), entry(psum), overwrite=(1, 5)),
        "cq_head_ahead": queue(entry(psum), overwrite=(3, 1000)),
        "closed_by_client": queue(entry(psum), overwrite=(4, 1)),
        "eight": queue(*[entry(ops[k]) for k in ("psum", "pmean_int8", "pmax_bf16", "pmin_bool",
                                                 "ppermute", "psum_scatter", "all_to_all", "broadcast")]),
    })

    write("host_handshake", host_handshake_seeds())

