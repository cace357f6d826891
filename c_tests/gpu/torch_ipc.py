"""CUDA tensors shared with a spawned process through torch.multiprocessing.

The parent sends a tensor and a view at an offset into a bigger tensor to a
child (spawn start method); the child doubles both in place and reports; the
parent checks that it sees the child's writes. Prints one line per outcome
(the runner compares the native and the shim run) and exits non-zero on a
failure. With PYTORCH_NO_CUDA_MEMORY_CACHING=1 PyTorch refuses to share (the
child's error is printed as its first line); the parent never waits more than
a timeout, so a hang is a failure, not a stuck suite.
"""
import queue
import sys
import time

import torch
import torch.multiprocessing as mp

TIMEOUT_S = 60


def child(tensors, results):
    try:
        whole, view = tensors
        whole.mul_(2)
        view.mul_(2)
        torch.cuda.synchronize()
        results.put("ok")
    except Exception as e:  # reported to the parent, which prints it
        results.put(f"error: {str(e).splitlines()[0]}")


def wait_for_answer(proc, results):
    """The child's answer; a child that died first (say, in unpickling the
    tensors) is reported at once, one that answers nothing after the timeout."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            return results.get(timeout=1)
        except queue.Empty:
            pass
        if not proc.is_alive():
            try:
                return results.get(timeout=2)  # put just before it exited
            except queue.Empty:
                return f"no answer: the child exited with status {proc.exitcode}"
        if time.monotonic() > deadline:
            return "timeout: no answer from the child"


def main():
    ctx = mp.get_context("spawn")
    whole = torch.arange(1024, dtype=torch.float32, device="cuda")
    bigger = torch.ones(1 << 20, dtype=torch.float32, device="cuda")
    view = bigger[4096:8192]
    results = ctx.Queue()
    try:
        proc = ctx.Process(target=child, args=((whole, view), results))
        proc.start()
    except Exception as e:
        print(f"sharing failed in the parent: {str(e).splitlines()[0]}")
        return 1
    outcome = wait_for_answer(proc, results)
    proc.join(TIMEOUT_S)
    if proc.is_alive():
        proc.kill()
        outcome += "; child killed after the timeout"
    print(f"child: {outcome}")
    if outcome != "ok":
        return 1
    torch.cuda.synchronize()
    whole_ok = torch.equal(whole.cpu(), torch.arange(1024, dtype=torch.float32) * 2)
    expected = torch.ones(1 << 20)
    expected[4096:8192] = 2
    view_ok = torch.equal(bigger.cpu(), expected)
    print(f"tensor doubled by the child: {whole_ok}")
    print(f"view at an offset doubled by the child, the rest untouched: {view_ok}")
    return 0 if whole_ok and view_ok else 1


if __name__ == "__main__":
    sys.exit(main())
