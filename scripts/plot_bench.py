#!/usr/bin/env python3
"""Plot the allocation micro-benchmark (`make bench`) as a PNG.

    python3 scripts/plot_bench.py bench.csv bench.png [--title TEXT] [--ylabel TEXT]

Input: CSV text in one of three layouts. What `make bench` writes now:

  bench.csv (the table, one row per scenario), header

    scenario,group,size_bytes,reps,real_us,real_min_us,real_max_us,...,shim_us,...

  where the rows with a size_bytes are plotted: for each mode M among real, shim,
  shimnb and async, M_us (the median of the repetitions) as the point and
  M_min_us..M_max_us (their range) as the error bar; the other columns and rows
  (threads, idle streams, ...) are ignored;

  bench-reps.csv (every repetition), header

    scenario,size_bytes,mode,rep,us_per_pair,...

  where each row with a size_bytes is one measurement;

and the older layout (earlier runs, e.g. docs/bench.csv), header

    size_bytes,mode,us_per_pair

and one row per measurement, e.g.

    size_bytes,mode,us_per_pair
    256,real,56.3
    256,shim,3.9
    256,async,3.79

  size_bytes   the size of each allocation, in bytes (an integer > 0)
  mode         the allocator: real (cudaMalloc/cudaFree, natively), shim (the same
               program under LD_PRELOAD=libsomashim.so), shimnb (the same with an
               idle non-blocking stream), async (hand-written
               cudaMallocAsync/cudaFreeAsync); any other name is plotted as well
  us_per_pair  host time of one alloc/free pair (one iteration), microseconds, as the
               benchmark reports it (its median after warm-up)

Rows with the same size and mode (repetitions) are summarized by their median, and
their range is drawn as an error bar. Lines starting with '#', blank lines, the
header, and any line that is not of the layout of the last header seen (before any
header: exactly three fields of the older layout) are skipped, so the CSV may be
embedded in a longer log; the count of skipped non-blank lines is printed. "-" reads
standard input.

Output: a PNG, log-log, time per pair against size, one line per mode; below it, when
real and shim are both present, the speed-up real/shim per size (and shim/async).
Uses matplotlib's Agg backend (no display needed). Exit status 1 if no row was read.
"""
import argparse
import math
import statistics
import sys

STYLE = {
    "real": {"label": "real cudaMalloc/cudaFree", "color": "#d62728", "marker": "o"},
    "shim": {"label": "shim (LD_PRELOAD)", "color": "#1f77b4", "marker": "s"},
    "shimnb": {"label": "shim, idle non-blocking stream", "color": "#9467bd", "marker": "D"},
    "async": {"label": "native cudaMallocAsync/FreeAsync", "color": "#2ca02c", "marker": "^"},
}
ORDER = ["real", "shim", "shimnb", "async"]


def human(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:g} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n:g} B"


WIDE_MODES = ["real", "shim", "shimnb", "async"]


def _positive(text):
    v = float(text)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(text)
    return v


def read_rows(lines):
    """-> ({mode: {size: [us, ...]}}, skipped count)."""
    data = {}
    skipped = 0
    # The layout: "long" (size_bytes, mode, us_per_pair columns) or "wide"
    # (size_bytes and <mode>_us[, _min_us, _max_us] columns), with the column
    # indexes; before any header, the older three-field layout.
    layout, cols, ncols = "long", {"size_bytes": 0, "mode": 1, "us_per_pair": 2}, 3
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if "size_bytes" in fields:  # a header
            names = {name: i for i, name in enumerate(fields)}
            ncols = len(fields)
            if "mode" in names and "us_per_pair" in names:
                layout, cols = "long", names
                continue
            if any(m + "_us" in names for m in WIDE_MODES):
                layout, cols = "wide", names
                continue
            skipped += 1
            continue
        if len(fields) != ncols:
            skipped += 1
            continue
        size_text = fields[cols["size_bytes"]]
        if layout == "wide" and size_text == "":
            continue  # a scenario other than a size: not plotted
        if layout == "long" and size_text == "" and ncols > 3:
            continue  # bench-reps.csv: a scenario other than a size
        try:
            size = int(float(size_text))
            if size <= 0:
                raise ValueError(size_text)
            if layout == "long":
                mode = fields[cols["mode"]]
                if not mode:
                    raise ValueError(mode)
                data.setdefault(mode, {}).setdefault(size, []).append(_positive(fields[cols["us_per_pair"]]))
                continue
            got = {}
            for m in WIDE_MODES:
                i = cols.get(m + "_us")
                if i is None or fields[i] == "":
                    continue
                vals = [_positive(fields[i])]
                for extra in ("_min_us", "_max_us"):
                    j = cols.get(m + extra)
                    if j is not None and fields[j] != "":
                        vals.append(_positive(fields[j]))
                got[m] = vals
        except ValueError:
            skipped += 1
            continue
        for m, vals in got.items():
            # [median, min, max]: their median is the median, their range the range
            data.setdefault(m, {}).setdefault(size, []).extend(vals)
    return data, skipped


def plot(data, output, title, ylabel=""):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    modes = [m for m in ORDER if m in data] + sorted(m for m in data if m not in ORDER)
    ratios = "real" in data and "shim" in data
    if ratios:
        fig, (ax, rax) = plt.subplots(2, 1, figsize=(8, 7.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1.4]})
    else:
        fig, ax = plt.subplots(figsize=(8, 5.5))
        rax = None
    sizes_all = sorted({s for m in modes for s in data[m]})
    for mode in modes:
        st = STYLE.get(mode, {"label": mode, "marker": "d"})
        sizes = sorted(data[mode])
        med = [statistics.median(data[mode][s]) for s in sizes]
        lo = [m - min(data[mode][s]) for m, s in zip(med, sizes)]
        hi = [max(data[mode][s]) - m for m, s in zip(med, sizes)]
        kw = {k: v for k, v in st.items() if k != "label"}
        if any(lo) or any(hi):
            ax.errorbar(sizes, med, yerr=[lo, hi], capsize=3, linewidth=1.8, markersize=5, label=st["label"], **kw)
        else:
            ax.plot(sizes, med, linewidth=1.8, markersize=5, label=st["label"], **kw)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylabel(ylabel or "host time per alloc/free pair (us)")
    ax.grid(True, which="major", alpha=0.4)
    ax.grid(True, which="minor", axis="y", alpha=0.15)
    ax.legend(loc="best")
    ax.set_title(title or "cudaMalloc/cudaFree pair: real allocator vs somashim vs cudaMallocAsync")

    if rax is not None:
        def ratio_line(num, den, label, color):
            common = sorted(set(data[num]) & set(data[den]))
            if common:
                r = [statistics.median(data[num][s]) / statistics.median(data[den][s]) for s in common]
                rax.plot(common, r, marker="o", color=color, linewidth=1.5, markersize=4, label=label)
                for s, v in zip(common, r):
                    rax.annotate(f"{v:.1f}x" if v >= 10 else f"{v:.2f}x", (s, v), textcoords="offset points",
                                 xytext=(0, 5), ha="center", fontsize=7, color=color)

        ratio_line("real", "shim", "real / shim (speed-up)", STYLE["real"]["color"])
        if "async" in data:
            ratio_line("shim", "async", "shim / async (overhead)", STYLE["async"]["color"])
        rax.set_yscale("log")
        rax.margins(y=0.3)
        rax.axhline(1.0, color="gray", linewidth=0.8)
        rax.set_ylabel("ratio")
        rax.grid(True, which="major", alpha=0.4)
        rax.legend(loc="best", fontsize=8)
    bottom = rax if rax is not None else ax
    bottom.set_xlabel("allocation size")
    bottom.xaxis.set_major_locator(FixedLocator(sizes_all))
    bottom.xaxis.set_minor_locator(NullLocator())
    bottom.set_xticks(sizes_all)
    bottom.set_xticklabels([human(s) for s in sizes_all], rotation=45, ha="right")
    fig.tight_layout()
    fig.savefig(output, dpi=130)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("input", help="CSV file (bench.csv, bench-reps.csv or size_bytes,mode,us_per_pair), "
                   "or - for standard input")
    p.add_argument("output", help="PNG file to write")
    p.add_argument("--title", default="", help="plot title")
    p.add_argument("--ylabel", default="", help="y-axis label (default: host time per alloc/free pair (us))")
    args = p.parse_args(argv)
    try:
        if args.input == "-":
            lines = sys.stdin.read().splitlines()
        else:
            with open(args.input, errors="replace") as f:
                lines = f.read().splitlines()
    except OSError as e:
        print(f"plot_bench: cannot read {args.input}: {e}", file=sys.stderr)
        return 1
    data, skipped = read_rows(lines)
    rows = sum(len(v) for sizes in data.values() for v in sizes.values())
    if skipped:
        print(f"plot_bench: skipped {skipped} line(s) that are not rows of a known layout")
    if not rows:
        print(f"plot_bench: no size rows read from {args.input} (expected bench.csv, bench-reps.csv or "
              "the header size_bytes,mode,us_per_pair)", file=sys.stderr)
        return 1
    plot(data, args.output, args.title, args.ylabel)
    counts = ", ".join(f"{m}: {len(data[m])} sizes" for m in data)
    print(f"plot_bench: {rows} rows ({counts}) -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
