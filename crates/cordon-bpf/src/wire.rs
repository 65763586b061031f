//! The byte layouts shared with the C programs (`bpf/cordon.h`), encoded and decoded by hand
//! so that no `unsafe` cast is needed: allowlist values and the events of the ring buffer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `CORDON_MAX_PORTS`.
pub const MAX_PORTS: usize = 16;
/// `CORDON_MAX_PREFIXES`.
pub const MAX_PREFIXES: usize = 1024;
/// A size known at compile time as `u32` (sizes here are at most a few kilobytes; a larger one
/// fails to compile where the result is a constant).
pub(crate) const fn size_u32(n: usize) -> u32 {
    assert!(n <= u32::MAX as usize);
    #[allow(clippy::cast_possible_truncation)]
    let n = n as u32;
    n
}

/// `CORDON_MAX_RUNS`: entries of the shared maps keyed by cgroup id.
pub const MAX_RUNS: u32 = 4096;
/// `CORDON_RING_BYTES`: each observed run's ring buffer.
pub const RING_BYTES: u32 = 1 << 20;
/// `CONTROL_LEN`.
pub const CONTROL_LEN: u32 = 2;
/// `STATS_LEN`.
pub const STATS_LEN: u32 = 4;
/// `sizeof(struct allow_val)`.
pub const ALLOW_VAL_LEN: usize = 8 + 2 * MAX_PORTS;

/// `CONTROL_BLOCKED`.
pub const CONTROL_BLOCKED: u32 = 0;
/// `CONTROL_EMIT_EVENTS`.
pub const CONTROL_EMIT_EVENTS: u32 = 1;

/// `STAT_*` indices.
pub const STAT_CONNECT_ALLOWED: u32 = 0;
/// `STAT_CONNECT_REFUSED`.
pub const STAT_CONNECT_REFUSED: u32 = 1;
/// `STAT_SKB_EGRESS_DROPPED`.
pub const STAT_SKB_EGRESS_DROPPED: u32 = 2;
/// `STAT_SKB_INGRESS_DROPPED`.
pub const STAT_SKB_INGRESS_DROPPED: u32 = 3;

const EVENT_EXEC: u32 = 1;
const EVENT_CONNECT: u32 = 2;
const HDR_LEN: usize = 24;
const EXEC_FILENAME_LEN: usize = 256;
const EXEC_ARGS_LEN: usize = 128;
/// `sizeof(struct exec_event)`.
pub const EXEC_EVENT_LEN: usize = HDR_LEN + 24 + EXEC_FILENAME_LEN + EXEC_ARGS_LEN;
/// `sizeof(struct connect_event)`.
pub const CONNECT_EVENT_LEN: usize = HDR_LEN + 16 + 16;
/// `offsetof(struct exec_event, run)`: the decoded part ends here.
const EXEC_RUN_OFF: usize = EXEC_EVENT_LEN;
/// `offsetof(struct connect_event, run)`.
const CONNECT_RUN_OFF: usize = CONNECT_EVENT_LEN;

/// The cgroup id a record was delivered for (the `run` field after each event's layout): the
/// watched cgroup whose ring buffer the program wrote it to. A ring buffer's slot is reused by
/// later runs; a reader keeps only the records marked with its own cgroup. `None` for a record
/// too short to carry it.
pub fn record_run(b: &[u8]) -> Option<u64> {
    let off = match b
        .get(16..20)
        .map(|k| u32::from_ne_bytes([k[0], k[1], k[2], k[3]]))?
    {
        EVENT_EXEC => EXEC_RUN_OFF,
        EVENT_CONNECT => CONNECT_RUN_OFF,
        _ => return None,
    };
    let r = b.get(off..off + 8)?;
    Some(u64_at(r, 0))
}

/// What one allowlist prefix permits: every port, or the listed ones.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AllowVal {
    /// Every port.
    pub any_port: bool,
    /// The ports, sorted and unique (ignored when `any_port`).
    pub ports: Vec<u16>,
}

impl AllowVal {
    /// The `struct allow_val` bytes.
    pub fn encode(&self) -> [u8; ALLOW_VAL_LEN] {
        let mut out = [0u8; ALLOW_VAL_LEN];
        out[0..4].copy_from_slice(&u32::from(self.any_port).to_ne_bytes());
        let n = if self.any_port {
            0
        } else {
            self.ports.len().min(MAX_PORTS)
        };
        // n ≤ MAX_PORTS (16).
        out[4..8].copy_from_slice(&u32::try_from(n).unwrap_or(0).to_ne_bytes());
        for (i, p) in self.ports.iter().take(n).enumerate() {
            out[8 + 2 * i..10 + 2 * i].copy_from_slice(&p.to_ne_bytes());
        }
        out
    }

    /// Parses `struct allow_val` bytes.
    pub fn decode(b: &[u8; ALLOW_VAL_LEN]) -> AllowVal {
        let any_port = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) != 0;
        let n = (u32::from_ne_bytes([b[4], b[5], b[6], b[7]]) as usize).min(MAX_PORTS);
        let ports = (0..n)
            .map(|i| u16::from_ne_bytes([b[8 + 2 * i], b[9 + 2 * i]]))
            .collect();
        AllowVal { any_port, ports }
    }
}

/// Which hook saw a connection attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    /// `connect()` on an IPv4 socket.
    Connect4,
    /// `connect()` on an IPv6 socket.
    Connect6,
    /// `sendmsg()`/`sendto()` with an address on an IPv4 UDP socket.
    Sendmsg4,
    /// The same on an IPv6 UDP socket.
    Sendmsg6,
}

impl Hook {
    /// `connect4`, `connect6`, `sendmsg4`, `sendmsg6`.
    pub fn name(self) -> &'static str {
        match self {
            Hook::Connect4 => "connect4",
            Hook::Connect6 => "connect6",
            Hook::Sendmsg4 => "sendmsg4",
            Hook::Sendmsg6 => "sendmsg6",
        }
    }
}

/// An event observed by the kernel for a process of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A successful `execve`.
    Exec(ExecEvent),
    /// A connection attempt (connect, or an addressed UDP send).
    Connect(ConnectEvent),
}

impl Event {
    /// The kernel's timestamp (`CLOCK_MONOTONIC`, ns).
    pub fn ts_ns(&self) -> u64 {
        match self {
            Event::Exec(e) => e.ts_ns,
            Event::Connect(e) => e.ts_ns,
        }
    }

    /// The process (thread group id, as the host sees it).
    pub fn pid(&self) -> u32 {
        match self {
            Event::Exec(e) => e.pid,
            Event::Connect(e) => e.pid,
        }
    }
}

/// One exec, as `sched_process_exec` saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecEvent {
    /// Kernel timestamp, `CLOCK_MONOTONIC` ns.
    pub ts_ns: u64,
    /// The cgroup (v2) id of the process.
    pub cgroup_id: u64,
    /// Its pid.
    pub pid: u32,
    /// Its real parent's pid.
    pub ppid: u32,
    /// The thread id that called execve (differs from `pid` when a non-leader thread did).
    pub old_pid: u32,
    /// The path given to execve (at most 255 bytes; lossy UTF-8).
    pub filename: String,
    /// The first arguments (argv\[0\] included), from the first 128 bytes of the argument area.
    pub argv: Vec<String>,
    /// Whether the argument area was longer than what `argv` shows.
    pub argv_truncated: bool,
}

/// One connection attempt, as the egress hooks judged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectEvent {
    /// Kernel timestamp, `CLOCK_MONOTONIC` ns.
    pub ts_ns: u64,
    /// The cgroup (v2) id of the process.
    pub cgroup_id: u64,
    /// Its pid.
    pub pid: u32,
    /// The hook.
    pub hook: Hook,
    /// `IPPROTO_*` of the socket (6 TCP, 17 UDP).
    pub protocol: u32,
    /// The destination as given (an IPv4-mapped address stays IPv6 here).
    pub dest: IpAddr,
    /// The destination port.
    pub port: u16,
    /// Whether the destination was an IPv4-mapped IPv6 address (judged by the IPv4 list).
    pub mapped: bool,
    /// Whether it was allowed.
    pub allowed: bool,
}

/// Why a ring buffer record could not be read as an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than its kind's layout.
    #[error("event record of {len} bytes is too short for kind {kind}")]
    Short {
        /// The kind field.
        kind: u32,
        /// Its length.
        len: usize,
    },
    /// An unknown kind or hook number.
    #[error("unknown event kind {kind} / hook {hook}")]
    Unknown {
        /// The kind field.
        kind: u32,
        /// The hook field (0 for exec records).
        hook: u32,
    },
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_ne_bytes(a)
}

/// Decodes one ring buffer record.
pub fn decode(b: &[u8]) -> Result<Event, DecodeError> {
    if b.len() < HDR_LEN {
        return Err(DecodeError::Short {
            kind: 0,
            len: b.len(),
        });
    }
    let ts_ns = u64_at(b, 0);
    let cgroup_id = u64_at(b, 8);
    let kind = u32_at(b, 16);
    let pid = u32_at(b, 20);
    match kind {
        EVENT_EXEC => {
            if b.len() < EXEC_EVENT_LEN {
                return Err(DecodeError::Short { kind, len: b.len() });
            }
            let ppid = u32_at(b, 24);
            let old_pid = u32_at(b, 28);
            let filename_len = (u32_at(b, 32) as usize).min(EXEC_FILENAME_LEN - 1);
            let args_len = (u32_at(b, 36) as usize).min(EXEC_ARGS_LEN);
            let args_total = u32_at(b, 40) as usize;
            let fname_off = 48;
            let args_off = fname_off + EXEC_FILENAME_LEN;
            let filename =
                String::from_utf8_lossy(&b[fname_off..fname_off + filename_len]).into_owned();
            let area = &b[args_off..args_off + args_len];
            let mut argv: Vec<String> = area
                .split(|&c| c == 0)
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect();
            // A complete area ends with NUL, which leaves one empty piece behind.
            if area.last() == Some(&0) {
                argv.pop();
            }
            Ok(Event::Exec(ExecEvent {
                ts_ns,
                cgroup_id,
                pid,
                ppid,
                old_pid,
                filename,
                argv,
                argv_truncated: args_total > args_len,
            }))
        }
        EVENT_CONNECT => {
            if b.len() < CONNECT_EVENT_LEN {
                return Err(DecodeError::Short { kind, len: b.len() });
            }
            let hook_n = u32_at(b, 24);
            let hook = match hook_n {
                1 => Hook::Connect4,
                2 => Hook::Connect6,
                3 => Hook::Sendmsg4,
                4 => Hook::Sendmsg6,
                _ => return Err(DecodeError::Unknown { kind, hook: hook_n }),
            };
            let protocol = u32_at(b, 28);
            let allowed = u32_at(b, 32) != 0;
            let port = u16::from_ne_bytes([b[36], b[37]]);
            let family = b[38];
            let mapped = b[39] != 0;
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[40..56]);
            let dest = if family == 4 {
                IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))
            } else {
                IpAddr::V6(Ipv6Addr::from(a))
            };
            Ok(Event::Connect(ConnectEvent {
                ts_ns,
                cgroup_id,
                pid,
                hook,
                protocol,
                dest,
                port,
                mapped,
                allowed,
            }))
        }
        _ => Err(DecodeError::Unknown { kind, hook: 0 }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_val_round_trips() {
        let v = AllowVal {
            any_port: false,
            ports: vec![22, 443, 8080],
        };
        assert_eq!(AllowVal::decode(&v.encode()), v);
        let any = AllowVal {
            any_port: true,
            ports: vec![],
        };
        assert_eq!(AllowVal::decode(&any.encode()), any);
    }

    fn exec_record(args: &[u8], total: u32) -> Vec<u8> {
        let mut b = vec![0u8; EXEC_EVENT_LEN];
        b[0..8].copy_from_slice(&7u64.to_ne_bytes());
        b[8..16].copy_from_slice(&99u64.to_ne_bytes());
        b[16..20].copy_from_slice(&EVENT_EXEC.to_ne_bytes());
        b[20..24].copy_from_slice(&1234u32.to_ne_bytes());
        b[24..28].copy_from_slice(&1000u32.to_ne_bytes());
        b[28..32].copy_from_slice(&1235u32.to_ne_bytes());
        let name = b"/bin/true";
        b[32..36].copy_from_slice(&u32::try_from(name.len()).unwrap().to_ne_bytes());
        b[36..40].copy_from_slice(&u32::try_from(args.len()).unwrap().to_ne_bytes());
        b[40..44].copy_from_slice(&total.to_ne_bytes());
        b[48..48 + name.len()].copy_from_slice(name);
        b[304..304 + args.len()].copy_from_slice(args);
        b
    }

    #[test]
    fn exec_records_decode() {
        let Event::Exec(e) = decode(&exec_record(b"true\0-x\0", 8)).unwrap() else {
            panic!("not an exec event")
        };
        assert_eq!(
            (e.ts_ns, e.cgroup_id, e.pid, e.ppid, e.old_pid),
            (7, 99, 1234, 1000, 1235)
        );
        assert_eq!(e.filename, "/bin/true");
        assert_eq!(e.argv, ["true", "-x"]);
        assert!(!e.argv_truncated);

        let Event::Exec(cut) = decode(&exec_record(b"long\0argumen", 300)).unwrap() else {
            panic!("not an exec event")
        };
        assert_eq!(cut.argv, ["long", "argumen"]);
        assert!(cut.argv_truncated);
    }

    #[test]
    fn connect_records_decode() {
        let mut b = vec![0u8; CONNECT_EVENT_LEN];
        b[16..20].copy_from_slice(&EVENT_CONNECT.to_ne_bytes());
        b[20..24].copy_from_slice(&5u32.to_ne_bytes());
        b[24..28].copy_from_slice(&2u32.to_ne_bytes());
        b[28..32].copy_from_slice(&6u32.to_ne_bytes());
        b[36..38].copy_from_slice(&443u16.to_ne_bytes());
        b[38] = 6;
        b[39] = 1;
        b[40..56].copy_from_slice(&"::ffff:192.0.2.1".parse::<Ipv6Addr>().unwrap().octets());
        let Event::Connect(e) = decode(&b).unwrap() else {
            panic!("not a connect event")
        };
        assert_eq!(e.hook, Hook::Connect6);
        assert!(e.mapped && !e.allowed);
        assert_eq!(e.port, 443);
        assert_eq!(e.dest.to_string(), "::ffff:192.0.2.1");
    }

    #[test]
    fn the_delivery_mark_follows_each_layout() {
        let mut exec = exec_record(b"true\0", 5);
        assert_eq!(record_run(&exec), None);
        exec.extend_from_slice(&42u64.to_ne_bytes());
        assert_eq!(record_run(&exec), Some(42));
        assert!(decode(&exec).is_ok());
        let mut connect = vec![0u8; CONNECT_EVENT_LEN];
        connect[16..20].copy_from_slice(&EVENT_CONNECT.to_ne_bytes());
        connect[24..28].copy_from_slice(&1u32.to_ne_bytes());
        connect.extend_from_slice(&7u64.to_ne_bytes());
        assert_eq!(record_run(&connect), Some(7));
        assert!(decode(&connect).is_ok());
        assert_eq!(record_run(&[0u8; 8]), None);
    }

    #[test]
    fn damaged_records_are_errors() {
        assert!(matches!(decode(&[0u8; 10]), Err(DecodeError::Short { .. })));
        let mut b = vec![0u8; CONNECT_EVENT_LEN];
        b[16..20].copy_from_slice(&EVENT_CONNECT.to_ne_bytes());
        b[24..28].copy_from_slice(&9u32.to_ne_bytes());
        assert_eq!(
            decode(&b),
            Err(DecodeError::Unknown {
                kind: EVENT_CONNECT,
                hook: 9
            })
        );
        assert!(matches!(
            decode(&b[..30]),
            Err(DecodeError::Short { kind: 2, .. })
        ));
    }
}
