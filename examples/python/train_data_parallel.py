#!/usr/bin/env python3
"""Data-parallel training of a small MLP with JAX over N independent
processes: each holds its shard of the data, computes gradients with
jax.grad, and averages them with collectived.jax.pmean inside jax.jit, as a
pmap/shard_map program averages them with jax.lax.pmean. Every process ends
every step with the same parameters, so every process prints the same loss.

  PYTHONPATH=build/python python3 examples/python/train_data_parallel.py \\
      [--socket PATH] [--processes 4] [--steps 50] [--device cpu|gpu]

With --device gpu every process computes on the GPU (JAX's CUDA platform;
the processes share GPU 0) and collectived.jax averages on it, through the
daemon's GPU buffers; matrix products run at full float32 precision on both
devices, so the losses agree with the CPU run's.

The script starts the processes itself; each prints "step K loss L" lines
tagged with its index (the loss is the mean over every process's batch).
"""

import argparse
import os
import subprocess
import sys


def train(socket: str, processes: int, index: int, steps: int, device: str) -> None:
    if device == "gpu":
        # Processes share the GPU: none takes most of its memory up front.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    jax.config.update("jax_platforms", "cuda" if device == "gpu" else "cpu")
    jax.config.update("jax_default_matmul_precision", "highest")  # no TF32 on the GPU
    import jax.numpy as jnp
    import numpy as np

    import collectived
    import collectived.jax as cjax

    client = collectived.connect(name=f"train-{index}", socket=socket or None)
    mesh = client.join_mesh("train-data-parallel", {"data": processes}, coordinate=[index],
                            timeout=120)

    # The task: y = sin(3x) + x/2 on [-1, 1]; each process gets its own shard.
    rng = np.random.default_rng(index)
    x = rng.uniform(-1, 1, (256, 1)).astype(np.float32)
    y = np.sin(3 * x) + x / 2

    # Identical initial parameters everywhere (the same seed).
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = {"w1": jax.random.normal(k1, (1, 32)) * 0.5, "b1": jnp.zeros(32),
              "w2": jax.random.normal(k2, (32, 1)) * 0.5, "b2": jnp.zeros(1)}

    def loss_fn(p, xb, yb):
        h = jnp.tanh(xb @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - yb) ** 2)

    @jax.jit
    def step(p, xb, yb):
        loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb)
        # The data-parallel step: average gradients and loss over processes.
        grads = jax.tree_util.tree_map(lambda g: cjax.pmean(g, "data", mesh=mesh), grads)
        loss = cjax.pmean(loss, "data", mesh=mesh)
        return jax.tree_util.tree_map(lambda w, g: w - 0.2 * g, p, grads), loss

    for k in range(steps):
        params, loss = step(params, x, y)
        if k % 10 == 0 or k == steps - 1:
            # One write per line: the processes share the terminal.
            os.write(1, f"[process {index}] step {k:3d} loss {float(loss):.6f}\n".encode())
    mesh.leave()
    client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default="", help="the daemon's socket (default: the SDK's)")
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                    help="where JAX computes and the gradients are averaged (default: cpu)")
    ap.add_argument("--process", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.process >= 0:
        train(args.socket, args.processes, args.process, args.steps, args.device)
        return
    procs = [subprocess.Popen([sys.executable, __file__, f"--socket={args.socket}",
                               f"--processes={args.processes}", f"--steps={args.steps}",
                               f"--device={args.device}", f"--process={i}"])
             for i in range(args.processes)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
