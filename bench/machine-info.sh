#!/usr/bin/env bash
# Prints what a benchmark's results depend on: cores, kernel, CPU model, sockets and NUMA
# nodes, whether unprivileged userfaultfd is allowed (frame recycling), then each argument
# as a line of its own (the run's settings). The bench scripts write it to OUT/machine.txt.
echo "cores: $(nproc)"
uname -r
lscpu 2>/dev/null | grep -E "Model name|NUMA node|Socket" || true
echo "unprivileged_userfaultfd: $(cat /proc/sys/vm/unprivileged_userfaultfd 2>/dev/null)"
for line in "$@"; do
    echo "$line"
done
