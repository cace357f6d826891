#!/usr/bin/env bash
# make stress: the ordering properties and the memory-held one (src/core/model_tests.rs) searched deep, on
# the CPU: STRESS_CASES cases (default 250000, about three minutes on two cores) for every property and each of its
# settings, from a random seed (or PROPTEST_RNG_SEED=N to repeat a search). Every
# failure found is saved by proptest in proptest-regressions/core/model_tests.txt,
# which every later run (make test's too) replays first: commit those lines.
# Prints the seed, the cases run and the violations found; exits non-zero on any.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
cases=${STRESS_CASES:-250000}
seed=${PROPTEST_RNG_SEED:-$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')}
# Settings per property: untracked runs 2, lagging_reclaimer 4 (LAGGING_SETTINGS),
# past_the_default_limit 5 (LARGE_SETTINGS), large_blocks 4 (LARGE_BLOCK_SETTINGS),
# the six others and what_the_shim_holds_stays_within_its_budget 1.
properties=11
settings=22
echo "make stress: $cases cases per property and setting ($settings settings), PROPTEST_RNG_SEED=$seed"
mkdir -p build
log=build/stress.log # kept: a failure's input and message are in it
start=$(date +%s)
PROPTEST_CASES=$cases PROPTEST_RNG_SEED=$seed cargo test --release --lib \
  -- no_block_is_reused_before_earlier_work what_the_shim_holds_stays_within_its_budget --test-threads="$(nproc)" 2>&1 | tee "$log" | grep -E '^test |^Test failed|^thread'
failed=$(grep -c '^test .* FAILED$' "$log")
ran=$(grep -c '^test .* ok$' "$log")
if [ $((ran + failed)) -ne $properties ]; then
  echo "make stress: expected $properties properties, saw $((ran + failed)) (did the build fail?)"
  tail -n 20 "$log"
  exit 2
fi
echo "make stress: $((cases * settings)) cases in $(($(date +%s) - start)) s, seed $seed: $failed of $properties properties violated"
[ "$failed" -eq 0 ] || echo "make stress: the failing inputs and messages: $log"
echo "$((cases * settings)) passed, $failed failed"
[ "$failed" -eq 0 ]
