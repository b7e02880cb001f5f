#!/usr/bin/env python3
"""The pmap examples of jax.lax's psum, pmean and pmax, with four independent
Python processes instead of four devices of one program.

  PYTHONPATH=build/python python3 examples/python/quickstart.py [--socket PATH] [--members 4]

The script starts the members itself (one process each) and prints what
each got: members holding 0, 1, 2, 3 all get psum 6 and pmean 1.5; members
holding 2, 5, 1, 4 all get pmax 5.
"""

import argparse
import os
import subprocess
import sys

import numpy as np

import collectived


def member(socket: str, members: int, index: int) -> None:
    with collectived.connect(name=f"quickstart-{index}", socket=socket or None) as client:
        mesh = client.join_mesh("quickstart", {"batch_axis": members}, coordinate=[index],
                                timeout=30)
        i = mesh.axis_index("batch_axis")

        # jax.lax.psum: every member gets the sum of every member's value.
        x = mesh.zeros((), np.float32)   # a 0-d array in shared memory
        x[...] = i
        total = float(mesh.psum(x, "batch_axis"))

        # jax.lax.pmean: the mean; a plain numpy array works too (staged).
        average = float(mesh.pmean(np.float32(i), "batch_axis"))

        # jax.lax.pmax and pmin over values 2, 5, 1, 4.
        value = np.array([2, 5, 1, 4][i % 4], np.int32)
        biggest = int(mesh.pmax(value, "batch_axis", inplace=False))
        smallest = int(mesh.pmin(value, "batch_axis", inplace=False))

        gathered = mesh.all_gather(np.int32(i), "batch_axis")
        # One write per line: the members share the terminal.
        os.write(1, (f"member {i}: psum({i}) = {total:g}, pmean({i}) = {average:g}, "
                     f"pmax({int(value)}) = {biggest}, pmin({int(value)}) = {smallest}, "
                     f"all_gather({i}) = {gathered.tolist()}\n").encode())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default="", help="the daemon's socket (default: the SDK's)")
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--member", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.member >= 0:
        member(args.socket, args.members, args.member)
        return
    procs = [subprocess.Popen([sys.executable, __file__, f"--socket={args.socket}",
                               f"--members={args.members}", f"--member={i}"])
             for i in range(args.members)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
