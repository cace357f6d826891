#!/usr/bin/env python3
"""Scoring benchmark: a decoder-only model scores batches of sequences (one forward
pass over each, no generation), under whatever allocator the environment picks
(scripts/bench_torch.py's names). Its logits, upcast to float32 and softmaxed, are
blocks of hundreds of MiB to several GiB, of a size that changes with every shape.

    python3 scripts/bench_scoring.py --passes 2

The model: Hugging Face transformers' GPT-2 (124M, random weights from its config, no
download, fp16) if transformers is installed, else scripts/bench_generate.py's
hand-written GPT-2-shaped decoder (fp16); --model picks one. Shapes: the 28 (batch,
length) pairs of batch {1, 2, 4, 8, 16, 32, 64} x length {128, 256, 512, 1024}, in an
order shuffled by --seed, the same in every run; each pass scores all 28. A shape:
random token ids (seeded), the logits of every position, their float32 softmax, and
each sequence's score, the sum of the log-probabilities of its next tokens.

Time: torch.cuda.synchronize() around each pass; scoring_ms is the median over the
passes (the first one included: it grows whatever the allocator holds).
peak_device_used_mib: cudaMemGetInfo's total - free (torch.cuda.mem_get_info), polled
after each shape's forward pass, after its softmax and after the shape, minus the value
before the model. checksum: a hash of every sequence's score (float32 bytes), which
every pass must repeat (else the run fails); deterministic kernels
(torch.use_deterministic_algorithms, cuBLAS's fixed workspace
CUBLAS_WORKSPACE_CONFIG=:4096:8) make it the same in every run of the same seed,
whichever allocator (the check). Output: "scoring_ms <ms> peak_mib <MiB> checksum
<hex>", then one JSON line, on stdout; progress on stderr. --smoke: a tiny model and
short sequences, to check the script (with --device cpu, in seconds).
"""
import argparse
import hashlib
import itertools
import random
import statistics
import sys
import time

from bench_generate import Decoder, HfGpt2, open_gpt2
from bench_torch import allocator_from_env, log, run_and_report, shim_preloaded

BATCHES = (1, 2, 4, 8, 16, 32, 64)
LENGTHS = (128, 256, 512, 1024)
SMOKE_LENGTHS = (4, 8, 12, 16)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["auto", "transformers", "decoder"], default="auto",
                   help="auto (default): transformers' GPT-2 if installed, else the hand-written decoder")
    p.add_argument("--passes", type=int, default=2, help="passes over the 28 shapes (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu for a smoke test")
    p.add_argument("--label", default="")
    p.add_argument("--smoke", action="store_true", help="a tiny model and short sequences, to check the script (CPU)")
    return p.parse_args(argv)


class DecoderScorer(Decoder):
    """bench_generate.py's decoder, the logits of every position, no cache."""

    def logits(self, ids):
        t = self.torch
        b, n = ids.shape
        x = self.embed(ids) + self.pos(t.arange(n, device=ids.device))
        hd = self.d // self.heads
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).split(self.d, dim=-1)
            q, k, v = (z.view(b, n, self.heads, hd).transpose(1, 2) for z in (q, k, v))
            a = t.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk["proj"](a.transpose(1, 2).reshape(b, n, self.d))
            x = x + blk["down"](t.nn.functional.gelu(blk["up"](blk["ln2"](x))))
        return self.head(self.ln(x))


class HfScorer(HfGpt2):
    """transformers' GPT2LMHeadModel from its default config, random weights."""

    def logits(self, ids):
        return self.model(ids, use_cache=False).logits


def run(args, result):
    if args.passes < 1:
        raise RuntimeError("no passes (--passes 0)")
    torch, probes, model = open_gpt2(args, result, HfScorer, DecoderScorer)
    shapes = list(itertools.product(BATCHES, SMOKE_LENGTHS if args.smoke else LENGTHS))
    random.Random(args.seed).shuffle(shapes)
    result["shapes"] = len(shapes)
    checksums, pass_ms = [], []
    with torch.inference_mode():
        for p in range(args.passes):
            checksum = hashlib.sha1()
            probes.sync()
            t0 = time.perf_counter()
            for i, (batch, length) in enumerate(shapes):
                gen = torch.Generator().manual_seed(args.seed * 1000 + i)
                ids = torch.randint(1, model.vocab, (batch, length + 1), generator=gen).to(probes.dev)
                logits = model.logits(ids[:, :-1])
                probes.probe()
                probs = logits.float().softmax(dim=-1)
                probes.probe()
                scores = probs.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).log().sum(dim=-1)
                checksum.update(scores.cpu().numpy().tobytes())
                del ids, logits, probs, scores
                probes.probe()
            probes.sync()
            pass_ms.append((time.perf_counter() - t0) * 1e3)
            checksums.append(checksum.hexdigest()[:16])
            log(f"pass {p + 1}/{args.passes}: {len(shapes)} shapes, {pass_ms[-1]:.1f} ms")
    result["ms_per_pass_median"] = round(statistics.median(pass_ms), 3)
    result["pass_ms"] = [round(ms, 3) for ms in pass_ms]
    result["checksum"] = checksums[0]
    if len(set(checksums)) != 1:
        raise RuntimeError(f"the passes scored differently: checksums {checksums}")
    probes.report(result)
    # The key-value line; run_and_report prints the JSON line after it.
    print(f"scoring_ms {result['ms_per_pass_median']} peak_mib {result['peak_device_used_mib']} "
          f"checksum {result['checksum']}", flush=True)


def main(argv=None):
    args = parse_args(argv)
    result = {"bench": "scoring", "scenario": args.label or None, "allocator": allocator_from_env(),
              "shim": shim_preloaded(), "passes": args.passes, "seed": args.seed, "device": args.device,
              "smoke": args.smoke}
    return run_and_report(run, args, result)


if __name__ == "__main__":
    sys.exit(main())
