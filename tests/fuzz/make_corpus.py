#!/usr/bin/env python3
"""Writes the seed corpus of request_fuzzer: one serialized OpSpec per file.

Run by hand from the repository root (needs grpcio-tools):
    python3 tests/fuzz/make_corpus.py
"""
import importlib
import os
import sys
import tempfile

from grpc_tools import protoc

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
out = os.path.join(root, "tests", "fuzz", "corpus")
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
    os.makedirs(out, exist_ok=True)
    for name, message in seeds.items():
        data = message.SerializeToString()
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(seeds)} seeds to {out}")
