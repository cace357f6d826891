#!/usr/bin/env bash
# Prints the CPUs of GPU 0's NUMA node, as the kernel lists them for its PCI device
# (e.g. 0-31,64-95), or nothing where they cannot be found. The benchmarks run their
# processes there, so that no round lands on a far node.
bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 0 2>/dev/null | head -n 1 | tr 'A-F' 'a-f')
[ -n "$bus" ] || exit 0
# nvidia-smi writes an 8-digit PCI domain (00000000:19:00.0), sysfs a 4-digit one.
cat "/sys/bus/pci/devices/${bus: -12}/local_cpulist" 2>/dev/null
exit 0
