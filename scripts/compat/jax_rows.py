#!/usr/bin/env python3
"""JAX program of the compatibility matrix: a jitted training loop (MLP,
SGD) on one batch shape (each shape costs a compilation with autotuning), run with whichever allocator the caller's
environment picks (XLA_PYTHON_CLIENT_ALLOCATOR, XLA_PYTHON_CLIENT_PREALLOCATE).

    jax_rows.py train [steps]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from rowlib import Steps, finish, rounded  # noqa: E402


def init(key, sizes):
    params = []
    for n_in, n_out in zip(sizes, sizes[1:]):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (n_in, n_out)) / jnp.sqrt(n_in), jnp.zeros(n_out)))
    return params


def loss_fn(params, x, y):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return jnp.mean((x @ w + b - y) ** 2)


@jax.jit
def step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return [(w - 1e-3 * gw, b - 1e-3 * gb) for (w, b), (gw, gb) in zip(params, grads)], loss


def train(n_steps):
    with jax.default_matmul_precision("highest"):
        params = init(jax.random.PRNGKey(0), [512, 2048, 2048, 512])
        key = jax.random.PRNGKey(1)
        batches = []
        for _ in range(3):
            key, kx, ky = jax.random.split(key, 3)
            batches.append((jax.random.normal(kx, (256, 512)), jax.random.normal(ky, (256, 512))))
        jax.block_until_ready(step(params, *batches[0]))  # compile outside the timed steps
        losses, steps = [], Steps()
        for i in range(n_steps):
            x, y = batches[i % 3]
            steps.start()
            params, loss = step(params, x, y)
            loss = float(jax.block_until_ready(loss))
            steps.done()
            losses.append(loss)
    finish(rounded(losses[:: max(1, n_steps // 5)] + losses[-1:], 5), steps)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "train":
        sys.exit(f"usage: {sys.argv[0]} train [steps]")
    train(int(sys.argv[2]) if len(sys.argv) > 2 else 300)
