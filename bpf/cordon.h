/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only */
/*
 * Shared definitions of cordon's eBPF programs and the Rust loader
 * (crates/cordon-bpf/src/wire.rs mirrors every layout here; a change on one side
 * needs the same change on the other, and the loader's tests catch a mismatch).
 */
#ifndef CORDON_BPF_H
#define CORDON_BPF_H

#include <linux/types.h>

/* Most ports one allowlist prefix can carry (after merging the rules that cover it). */
#define CORDON_MAX_PORTS 16
/* Most prefixes per address family. */
#define CORDON_MAX_PREFIXES 1024
/* Most runs at once on one boot: entries of the shared maps keyed by cgroup id. */
#define CORDON_MAX_RUNS 4096
/* Bytes of each observed run's ring buffer. */
#define CORDON_RING_BYTES (1 << 20)

/* Indices of the `control` array (u32 values). Block-all is one write of index 0. */
#define CONTROL_BLOCKED 0
#define CONTROL_EMIT_EVENTS 1
#define CONTROL_LEN 2

/* Indices of the `stats` array (u64 counters). */
#define STAT_CONNECT_ALLOWED 0
#define STAT_CONNECT_REFUSED 1
#define STAT_SKB_EGRESS_DROPPED 2
#define STAT_SKB_INGRESS_DROPPED 3
#define STATS_LEN 4

/*
 * Runs plug their own maps into the shared programs through slots: each map-in-maps
 * (ARRAY_OF_MAPS, one entry per slot) holds, at a run's slot, the maps that run
 * uses. Slots are created once and reused by later runs, because every update of a
 * map-in-maps from user space waits for an RCU grace period (milliseconds), which a
 * run must not pay.
 *
 * The egress programs are loaded once per boot and attached to every run's cgroup;
 * each attachment's cgroup storage (`run_of`, shared by the six programs of one
 * cgroup) says which run it serves: `slot` holds that run's maps, and is valid only
 * when `valid` is 1 (a new storage is zero: it matches no run, so everything is
 * refused); `events` is the cgroup id of the observer whose ring buffer gets its
 * connect events (0: none).
 */
struct run_ref {
	__u32 slot;
	__u32 valid;
	__u64 events;
};

/* LPM trie keys: prefix length in bits, then the address in network order. */
struct key4 {
	__u32 prefixlen;
	__u8 addr[4];
};

struct key6 {
	__u32 prefixlen;
	__u8 addr[16];
};

/* What an allowlist prefix permits: every port, or the listed ones (host order). */
struct allow_val {
	__u32 any_port;
	__u32 nports;
	__u16 ports[CORDON_MAX_PORTS];
};

/* Event kinds. */
#define EVENT_EXEC 1
#define EVENT_CONNECT 2

/* Hooks that report connection attempts. */
#define HOOK_CONNECT4 1
#define HOOK_CONNECT6 2
#define HOOK_SENDMSG4 3
#define HOOK_SENDMSG6 4

#define EXEC_FILENAME_LEN 256
#define EXEC_ARGS_LEN 128

struct event_hdr {
	__u64 ts_ns;     /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u64 cgroup_id; /* the cgroup v2 id of the process */
	__u32 kind;      /* EVENT_* */
	__u32 pid;       /* thread group id */
};

struct exec_event {
	struct event_hdr hdr;
	__u32 ppid;         /* real parent's thread group id */
	__u32 old_pid;      /* the thread id that called execve */
	__u32 filename_len; /* bytes in filename, without the NUL; 0 if unreadable */
	__u32 args_len;     /* bytes of argv copied (NUL-separated, may be cut) */
	__u32 args_total;   /* bytes of argv the process has */
	__u32 _pad;
	char filename[EXEC_FILENAME_LEN];
	char args[EXEC_ARGS_LEN];
	__u64 run; /* the watched cgroup whose ring buffer this copy went to */
};

struct connect_event {
	struct event_hdr hdr;
	__u32 hook;     /* HOOK_* */
	__u32 protocol; /* IPPROTO_TCP, IPPROTO_UDP, ... */
	__u32 allowed;  /* 1 allowed, 0 refused */
	__u16 port;     /* host order */
	__u8 family;    /* 4 or 6 (as given to the hook) */
	__u8 mapped;    /* 1: an IPv4-mapped IPv6 address, checked against the IPv4 list */
	__u8 addr[16];  /* network order; IPv4 in the first 4 bytes */
	__u64 run;      /* the watched cgroup whose ring buffer this went to */
};

#endif
