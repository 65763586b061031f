/* SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only */
/*
 * cordon's egress control of a run's cgroup (v2). The programs are loaded once
 * per boot and attached to every run's cgroup; the maps are the run's own:
 *
 * - cgroup/connect4, connect6, sendmsg4, sendmsg6 refuse (EPERM, at once) a
 *   connect() or an addressed sendmsg() to a destination outside the allowlist
 *   (LPM tries `allow4`, `allow6`; an IPv4-mapped IPv6 destination is looked up
 *   in `allow4`; the unspecified address, which Linux connects to the local host,
 *   is looked up as the loopback address), and report each attempt as an event;
 * - cgroup_skb/egress is the backstop: it drops every IP packet whose destination
 *   (and, for TCP and UDP, port) the allowlist does not cover — raw sockets,
 *   sockets older than the programs, anything the address hooks do not see;
 * - with the run's `control[CONTROL_BLOCKED]` set, every hook refuses and both
 *   skb programs drop everything, so established connections stop at their next
 *   packet.
 *
 * Which run an invocation serves comes from the attachment's cgroup storage
 * (`run_of`, see cordon.h), so nested runs each apply their own list. Each run's
 * tries, control and stats are the inner maps at its slot of the map-in-maps
 * below. Missing map entries (and a storage not yet written) count as "deny":
 * the programs fail closed.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "cordon.h"

struct allow4_map {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, CORDON_MAX_PREFIXES);
	/* Sizes, not types: an inner map's struct types reach the BTF only as declarations. */
	__uint(key_size, sizeof(struct key4));
	__uint(value_size, sizeof(struct allow_val));
};

struct allow6_map {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, CORDON_MAX_PREFIXES);
	/* Sizes, not types: an inner map's struct types reach the BTF only as declarations. */
	__uint(key_size, sizeof(struct key6));
	__uint(value_size, sizeof(struct allow_val));
};

struct control_map {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CONTROL_LEN);
	__type(key, __u32);
	__type(value, __u32);
};

struct stats_map {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, STATS_LEN);
	__type(key, __u32);
	__type(value, __u64);
};

struct ring {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, CORDON_RING_BYTES);
};

/* Each attachment's run (cgroup storage shared by the six programs of one cgroup). */
struct {
	__uint(type, BPF_MAP_TYPE_CGROUP_STORAGE);
	__type(key, __u64);
	__type(value, struct run_ref);
} run_of SEC(".maps");

/* Slot -> the run's maps. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, CORDON_MAX_RUNS);
	__type(key, __u32);
	__array(values, struct allow4_map);
} allow4_of SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, CORDON_MAX_RUNS);
	__type(key, __u32);
	__array(values, struct allow6_map);
} allow6_of SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, CORDON_MAX_RUNS);
	__type(key, __u32);
	__array(values, struct control_map);
} control_of SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, CORDON_MAX_RUNS);
	__type(key, __u32);
	__array(values, struct stats_map);
} stats_of SEC(".maps");

/* The observer's maps (the same maps: bound to its pins at load). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, CORDON_MAX_RUNS);
	__type(key, __u32);
	__array(values, struct ring);
} rings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, CORDON_MAX_RUNS);
	__type(key, __u64);
	__type(value, __u32);
} watched SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, CORDON_MAX_RUNS);
	__type(key, __u64);
	__type(value, __u64);
} lost SEC(".maps");

/* The run this invocation serves, read once from the attachment's storage. */
struct run {
	__u32 slot;
	__u32 valid;
	__u64 events;
	void *control;
};

static __always_inline void run_get(struct run *r)
{
	struct run_ref *ref = bpf_get_local_storage(&run_of, 0);
	r->slot = ref->slot;
	r->valid = ref->valid;
	r->events = ref->events;
	/* Not yet (or no longer) named: no maps, so blocked and nothing allowed. */
	r->control = r->valid == 1 ? bpf_map_lookup_elem(&control_of, &r->slot) : 0;
}

static __always_inline void count(const struct run *r, __u32 index)
{
	if (r->valid != 1)
		return;
	void *stats = bpf_map_lookup_elem(&stats_of, &r->slot);
	if (!stats)
		return;
	__u64 *v = bpf_map_lookup_elem(stats, &index);
	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline __u32 control_get(const struct run *r, __u32 index, __u32 missing)
{
	if (!r->control)
		return missing;
	__u32 *v = bpf_map_lookup_elem(r->control, &index);
	return v ? *v : missing;
}

static __always_inline int blocked(const struct run *r)
{
	/* An unreadable control entry (or no run) means blocked. */
	return control_get(r, CONTROL_BLOCKED, 1) != 0;
}

static __always_inline int port_ok(const struct allow_val *v, __u16 port, int has_port)
{
	if (v->any_port)
		return 1;
	if (!has_port)
		return 0;
	__u32 n = v->nports;
	for (int i = 0; i < CORDON_MAX_PORTS; i++) {
		if (i >= n)
			break;
		if (v->ports[i] == port)
			return 1;
	}
	return 0;
}

static __always_inline int allowed4(const struct run *r, __u32 addr_be, __u16 port, int has_port)
{
	if (r->valid != 1)
		return 0;
	void *trie = bpf_map_lookup_elem(&allow4_of, &r->slot);
	if (!trie)
		return 0;
	struct key4 k = { .prefixlen = 32 };
	__builtin_memcpy(k.addr, &addr_be, 4);
	const struct allow_val *v = bpf_map_lookup_elem(trie, &k);
	return v && port_ok(v, port, has_port);
}

static __always_inline int allowed6_key(const struct run *r, const struct key6 *k, __u16 port,
					int has_port)
{
	if (r->valid != 1)
		return 0;
	void *trie = bpf_map_lookup_elem(&allow6_of, &r->slot);
	if (!trie)
		return 0;
	const struct allow_val *v = bpf_map_lookup_elem(trie, k);
	return v && port_ok(v, port, has_port);
}

static __always_inline int allowed6(const struct run *r, const __u32 a[4], __u16 port, int has_port)
{
	struct key6 k = { .prefixlen = 128 };
	__builtin_memcpy(k.addr, a, 16);
	return allowed6_key(r, &k, port, has_port);
}

static __always_inline int is_mapped(const __u32 a[4])
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff);
}

static __always_inline int port_bearing(__u32 protocol)
{
	return protocol == IPPROTO_TCP || protocol == IPPROTO_UDP;
}

static __always_inline void emit(const struct run *r, __u32 hook, __u32 protocol, int allowed,
				 __u16 port, __u8 family, __u8 mapped, const __u32 addr[4])
{
	if (!control_get(r, CONTROL_EMIT_EVENTS, 0) || !r->events)
		return;
	__u32 *slot = bpf_map_lookup_elem(&watched, &r->events);
	void *ring = slot ? bpf_map_lookup_elem(&rings, slot) : 0;
	struct connect_event *e = ring ? bpf_ringbuf_reserve(ring, sizeof(*e), 0) : 0;
	if (!e) {
		__u64 *n = bpf_map_lookup_elem(&lost, &r->events);
		if (n)
			__sync_fetch_and_add(n, 1);
		return;
	}
	e->hdr.ts_ns = bpf_ktime_get_ns();
	e->hdr.cgroup_id = bpf_get_current_cgroup_id();
	e->hdr.kind = EVENT_CONNECT;
	e->hdr.pid = bpf_get_current_pid_tgid() >> 32;
	e->hook = hook;
	e->protocol = protocol;
	e->allowed = allowed;
	e->port = port;
	e->family = family;
	e->mapped = mapped;
	__builtin_memcpy(e->addr, addr, 16);
	e->run = r->events;
	bpf_ringbuf_submit(e, 0);
}

static __always_inline int check4(struct bpf_sock_addr *ctx, __u32 hook)
{
	__u32 addr[4] = { ctx->user_ip4, 0, 0, 0 };
	__u32 protocol = ctx->protocol;
	__u16 port = bpf_ntohs((__u16)ctx->user_port);
	/* connect(0.0.0.0) reaches the local host: judge it as 127.0.0.1. */
	__u32 judged = addr[0] ? addr[0] : bpf_htonl(0x7f000001);
	struct run r;
	run_get(&r);
	int ok = !blocked(&r) && allowed4(&r, judged, port, port_bearing(protocol));
	count(&r, ok ? STAT_CONNECT_ALLOWED : STAT_CONNECT_REFUSED);
	emit(&r, hook, protocol, ok, port, 4, 0, addr);
	return ok;
}

static __always_inline int check6(struct bpf_sock_addr *ctx, __u32 hook)
{
	__u32 addr[4];
	addr[0] = ctx->user_ip6[0];
	addr[1] = ctx->user_ip6[1];
	addr[2] = ctx->user_ip6[2];
	addr[3] = ctx->user_ip6[3];
	__u32 protocol = ctx->protocol;
	__u16 port = bpf_ntohs((__u16)ctx->user_port);
	int has_port = port_bearing(protocol);
	int mapped = is_mapped(addr);
	int ok = 0;
	struct run r;
	run_get(&r);
	if (!blocked(&r)) {
		if (mapped) {
			__u32 v4 = addr[3] ? addr[3] : bpf_htonl(0x7f000001);
			ok = allowed4(&r, v4, port, has_port);
		} else if (!(addr[0] | addr[1] | addr[2] | addr[3])) {
			/* connect(::) reaches the local host: judge it as ::1 (built in
			 * place: the object has no constant data, see tags.rs). */
			struct key6 lo = { .prefixlen = 128 };
			lo.addr[15] = 1;
			ok = allowed6_key(&r, &lo, port, has_port);
		} else {
			ok = allowed6(&r, addr, port, has_port);
		}
	}
	count(&r, ok ? STAT_CONNECT_ALLOWED : STAT_CONNECT_REFUSED);
	emit(&r, hook, protocol, ok, port, 6, mapped, addr);
	return ok;
}

SEC("cgroup/connect4")
int connect4(struct bpf_sock_addr *ctx)
{
	return check4(ctx, HOOK_CONNECT4);
}

SEC("cgroup/connect6")
int connect6(struct bpf_sock_addr *ctx)
{
	return check6(ctx, HOOK_CONNECT6);
}

SEC("cgroup/sendmsg4")
int sendmsg4(struct bpf_sock_addr *ctx)
{
	return check4(ctx, HOOK_SENDMSG4);
}

SEC("cgroup/sendmsg6")
int sendmsg6(struct bpf_sock_addr *ctx)
{
	return check6(ctx, HOOK_SENDMSG6);
}

/* The destination port of a TCP or UDP header at `off`, if there is one. */
static __always_inline int load_port(struct __sk_buff *skb, __u32 off, __u16 *port)
{
	__u16 p;
	if (bpf_skb_load_bytes(skb, off + 2, &p, sizeof(p)) < 0)
		return 0;
	*port = bpf_ntohs(p);
	return 1;
}

static __always_inline int skb_allowed(const struct run *r, struct __sk_buff *skb)
{
	__u16 port = 0;
	int has_port = 0;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		__u8 h[20];
		if (bpf_skb_load_bytes(skb, 0, h, sizeof(h)) < 0)
			return 0;
		__u32 ihl = (h[0] & 0x0f) * 4;
		__u8 proto = h[9];
		/* Fragments after the first carry no transport header. */
		int later_fragment = ((h[6] & 0x1f) | h[7]) != 0;
		__u32 daddr;
		__builtin_memcpy(&daddr, &h[16], 4);
		if (!later_fragment && port_bearing(proto) && ihl >= 20)
			has_port = load_port(skb, ihl, &port);
		return allowed4(r, daddr, port, has_port);
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		__u8 h[40];
		if (bpf_skb_load_bytes(skb, 0, h, sizeof(h)) < 0)
			return 0;
		__u8 next = h[6];
		__u32 daddr[4];
		__builtin_memcpy(daddr, &h[24], 16);
		/* Extension headers are not walked: such packets have no port. */
		if (port_bearing(next))
			has_port = load_port(skb, 40, &port);
		if (is_mapped(daddr))
			return allowed4(r, daddr[3], port, has_port);
		return allowed6(r, daddr, port, has_port);
	}
	return 0;
}

SEC("cgroup_skb/egress")
int skb_egress(struct __sk_buff *skb)
{
	struct run r;
	run_get(&r);
	if (blocked(&r) || !skb_allowed(&r, skb)) {
		count(&r, STAT_SKB_EGRESS_DROPPED);
		return 0;
	}
	return 1;
}

SEC("cgroup_skb/ingress")
int skb_ingress(struct __sk_buff *skb)
{
	struct run r;
	run_get(&r);
	if (blocked(&r)) {
		count(&r, STAT_SKB_INGRESS_DROPPED);
		return 0;
	}
	return 1;
}

/* Dual-licensed source; the kernel is told "GPL" so the ring buffer helpers may be used. */
char LICENSE[] SEC("license") = "GPL";
