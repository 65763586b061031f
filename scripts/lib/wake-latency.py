# Prints how long a pipe round trip takes between two processes on one CPU and on two CPUs:
# on a virtual machine, waking a CPU the hypervisor has idled or descheduled is what makes a
# cross-CPU handoff dear, and how dear changes with the load on the host. scripts/bench-run
# prints it beside its figures (cordon, which overlaps work on threads, pays more for it than
# bubblewrap).
import os, time
def rt(a, b, n=300):
    r1, w1 = os.pipe(); r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {b})
        for _ in range(n + 1):
            os.read(r1, 1); os.write(w2, b"x")
        os._exit(0)
    os.sched_setaffinity(0, {a})
    os.write(w1, b"x"); os.read(r2, 1)
    t = time.perf_counter()
    for _ in range(n):
        os.write(w1, b"x"); os.read(r2, 1)
    d = (time.perf_counter() - t) / n * 1e6
    os.waitpid(pid, 0)
    return d
cpus = sorted(os.sched_getaffinity(0))
same = rt(cpus[0], cpus[0])
cross = rt(cpus[0], cpus[-1]) if len(cpus) > 1 else float("nan")
print(f"pipe round trip: {same:.0f} us on one CPU, {cross:.0f} us across CPUs")
