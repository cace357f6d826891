#!/usr/bin/env python3
"""CuPy programs of the compatibility matrix, each with CuPy's memory pool on
(its default), off (every array a cudaMalloc/cudaFree), or its
stream-ordered MemoryAsyncPool:

    cupy_rows.py chain on|off|async    element-wise chains that allocate temporaries
    cupy_rows.py libs on|off|async     cuBLAS, cuFFT, cuSOLVER, cuRAND and cuSPARSE through CuPy
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cupy as cp  # noqa: E402

from rowlib import Steps, finish, rounded  # noqa: E402


def use_pool(mode):
    if mode == "off":
        cp.cuda.set_allocator(None)
    elif mode == "async":
        cp.cuda.set_allocator(cp.cuda.MemoryAsyncPool().malloc)
    elif mode != "on":
        sys.exit(f"pool mode {mode!r}: on, off or async")


def chain():
    rng = cp.random.RandomState(5)
    sums, steps = [], Steps()
    for i in range(400):
        n = (1 << 16) * (1 + i % 7)
        steps.start()
        a = rng.standard_normal(n, dtype=cp.float32)
        b = cp.sin(a) * 2 + cp.cos(a) ** 2
        c = cp.sqrt(cp.abs(b)) - a / 3
        s = float(c.sum())
        steps.done()
        if i % 80 == 0:
            sums.append(s)
    finish(rounded(sums, 4), steps)


def libs():
    import cupyx.scipy.sparse as sparse
    rng = cp.random.RandomState(6)
    results, steps = [], Steps()
    for i in range(20):
        steps.start()
        a = rng.standard_normal((256, 256), dtype=cp.float64) + 256 * cp.eye(256)
        b = rng.standard_normal((256, 8), dtype=cp.float64)
        gemm = float((a @ b).sum())                                       # cuBLAS
        spectrum = float(cp.abs(cp.fft.fft(b[:, 0])).sum())               # cuFFT
        solved = float(cp.linalg.solve(a, b).sum())                       # cuSOLVER
        drawn = float(rng.uniform(size=1000).sum())                       # cuRAND
        csr = sparse.csr_matrix(cp.where(cp.abs(a) > 1.5, a, 0))
        spmv = float((csr @ b[:, 0]).sum())                               # cuSPARSE
        cp.cuda.Device().synchronize()
        steps.done()
        if i % 5 == 0:
            results.append(rounded([gemm, spectrum, solved, drawn, spmv], 6))
    finish(results, steps)


if __name__ == "__main__":
    programs = {"chain": chain, "libs": libs}
    if len(sys.argv) != 3 or sys.argv[1] not in programs:
        sys.exit(f"usage: {sys.argv[0]} chain|libs on|off|async")
    use_pool(sys.argv[2])
    programs[sys.argv[1]]()
