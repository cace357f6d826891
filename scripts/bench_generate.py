#!/usr/bin/env python3
"""LLM generation benchmark: a decoder-only model with a KV cache that grows token
by token, greedy, for varied batch sizes and prompt lengths, under whatever
allocator the environment picks (scripts/bench_torch.py's names).

    python3 scripts/bench_generate.py --requests 12 --new-tokens 48 --warmup 2

The model: Hugging Face transformers' GPT-2 (124M, random weights from its config, no
download, fp16) if transformers is installed, else a hand-written GPT-2-shaped decoder
(12 layers, d_model 768, 12 heads, its KV cache grown by torch.cat each token, fp16);
--model picks one. Requests: (batch, prompt length) drawn from {1, 2, 4, 8, 16} x
32..512, seeded, the same in every run; each generates --new-tokens tokens.

Time: per request, torch.cuda.synchronize() around the generation, divided by the
tokens generated; ms_per_token_median is the median over the requests after the
warm-up ones. host_ms_per_step_median: the part until the program's thread had issued
the request (near the total, generation waits for the host). peak_device_used_mib:
cudaMemGetInfo's total - free, probed after every request (and every 8 tokens of the
hand-written decoder), minus the value before the model. tokens_sha: a hash of every
token generated: the same in every run of the same seed, whichever allocator (the
check). Deterministic kernels (torch.use_deterministic_algorithms, cuBLAS's fixed
workspace CUBLAS_WORKSPACE_CONFIG=:4096:8) make that hash depend on the model and the
requests alone. Output: one JSON line on stdout; progress on stderr.
"""
import argparse
import hashlib
import importlib.util
import os
import random
import statistics
import sys
import time

from bench_torch import Probes, allocator_from_env, log, run_and_report, shim_preloaded


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["auto", "transformers", "decoder"], default="auto",
                   help="auto (default): transformers' GPT-2 if installed, else the hand-written decoder")
    p.add_argument("--requests", type=int, default=12, help="timed requests after the warm-up (default 12)")
    p.add_argument("--warmup", type=int, default=2, help="untimed requests first (default 2)")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu for a smoke test")
    p.add_argument("--label", default="")
    p.add_argument("--smoke", action="store_true", help="a tiny model and short prompts, to check the script (CPU)")
    return p.parse_args(argv)


class Decoder:
    """GPT-2-shaped decoder; the KV cache of each layer grows by torch.cat per token."""

    def __init__(self, torch, device, dtype, smoke):
        nn = torch.nn
        self.torch = torch
        self.layers, self.d, self.heads, self.vocab = (2, 64, 4, 512) if smoke else (12, 768, 12, 50257)
        self.embed = nn.Embedding(self.vocab, self.d).to(device, dtype)
        self.pos = nn.Embedding(1024, self.d).to(device, dtype)
        self.blocks = nn.ModuleList()
        for _ in range(self.layers):
            block = nn.ModuleDict({
                "ln1": nn.LayerNorm(self.d), "qkv": nn.Linear(self.d, 3 * self.d), "proj": nn.Linear(self.d, self.d),
                "ln2": nn.LayerNorm(self.d), "up": nn.Linear(self.d, 4 * self.d), "down": nn.Linear(4 * self.d, self.d),
            })
            self.blocks.append(block.to(device, dtype))
        self.ln = nn.LayerNorm(self.d).to(device, dtype)
        self.head = nn.Linear(self.d, self.vocab, bias=False).to(device, dtype)

    def step(self, ids, start, cache):
        """Logits of the last position; `cache` (a list of (k, v) per layer, or None) grows."""
        t = self.torch
        b, n = ids.shape
        positions = t.arange(start, start + n, device=ids.device)
        x = self.embed(ids) + self.pos(positions)
        hd = self.d // self.heads
        for i, blk in enumerate(self.blocks):
            q, k, v = blk["qkv"](blk["ln1"](x)).split(self.d, dim=-1)
            q, k, v = (z.view(b, n, self.heads, hd).transpose(1, 2) for z in (q, k, v))
            if cache[i] is not None:
                k = t.cat([cache[i][0], k], dim=2)
                v = t.cat([cache[i][1], v], dim=2)
            cache[i] = (k, v)
            a = t.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=cache[i][0].shape[2] == n)
            x = x + blk["proj"](a.transpose(1, 2).reshape(b, n, self.d))
            x = x + blk["down"](t.nn.functional.gelu(blk["up"](blk["ln2"](x))))
        return self.head(self.ln(x[:, -1]))

    def generate(self, ids, new_tokens, probe):
        t = self.torch
        cache = [None] * self.layers
        out = []
        logits = self.step(ids, 0, cache)
        for i in range(new_tokens):
            nxt = logits.argmax(dim=-1, keepdim=True)
            out.append(nxt)
            if i + 1 < new_tokens:
                logits = self.step(nxt, ids.shape[1] + i, cache)
            if i % 8 == 7:
                probe()
        return t.cat(out, dim=1)


class HfGpt2:
    """transformers' GPT2LMHeadModel from its default config, random weights."""

    def __init__(self, torch, device, dtype, smoke):
        import transformers

        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512) if smoke \
            else transformers.GPT2Config()
        self.vocab = config.vocab_size
        self.model = transformers.GPT2LMHeadModel(config).to(device, dtype).eval()

    def generate(self, ids, new_tokens, probe):
        out = self.model.generate(ids, attention_mask=ids.new_ones(ids.shape), max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        return out[:, ids.shape[1]:]


def open_gpt2(args, result, hf_model, fallback):
    """What a GPT-2 run needs, made alike for generation and scoring: torch
    with deterministic algorithms, the device and its probes (`Probes`), and
    the model, transformers' (`hf_model`) where it is installed, else
    `fallback`, in fp16 on a GPU."""
    # Before cuBLAS starts: its reductions then take the same order in every run.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.use_deterministic_algorithms(True)

    result["torch"] = torch.__version__
    probes = Probes(torch, args.device, result)
    kind = args.model
    if kind == "auto":
        kind = "transformers" if importlib.util.find_spec("transformers") else "decoder"
    result["model"] = kind
    torch.manual_seed(args.seed)
    dtype = torch.float16 if probes.cuda else torch.float32
    model = (hf_model if kind == "transformers" else fallback)(torch, probes.dev, dtype, args.smoke)
    return torch, probes, model


def run(args, result):
    torch, probes, model = open_gpt2(args, result, HfGpt2, Decoder)
    rng = random.Random(args.seed)
    lengths = (4, 16) if args.smoke else (32, 512)
    requests = [(rng.choice((1, 2, 4, 8, 16)), rng.randint(*lengths)) for _ in range(args.warmup + args.requests)]
    tokens = hashlib.sha1()
    per_token, host = [], []
    with torch.inference_mode():
        for i, (batch, prompt) in enumerate(requests):
            gen = torch.Generator().manual_seed(args.seed * 1000 + i)
            ids = torch.randint(1, model.vocab, (batch, prompt), generator=gen).to(probes.dev)
            probes.sync()
            t0 = time.perf_counter()
            out = model.generate(ids, args.new_tokens, probes.probe)
            issued = time.perf_counter()
            probes.sync()
            dt = (time.perf_counter() - t0) * 1e3
            probes.probe()
            tokens.update(out.cpu().numpy().tobytes())
            if i >= args.warmup:
                per_token.append(dt / args.new_tokens)
                host.append((issued - t0) * 1e3 / args.new_tokens)
            log(f"request {i + 1}/{len(requests)}: batch {batch}, prompt {prompt}: {dt / args.new_tokens:.2f} ms/token")
            del ids, out
    result["ms_per_token_median"] = round(statistics.median(per_token), 3)
    result["ms_per_token_min"] = round(min(per_token), 3)
    result["ms_per_token_max"] = round(max(per_token), 3)
    result["host_ms_per_step_median"] = round(statistics.median(host), 3)
    result["tokens_sha"] = tokens.hexdigest()[:16]
    probes.report(result)


def main(argv=None):
    args = parse_args(argv)
    result = {"bench": "generate", "scenario": args.label or None, "allocator": allocator_from_env(),
              "shim": shim_preloaded(), "requests": args.requests, "warmup": args.warmup,
              "new_tokens": args.new_tokens, "seed": args.seed, "device": args.device, "smoke": args.smoke}
    return run_and_report(run, args, result)


if __name__ == "__main__":
    sys.exit(main())
