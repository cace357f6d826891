# The tables of `make bench` (scripts/bench.sh), from the lines the churn
# program printed, each prefixed with the mode and the repetition:
#
#   <mode> <rep> size <bytes> median_us <x> reps <n> used_delta_mib <loop> <after sync>
#   <mode> <rep> scenario <name> median_us <x> reps <n> peak_in_use_mib <a> peak_used_mib <b>
#
# modes: real, reallive (real*), shim, shimnb (shim+nb), async, shimsync (sync),
# shimnolib (nolib: the shim with SOMA_BY_LIBRARY=0).
# Every figure in the tables is the median over the repetitions of a
# per-process median (the spread is the min-max of those repetitions).
#
#   awk -v reps=3 -v csv=bench.csv -v rawcsv=bench-reps.csv -f scripts/bench_table.awk bench.raw
#
# Portable awk (POSIX: mawk, gawk, busybox). The targets of issue 12 are
# reported as ok/MISS; a miss is not an error (exit status 0).

function human(b) {
  if (b >= 1073741824) return sprintf("%d GiB", b / 1073741824)
  if (b >= 1048576) return sprintf("%d MiB", b / 1048576)
  if (b >= 1024) return sprintf("%d KiB", b / 1024)
  return sprintf("%d B", b)
}
# stat(mode, key, which): sets S_n, S_med, S_min, S_max over the repetitions
# of `which` ("us": time, "used": peak device memory used); returns S_n.
function stat(mode, key, which,   n, i, a) {
  n = cnt[mode, key] + 0
  S_n = n
  if (n == 0) return 0
  for (i = 1; i <= n; i++) a[i] = (which == "us") ? us[mode, key, i] : used[mode, key, i]
  order(a, n)
  S_min = O_min
  S_max = O_max
  S_med = O_med
  return n
}
# order(a, n): sorts a[1..n] (n > 0) and sets O_min, O_max, O_med.
function order(a, n,   i, j, x) {
  for (i = 2; i <= n; i++) {
    x = a[i]
    for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]
    a[j + 1] = x
  }
  O_min = a[1]
  O_max = a[n]
  O_med = (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function med(mode, key) { return stat(mode, key, "us") ? S_med : -1 }
function cell(mode, key) { return stat(mode, key, "us") ? sprintf("%.2f", S_med) : "-" }
function spread(mode, key) { return stat(mode, key, "us") ? sprintf("%.2f-%.2f", S_min, S_max) : "-" }
function full(mode, key) { return stat(mode, key, "us") ? sprintf("%.2f [%.2f-%.2f]", S_med, S_min, S_max) : "-" }
function ratio(a, b) { return (a > 0 && b > 0) ? sprintf("%.2fx", a / b) : "-" }
# the same for the CSV, more digits, empty without data
function cr(a, b) { return (a > 0 && b > 0) ? sprintf("%.6g", a / b) : "" }
# r/u: median peak used over the peak the program held (MiB, at least 1)
function ru(mode, key,   m) {
  if (!stat(mode, key, "used") || inuse[key] == "") return "-"
  m = inuse[key] < 1 ? 1 : inuse[key]
  return sprintf("%.2f", S_med / m)
}
# verdict(a, b, limit): ok if a <= limit * b, MISS if not, - without data
# pairs(key): the ratio shim / nolib of each repetition that ran both; sets
# P_n, P_med, P_min, P_max; returns P_n.
function pairs(key,   i, j, n, a) {
  n = 0
  for (i = 1; i <= cnt["shim", key]; i++)
    for (j = 1; j <= cnt["shimnolib", key]; j++)
      if (rep_of["shim", key, i] == rep_of["shimnolib", key, j] && us["shimnolib", key, j] > 0) {
        a[++n] = us["shim", key, i] / us["shimnolib", key, j]
        break
      }
  P_n = n
  if (n == 0) return 0
  order(a, n)
  P_min = O_min
  P_max = O_max
  P_med = O_med
  return n
}
function verdict(a, b, limit) {
  if (a <= 0 || b <= 0) return "-"
  return (a <= limit * b) ? "ok" : "MISS"
}
function label(key) { return (key in issize) ? human(key) : key }
function group(key) {
  if (key in issize) return "sizes"
  if (key ~ /^threads/) return "threads"
  if (key ~ /^idle-nb/) return "streams"
  if (key == "streams4x4G") return "4x4G"
  if (key ~ /^gpu-chain/) return "gpu"
  return key
}
function present(key,   i) {
  for (i = 1; i <= nmodes; i++) if (cnt[mode_of[i], key] > 0) return 1
  return 0
}
function min_reps(key,   i, n, m) {
  m = -1
  for (i = 1; i <= nmodes; i++) {
    n = cnt[mode_of[i], key] + 0
    if (n > 0 && (m < 0 || n < m)) m = n
  }
  return m < 0 ? 0 : m
}
# T3 over every row shown: the shim's median not above the real one (each
# scenario counted once, also where it is in both tables)
function t3(key,   v) {
  if (key == "gpu-chain-kernels") return "-" # no allocator call: nothing to compare
  if (key in t3_done) return t3_done[key]
  v = verdict(med("shim", key), med("real", key), 1)
  t3_done[key] = v
  if (v == "ok") t3_ok++
  else if (v == "MISS") { t3_miss++; t3_list = t3_list sprintf(" %s (%s)", label(key), ratio(med("shim", key), med("real", key))) }
  return v
}

BEGIN {
  nmodes = split("real reallive shim shimnb async shimsync shimnolib", mode_of, " ")
  n1 = split("256 1048576 16777216 268435456 1073741824 nlp threads4 threads4-legacy streams4x4G stall pitch2d gpu-chain-kernels gpu-chain", order1, " ")
  n2 = split("idle-nb0 idle-nb1 idle-nb8 idle-nb64 idle-nb256 threads1 threads4 threads8 threads16 threads1-legacy threads4-legacy threads8-legacy threads16-legacy launch-legacy launch-nb", order2, " ")
  if (reps == "") reps = 1
}
$3 == "size" && NF >= 11 {
  k = $4 ""
  issize[k] = 1
  i = ++cnt[$1, k]
  us[$1, k, i] = $6 + 0
  used[$1, k, i] = ($10 + 0 > $11 + 0) ? $10 + 0 : $11 + 0
  inuse[k] = (k + 0 < 1048576 ? 1048576 : k + 0) / 1048576
  rep_of[$1, k, i] = $2
}
$3 == "scenario" && NF >= 12 {
  k = $4
  i = ++cnt[$1, k]
  us[$1, k, i] = $6 + 0
  used[$1, k, i] = $12 + 0
  inuse[k] = $10 + 0
  rep_of[$1, k, i] = $2
}
END {
  # ---------------------------------------------------------------- table 1
  shown1 = 0
  for (r = 1; r <= n1; r++) if (present(order1[r])) shown1++
  if (shown1) {
    printf "The allocation call: median of %d repetitions (each a fresh process) of the median us per pair\n\n", reps
    printf "%-16s %8s %8s %8s %8s %8s %8s %9s %9s %9s %6s %6s %6s %10s\n", "scenario", "real", "real*", "shim",
      "shim+nb", "async", "sync", "real/shim", "shim/asy", "+nb/asy", "r/u", "+nb", "async", "shim<=real"
    for (r = 1; r <= n1; r++) {
      k = order1[r]
      if (!present(k)) continue
      printf "%-16s %8s %8s %8s %8s %8s %8s %9s %9s %9s %6s %6s %6s %10s\n", label(k), cell("real", k),
        cell("reallive", k), cell("shim", k), cell("shimnb", k), cell("async", k), cell("shimsync", k),
        ratio(med("real", k), med("shim", k)), ratio(med("shim", k), med("async", k)),
        ratio(med("shimnb", k), med("async", k)), ru("shim", k), ru("shimnb", k), ru("async", k), t3(k)
    }
    printf "\nSpread of the repetitions (min-max of the per-process medians, us)\n\n"
    printf "%-16s %19s %19s %19s %19s %19s %19s\n", "scenario", "real", "real*", "shim", "shim+nb", "async", "sync"
    for (r = 1; r <= n1; r++) {
      k = order1[r]
      if (!present(k)) continue
      printf "%-16s %19s %19s %19s %19s %19s %19s\n", label(k), spread("real", k), spread("reallive", k),
        spread("shim", k), spread("shimnb", k), spread("async", k), spread("shimsync", k)
    }
    printf "\n"
  }
  # ---------------------------------------------------------------- table 2
  shown2 = 0
  for (r = 1; r <= n2; r++) if (present(order2[r])) shown2++
  if (shown2) {
    printf "Idle streams and host threads (issue 12): 1 MiB pair, us, median [min-max] of the repetitions\n\n"
    printf "%-16s %2s %26s %26s %26s %9s %10s %9s %10s %10s %10s\n", "scenario", "n", "real", "shim", "async",
      "shim/real", "shim/async", "shim/nb0", "shim<=real", "nb<=1.25x", "<=1.25xasy"
    b0 = med("shim", "idle-nb0")
    for (r = 1; r <= n2; r++) {
      k = order2[r]
      if (!present(k)) continue
      s = med("shim", k)
      isidle = (k ~ /^idle-nb/)
      nbr = isidle ? ratio(s, b0) : "-"
      v1 = "-"
      if (k == "idle-nb256") {
        v1 = verdict(s, b0, 1.25)
        t1 = v1
        t1_ratio = ratio(s, b0)
      }
      v2 = "-"
      if (!isidle) {
        v2 = verdict(s, med("async", k), 1.25)
        if (v2 == "ok") t2_ok++
        else if (v2 == "MISS") { t2_miss++; t2_list = t2_list sprintf(" %s (%s)", k, ratio(s, med("async", k))) }
      }
      v3 = t3(k)
      printf "%-16s %2d %26s %26s %26s %9s %10s %9s %10s %10s %10s\n", k, min_reps(k), full("real", k),
        full("shim", k), full("async", k), ratio(s, med("real", k)), ratio(s, med("async", k)), nbr, v3, v1, v2
    }
    printf "\n"
  }
  # ---------------------------------------------------------------- table 3
  shown3 = 0
  for (r = 1; r <= n1 + n2; r++) if (cnt["shimnolib", (r <= n1) ? order1[r] : order2[r - n1]] > 0) shown3++
  if (shown3) {
    printf "Counting by library: shim against nolib (SOMA_BY_LIBRARY=0), us per pair, median [min-max]\n\n"
    printf "%-16s %2s %26s %26s %26s %7s\n", "scenario", "n", "shim", "nolib", "shim/nolib by repetition", "<=1.02x"
    for (r = 1; r <= n1 + n2; r++) {
      k = (r <= n1) ? order1[r] : order2[r - n1]
      if (cnt["shimnolib", k] == 0 || ((k, "lib") in noted)) continue
      noted[k, "lib"] = 1
      v4 = "-"
      p = "-"
      if (pairs(k)) {
        p = sprintf("%.3fx [%.3f-%.3f]", P_med, P_min, P_max)
        v4 = (P_med <= 1.02) ? "ok" : "MISS"
        if (v4 == "ok") t4_ok++
        else { t4_miss++; t4_list = t4_list sprintf(" %s (%.3fx)", label(k), P_med) }
      }
      printf "%-16s %2d %26s %26s %26s %7s\n", label(k), P_n, full("shim", k), full("shimnolib", k), p, v4
    }
    printf "\n"
  }
  # ---------------------------------------------------------------- summary
  printf "Targets (T1-T3: issue 12; T4: issue 41), on the medians of the repetitions; a MISS does not fail the benchmark:\n"
  if (t1 == "") t1 = "- (not run: needs idle-nb0 and idle-nb256)"
  else t1 = t1_ratio " " t1
  printf "  T1 shim pair with 256 idle non-blocking streams <= 1.25x the pair with none: %s\n", t1
  if (t2_ok + t2_miss == 0) printf "  T2 every threads scenario <= 1.25x the async program of its shape: - (not run)\n"
  else printf "  T2 every threads scenario <= 1.25x the async program of its shape: %d of %d ok%s\n", t2_ok,
    t2_ok + t2_miss, t2_miss ? ";" " MISS:" t2_list : ""
  if (t3_ok + t3_miss == 0) printf "  T3 shim never slower than real: - (no scenario with both)\n"
  else printf "  T3 shim never slower than real, every scenario above: %d of %d ok%s\n", t3_ok, t3_ok + t3_miss,
    t3_miss ? "; MISS:" t3_list : ""
  if (t4_ok + t4_miss > 0)
    printf "  T4 counting by library costs at most 2%% (shim / nolib), every row measured: %d of %d ok%s\n", t4_ok,
      t4_ok + t4_miss, t4_miss ? "; MISS:" t4_list : ""
  short = ""
  for (r = 1; r <= n1 + n2; r++) {
    k = (r <= n1) ? order1[r] : order2[r - n1]
    if (present(k) && min_reps(k) < reps && !((k, "short") in noted)) {
      noted[k, "short"] = 1
      short = short sprintf(" %s (%d)", label(k), min_reps(k))
    }
  }
  if (short != "") printf "  fewer repetitions than %d (time budget or a failed run):%s\n", reps, short

  # ------------------------------------------------------------------ CSV
  if (csv != "") {
    hdr = "scenario,group,size_bytes,reps"
    for (i = 1; i <= nmodes; i++) hdr = hdr "," mode_of[i] "_us," mode_of[i] "_min_us," mode_of[i] "_max_us"
    hdr = hdr ",ru_shim,ru_shimnb,ru_async,real_over_shim,shim_over_real,shim_over_async,shimnb_over_async"
    hdr = hdr ",shim_over_shim_idle_nb0,shim_le_real,idle_nb256_le_1.25x_nb0,threads_le_1.25x_async"
    print hdr > csv
    for (r = 1; r <= n1 + n2; r++) {
      k = (r <= n1) ? order1[r] : order2[r - n1]
      if (!present(k) || ((k, "csv") in noted)) continue
      noted[k, "csv"] = 1
      line = label(k) "," group(k) "," ((k in issize) ? k : "") "," min_reps(k)
      for (i = 1; i <= nmodes; i++) {
        if (stat(mode_of[i], k, "us")) line = line sprintf(",%.2f,%.2f,%.2f", S_med, S_min, S_max)
        else line = line ",,,"
      }
      s = med("shim", k)
      isidle = (k ~ /^idle-nb/)
      isthr = (k ~ /^threads/)
      line = line "," csvnum(ru("shim", k)) "," csvnum(ru("shimnb", k)) "," csvnum(ru("async", k))
      line = line "," cr(med("real", k), s) "," cr(s, med("real", k))
      line = line "," cr(s, med("async", k)) "," cr(med("shimnb", k), med("async", k))
      line = line "," (isidle ? cr(s, med("shim", "idle-nb0")) : "")
      line = line "," csvnum(verdict(s, med("real", k), 1))
      line = line "," ((k == "idle-nb256") ? csvnum(verdict(s, med("shim", "idle-nb0"), 1.25)) : "")
      line = line "," (isthr ? csvnum(verdict(s, med("async", k), 1.25)) : "")
      print line > csv
    }
    close(csv)
  }
  if (rawcsv != "") {
    print "scenario,size_bytes,mode,rep,us_per_pair,peak_in_use_mib,peak_used_mib" > rawcsv
    for (r = 1; r <= n1 + n2; r++) {
      k = (r <= n1) ? order1[r] : order2[r - n1]
      if ((k, "raw") in noted) continue
      noted[k, "raw"] = 1
      for (i = 1; i <= nmodes; i++)
        for (j = 1; j <= cnt[mode_of[i], k]; j++)
          printf "%s,%s,%s,%d,%.2f,%.0f,%.0f\n", label(k), ((k in issize) ? k : ""), mode_of[i],
            rep_of[mode_of[i], k, j], us[mode_of[i], k, j], inuse[k], used[mode_of[i], k, j] > rawcsv
    }
    close(rawcsv)
  }
}
# "-" (no data) -> empty
function csvnum(s) { return (s == "-") ? "" : s }
