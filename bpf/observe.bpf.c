/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only */
/*
 * cordon's host-observed exec events. A BTF tracepoint on sched_process_exec
 * (tp_btf: typed arguments, no tracefs needed) reports every successful exec of
 * a process whose cgroup (v2) is, or lies below, a cgroup in `watched`; the
 * filter runs in the kernel, so other processes never reach the ring buffer.
 * The egress programs of an observed run write their connect events into the
 * same ring buffer, so one consumer sees both in kernel order.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cordon.h"

/*
 * The few kernel fields read, relocated against the running kernel's BTF
 * (CO-RE): offsets here are placeholders the loader rewrites.
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

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

/* cgroup id -> unused; presence means "report this cgroup and its descendants". */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u64);
	__type(value, __u32);
} watched SEC(".maps");

static __always_inline __u64 watched_cgroup(void)
{
	for (int level = 0; level < MAX_CGROUP_LEVEL; level++) {
		__u64 id = bpf_get_current_ancestor_cgroup_id(level);
		if (!id)
			return 0;
		if (bpf_map_lookup_elem(&watched, &id))
			return id;
	}
	return 0;
}

SEC("tp_btf/sched_process_exec")
int on_exec(__u64 *ctx)
{
	struct task_struct *p = (struct task_struct *)ctx[0];
	__u32 old_pid = (__u32)ctx[1];
	struct linux_binprm *bprm = (struct linux_binprm *)ctx[2];

	if (!watched_cgroup())
		return 0;

	struct exec_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		__u32 zero = 0;
		__u64 *n = bpf_map_lookup_elem(&lost, &zero);
		if (n)
			__sync_fetch_and_add(n, 1);
		return 0;
	}
	e->hdr.ts_ns = bpf_ktime_get_ns();
	e->hdr.cgroup_id = bpf_get_current_cgroup_id();
	e->hdr.kind = EVENT_EXEC;
	e->hdr.pid = p->tgid;
	e->ppid = p->real_parent->tgid;
	e->old_pid = old_pid;
	e->_pad = 0;

	long n = bpf_probe_read_kernel_str(e->filename, sizeof(e->filename), bprm->filename);
	e->filename_len = n > 0 ? n - 1 : 0;

	unsigned long start = p->mm->arg_start;
	unsigned long end = p->mm->arg_end;
	unsigned long total = end > start ? end - start : 0;
	__u32 len = total > EXEC_ARGS_LEN ? EXEC_ARGS_LEN : total;
	e->args_total = total > 0xffffffffUL ? 0xffffffffU : total;
	e->args_len = 0;
	if (len > 0 && len <= EXEC_ARGS_LEN && bpf_probe_read_user(e->args, len, (void *)start) == 0)
		e->args_len = len;

	bpf_ringbuf_submit(e, 0);
	return 0;
}

/* Dual-licensed source; the kernel is told "GPL" so the tracing helpers may be used. */
char LICENSE[] SEC("license") = "GPL";
