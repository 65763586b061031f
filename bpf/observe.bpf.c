/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only */
/*
 * cordon's host-observed exec events. One raw tracepoint program on
 * sched_process_exec, loaded and attached once per boot and shared by every
 * run, reports each successful exec of a process whose cgroup (v2) is, or lies
 * below, a cgroup in `watched`; the filter runs in the kernel, so other
 * processes never reach a ring buffer. Each watched cgroup's run has its own ring
 * buffer (`watched`: cgroup id -> slot, `rings`: slot -> ring buffer): an event
 * goes to the ring of every watched ancestor, marked with that ancestor's id (a
 * slot is reused by later runs; the reader keeps only records marked with its own
 * cgroup), so two runs never see each other's events.
 * The egress programs of an observed run write its connect events into the same
 * ring buffer, so one consumer sees both in kernel order.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "cordon.h"

/*
 * The few kernel fields read, relocated against the running kernel's BTF
 * (CO-RE) when the object is loaded: offsets here are placeholders.
 */
struct mm_struct {
	unsigned long arg_start;
	unsigned long arg_end;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct task_struct *real_parent;
	struct mm_struct *mm;
} __attribute__((preserve_access_index));

struct linux_binprm {
	const char *filename;
} __attribute__((preserve_access_index));

/* Deepest cgroup level examined when matching a process against `watched`. */
#define MAX_CGROUP_LEVEL 32

struct ring {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, CORDON_RING_BYTES);
};

/* slot -> ring buffer. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, CORDON_MAX_RUNS);
	__type(key, __u32);
	__array(values, struct ring);
} rings SEC(".maps");

/* cgroup id -> the slot of its run's ring buffer; presence means "report this cgroup
 * and its descendants". */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, CORDON_MAX_RUNS);
	__type(key, __u64);
	__type(value, __u32);
} watched SEC(".maps");

/* cgroup id -> events its ring buffer had no room for (exec and connect). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, CORDON_MAX_RUNS);
	__type(key, __u64);
	__type(value, __u64);
} lost SEC(".maps");

/* The event is built once here, then copied into each matching run's ring. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct exec_event);
} scratch SEC(".maps");

static __always_inline int any_watched(void)
{
	for (int level = 0; level < MAX_CGROUP_LEVEL; level++) {
		__u64 id = bpf_get_current_ancestor_cgroup_id(level);
		if (!id)
			return 0;
		if (bpf_map_lookup_elem(&watched, &id))
			return 1;
	}
	return 0;
}

SEC("raw_tp/sched_process_exec")
int on_exec(struct bpf_raw_tracepoint_args *ctx)
{
	if (!any_watched())
		return 0;

	__u32 zero = 0;
	struct exec_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 0;
	/* The buffer is reused: nothing of an earlier exec (another run's) may remain. */
	__builtin_memset(e, 0, sizeof(*e));

	struct task_struct *p = (struct task_struct *)ctx->args[0];
	struct linux_binprm *bprm = (struct linux_binprm *)ctx->args[2];
	e->hdr.ts_ns = bpf_ktime_get_ns();
	e->hdr.cgroup_id = bpf_get_current_cgroup_id();
	e->hdr.kind = EVENT_EXEC;
	e->hdr.pid = BPF_CORE_READ(p, tgid);
	e->ppid = BPF_CORE_READ(p, real_parent, tgid);
	e->old_pid = (__u32)ctx->args[1];

	const char *filename = BPF_CORE_READ(bprm, filename);
	long n = bpf_probe_read_kernel_str(e->filename, sizeof(e->filename), filename);
	e->filename_len = n > 0 ? n - 1 : 0;

	unsigned long start = BPF_CORE_READ(p, mm, arg_start);
	unsigned long end = BPF_CORE_READ(p, mm, arg_end);
	unsigned long total = end > start ? end - start : 0;
	__u32 len = total > EXEC_ARGS_LEN ? EXEC_ARGS_LEN : total;
	e->args_total = total > 0xffffffffUL ? 0xffffffffU : total;
	if (len > 0 && len <= EXEC_ARGS_LEN && bpf_probe_read_user(e->args, len, (void *)start) == 0)
		e->args_len = len;

	/* Every watched ancestor's run gets the event: nested runs each see it. */
	for (int level = 0; level < MAX_CGROUP_LEVEL; level++) {
		__u64 id = bpf_get_current_ancestor_cgroup_id(level);
		if (!id)
			break;
		__u32 *slot = bpf_map_lookup_elem(&watched, &id);
		if (!slot)
			continue;
		e->run = id;
		void *ring = bpf_map_lookup_elem(&rings, slot);
		if (!ring || bpf_ringbuf_output(ring, e, sizeof(*e), 0) != 0) {
			__u64 *count = bpf_map_lookup_elem(&lost, &id);
			if (count)
				__sync_fetch_and_add(count, 1);
		}
	}
	return 0;
}

/* Dual-licensed source; the kernel is told "GPL" so the tracing helpers may be used. */
char LICENSE[] SEC("license") = "GPL";
