#!/usr/bin/env python3
"""PyTorch programs of the compatibility matrix (scripts/compat.py runs each
natively and under the shim and compares their RESULT lines).

    torch_rows.py train      eager training of a small transformer encoder, varying sequence lengths
    torch_rows.py generate   Hugging Face transformers GPT-2 (random weights from a config), greedy
    torch_rows.py compile    torch.compile (Inductor, Triton kernels) of a small MLP, three shapes
    torch_rows.py graphs     a CUDA graph captured with torch.cuda.graph, replayed
    torch_rows.py ipc        a CUDA tensor sent to a spawned process (torch.multiprocessing)
    torch_rows.py nccl       all-reduce through torch.distributed (NCCL), one process per GPU

The allocator is the caller's environment's (PYTORCH_NO_CUDA_MEMORY_CACHING,
PYTORCH_CUDA_ALLOC_CONF). Every program is seeded and deterministic.
"""
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

from rowlib import Steps, finish, rounded  # noqa: E402


def deterministic():
    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    # Memory-efficient attention's backward is not deterministic; the math path is.
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.use_deterministic_algorithms(True, warn_only=True)


def train():
    deterministic()
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2).cuda()
    head = torch.nn.Linear(256, 1).cuda()
    opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-3)
    gen = torch.Generator(device="cpu").manual_seed(1)
    losses, steps = [], Steps()
    for step in range(40):
        length = int(torch.randint(16, 200, (1,), generator=gen))
        x = torch.randn(16, length, 256, generator=gen).cuda()
        steps.start()
        loss = head(model(x)).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step >= 10:
            steps.done()
    finish(rounded(losses[::8] + losses[-1:], 5), steps)


def generate():
    import transformers
    deterministic()
    config = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=5000, n_positions=256)
    model = transformers.GPT2LMHeadModel(config).half().cuda().eval()
    gen = torch.Generator(device="cpu").manual_seed(2)
    tokens, steps = [], Steps()
    for batch, prompt in [(1, 8), (4, 32), (8, 64), (2, 16), (8, 8), (1, 64)]:
        ids = torch.randint(0, 5000, (batch, prompt), generator=gen).cuda()
        steps.start()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                                 pad_token_id=0)
        torch.cuda.synchronize()
        steps.done()
        steps.ms[-1] /= 24  # per generated token
        tokens.append(out[:, prompt:].flatten().tolist()[:24])
    finish(tokens, steps)


def compile_():
    deterministic()
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512)).cuda()
    compiled = torch.compile(model, dynamic=False)
    gen = torch.Generator(device="cpu").manual_seed(3)
    inputs = [torch.randn(n, 512, generator=gen).cuda() for n in (64, 128, 256)]
    with torch.no_grad():
        for x in inputs:  # compile each shape outside the timed steps
            compiled(x)
        sums, steps = [], Steps()
        for i in range(60):
            steps.start()
            y = compiled(inputs[i % 3])
            torch.cuda.synchronize()
            steps.done()
            if i < 3:
                sums.append(y.double().sum().item())
    finish(rounded(sums, 5), steps)


def graphs():
    deterministic()
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).cuda()
    static_in = torch.randn(64, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_out = model(static_in)
    gen = torch.Generator(device="cpu").manual_seed(4)
    sums, steps = [], Steps()
    for i in range(50):
        static_in.copy_(torch.randn(64, 256, generator=gen))
        steps.start()
        graph.replay()
        torch.cuda.synchronize()
        steps.done()
        sums.append(static_out.double().sum().item())
    finish(rounded(sums[::10], 5), steps)


def _ipc_child(queue, answers):
    answers.put("ready")
    tensor = queue.get()
    answers.put(float(tensor.double().sum().item()))
    del tensor


def ipc():
    """The time from sending the tensor to the child's answer; a child that
    gives no answer fails the program (a daemon child never keeps it alive)."""
    import queue as queues
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue, answers = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_ipc_child, args=(queue, answers), daemon=True)
    child.start()
    steps = Steps()
    tensor = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    try:
        answers.get(timeout=120)  # the child has started
        steps.start()
        queue.put(tensor)
        outcome = [answers.get(timeout=60)]
        steps.done()
        child.join(timeout=60)
        outcome.append(child.exitcode)
    except queues.Empty:
        child.kill()
        finish(["no answer from the child"], steps, failed=True)
    finish(outcome, steps)


def _nccl_rank(rank, world, port, answers):
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    sums = []
    for n in (1, 1000, 1 << 20):
        t = torch.full((n,), float(rank + 1), device="cuda")
        dist.all_reduce(t)
        sums.append(float(t.double().sum().item()))
    dist.destroy_process_group()
    answers.put((rank, sums))


def nccl():
    import queue as queues
    import socket
    import torch.multiprocessing as mp
    world = torch.cuda.device_count()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    answers = ctx.Queue()
    steps = Steps()
    steps.start()
    procs = [ctx.Process(target=_nccl_rank, args=(r, world, port, answers), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    try:
        results = sorted(answers.get(timeout=180) for _ in procs)
        for p in procs:
            p.join(timeout=60)
        outcome = {"world": world, "sums": [s for _, s in results], "exit": [p.exitcode for p in procs]}
    except queues.Empty:
        for p in procs:
            p.kill()
        finish({"world": world, "error": "a rank did not answer in 180 s"}, steps, failed=True)
    steps.done()
    finish(outcome, steps, failed=any(code != 0 for code in outcome["exit"]))


PROGRAMS = {"train": train, "generate": generate, "compile": compile_, "graphs": graphs, "ipc": ipc, "nccl": nccl}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PROGRAMS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(PROGRAMS)}")
    PROGRAMS[sys.argv[1]]()
