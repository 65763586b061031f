# Times whole processes interleaved: each iteration runs every command once, starting with a
# different one each time, so that all of them see the same moments of a machine whose speed
# drifts (a loaded hypervisor moved a cross-CPU wakeup from ~50 to ~450 us within minutes here).
# Blocks of one command after another (hyperfine's way) let that drift land on one command.
#
# Usage: interleave.py RUNS WARMUP OUT.json NAME [env:VAR=VALUE...] CMD... [::: NAME ...]...
# Writes {"NAME": [seconds, ...], ...} to OUT.json, in the order first given; a name given more
# than once is run that many times an iteration, its samples pooled. `env:VAR=VALUE` words
# after a name set VAR for that command only (no `env` process in between to time). Beside it, OUT.cpu.json
# holds, the same way, the CPU time the whole machine spent during each run (user, system and
# interrupt time of every CPU in /proc/stat; steal excluded): the process tree, whichever of its
# processes were reaped or not, and the kernel's worker threads that dismantle its namespaces
# and cgroups. It counts in 10 ms ticks, so only a mean over many runs means anything. A command that exits with
# anything but 0 stops it with an error. Output of the commands goes to /dev/null.
import json
import os
import sys
import time


def main():
    runs, warmup, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    groups, cur = [], []
    for a in sys.argv[4:]:
        if a == ":::":
            groups.append(cur)
            cur = []
        else:
            cur.append(a)
    groups.append(cur)
    if any(len(g) < 2 for g in groups):
        sys.exit("interleave.py: each group needs a name and a command")
    devnull = os.open(os.devnull, os.O_WRONLY)
    actions = [(os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)]

    tick = os.sysconf("SC_CLK_TCK")

    def busy():
        with open("/proc/stat") as f:
            fields = f.readline().split()
        # cpu user nice system idle iowait irq softirq steal ...
        return sum(int(fields[i]) for i in (1, 2, 3, 6, 7)) / tick

    def split_env(cmd):
        env = dict(os.environ)
        while cmd and cmd[0].startswith("env:"):
            var, _, value = cmd[0][4:].partition("=")
            env[var] = value
            cmd = cmd[1:]
        return env, cmd

    def once(cmd):
        env, argv = split_env(cmd)
        before = busy()
        t = time.perf_counter()
        pid = os.posix_spawnp(argv[0], argv, env, file_actions=actions)
        _, status = os.waitpid(pid, 0)
        elapsed = time.perf_counter() - t
        used = busy() - before
        if status != 0:
            sys.exit(f"interleave.py: {' '.join(argv)} exited with status {status}")
        return elapsed, used

    for _ in range(warmup):
        for g in groups:
            once(g[1:])
    times = {g[0]: [] for g in groups}
    cpu = {g[0]: [] for g in groups}
    for i in range(runs):
        for k in range(len(groups)):
            g = groups[(i + k) % len(groups)]
            elapsed, used = once(g[1:])
            times[g[0]].append(elapsed)
            cpu[g[0]].append(used)
    with open(out, "w") as f:
        json.dump(times, f)
    with open(out.removesuffix(".json") + ".cpu.json", "w") as f:
        json.dump(cpu, f)


main()
