"""Memory by library under the shim (SOMA_STATS' table) and the out-of-memory
snapshot (SOMA_SNAPSHOT): PyTorch's caching allocator (libc10_cuda.so, with a
1 GiB tensor), NCCL's own buffers (one rank), a cuBLAS matrix product, and a
cudaMalloc of the program's own through ctypes (called from libffi); then a
tensor of 1 TiB, which no device holds: PyTorch's cudaMalloc is told it is out
of memory, and the shim writes its snapshot. Prints the bytes PyTorch
reserves after that, which the runner compares with the table's row for
libc10_cuda.so once the process has exited."""
import ctypes
import os

import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(20000 + os.getpid() % 20000))
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
x = torch.randn(2048, 2048, device="cuda")
y = x @ x
dist.all_reduce(y)
torch.cuda.synchronize()
# RTLD_DEFAULT: the cudaMalloc the program's own code would call (the shim's, preloaded).
own = ctypes.c_void_p()
cuda_malloc = ctypes.CDLL(None).cudaMalloc
cuda_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
assert cuda_malloc(ctypes.byref(own), 64 << 20) == 0
big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
try:
    torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
    print("a 1 TiB tensor was allocated")
except torch.OutOfMemoryError:
    print("a 1 TiB tensor: out of memory")
print(f"reserved {torch.cuda.memory_reserved()}")
print(f"checksum {float(y.sum()):.6g}")
dist.destroy_process_group()
