"""Ratios between allocators, measured so that a small gap shows: the one way
`scripts/bench_programs.sh` and `scripts/compat.py --rounds` compare runs.

Configurations run interleaved, round by round (one process each per round),
so that a slow spell of a shared machine hits every configuration alike. A
ratio is taken within each round, and the rounds' ratios give its median and
an interval: the distribution-free interval of the median from the order
statistics, the narrowest whose confidence is at least 90% (with 5 rounds,
the lowest and highest ratio: 94%); fewer rounds cannot reach 90%, and their
interval is the range (75% with 3 rounds, 87.5% with 4). The noise floor is the same figure for
an allocator against a second run of itself in the same round.

    python3 scripts/ratios.py   # checks this module on made-up figures
"""
from math import comb


def median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def interval(values, confidence=0.90):
    """(low, high, coverage) of the median of `values`, or None with fewer
    than 2 values: the order statistics k and n + 1 - k with the largest k
    whose coverage (binomial, p = 1/2) is still at least `confidence`; where
    none reaches it, the range and its coverage."""
    values = sorted(v for v in values if v is not None)
    n = len(values)
    if n < 2:
        return None
    best = None
    for k in range(1, n // 2 + 1):
        coverage = 1 - 2 * sum(comb(n, i) for i in range(k)) / 2 ** n
        if coverage < confidence:
            break
        best = (values[k - 1], values[n - k], coverage)
    return best or (values[0], values[-1], 1 - 2 / 2 ** n)


def per_round(these, base):
    """Each round's ratio these[r] / base[r], for the rounds (dict keys) where both have a figure."""
    return [these[r] / base[r] for r in these if these[r] is not None and base.get(r)]


def cell(ratios):
    """'1.02x [0.97-1.06]': median and interval of a list of per-round ratios."""
    m = median(ratios)
    if m is None:
        return "-"
    span = interval(ratios)
    return f"{m:.2f}x" + (f" [{span[0]:.2f}-{span[1]:.2f}]" if span else "")


# The widest interval that still resolves a 5% gap (1.05x against 1.00x, say).
RESOLUTION = 0.10


def ratio_line(name, ratios, against, noise=None):
    """'ratio: NAME = 1.02x [0.97-1.06] against AGAINST; noise 1.00x [0.98-1.03]': a row's
    per-round ratios and its program's noise floor, saying where the interval is too wide
    (or the rounds too few) to resolve a 5% gap."""
    line = f"ratio: {name} = {cell(ratios)} against {against}"
    if noise is not None:
        line += f"; noise {cell(noise)}"
    span = interval(ratios)
    if span is None or span[1] - span[0] > RESOLUTION:
        line += f"; interval wider than {RESOLUTION:.2f}: cannot resolve 5%"
    return line


LEGEND = ("ratios: the median of the per-round ratios [its interval: order statistics, at least 90% "
          "confidence from 5 rounds on (94% with 5); with fewer, the range (75% with 3)]; noise floor: an "
          "allocator against a second run of itself in the same round")


if __name__ == "__main__":
    assert median([3, 1, 2]) == 2 and median([4, 1, 2, 3]) == 2.5 and median([None]) is None
    low, high, coverage = interval([1.0, 1.1, 0.9, 1.3, 1.2])
    assert (low, high) == (0.9, 1.3) and abs(coverage - 0.9375) < 1e-9
    low, high, coverage = interval(list(range(1, 11)))
    assert (low, high) == (2, 9) and coverage >= 0.9
    assert interval([1.0]) is None
    assert per_round({1: 2.0, 2: 3.0, 3: None}, {1: 1.0, 2: 2.0, 3: 1.0}) == [2.0, 1.5]
    assert cell([1.0, 1.02, 1.04, 0.98, 1.01]) == "1.01x [0.98-1.04]"
    narrow = ratio_line("a/b", [1.0, 1.02, 1.04, 0.98, 1.01], "a/c", [1.0, 0.99, 1.01, 1.0, 1.02])
    assert narrow == "ratio: a/b = 1.01x [0.98-1.04] against a/c; noise 1.00x [0.99-1.02]", narrow
    assert ratio_line("a/b", [1.0, 1.2, 0.9, 1.1, 1.0], "a/c").endswith("; interval wider than 0.10: cannot resolve 5%")
    assert ratio_line("a/b", [1.0], "a/c").endswith("cannot resolve 5%"), "one round resolves nothing"
    print("ratios.py: 9 checks passed")
