//! `cordon-bpf-probe`: a helper that cordon-bpf's tests and benchmarks run inside test cgroups.
//! Not part of cordon's interface.
//!
//! ```text
//! cordon-bpf-probe [--cgroup DIR] hold-tcp ADDR       connect, then obey stdin: "send TEXT", "exit"
//! cordon-bpf-probe [--cgroup DIR] raw-icmp IP MARKER  one ICMP echo request by a raw socket
//! cordon-bpf-probe attach-and-wait RUN_ID CGROUP CIDR[:PORT]...  attach egress, print "ready", sleep
//! cordon-bpf-probe observe-and-wait RUN_ID CGROUP CIDR[:PORT]... the same, with an observer too
//! ```
//!
//! `--cgroup DIR` moves the process into that cgroup (v2) first. Results are printed one per
//! line: `ok`, or `err ERRNO`.

use std::io::{BufRead, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::ExitCode;

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn result(r: std::io::Result<()>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => format!("err {}", errno_of(&e)),
    }
}

fn hold_tcp(addr: SocketAddr) -> ExitCode {
    let mut stream = match TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)) {
        Ok(s) => {
            say("ok");
            s
        }
        Err(e) => {
            say(&format!("err {}", errno_of(&e)));
            return ExitCode::SUCCESS;
        }
    };
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if let Some(text) = line.strip_prefix("send ") {
            say(&result(
                stream
                    .write_all(text.as_bytes())
                    .and_then(|_| stream.flush()),
            ));
        } else {
            break;
        }
    }
    ExitCode::SUCCESS
}

fn checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    for pair in data.chunks(2) {
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // The loop above folded the sum into 16 bits.
    !u16::try_from(sum).unwrap_or(u16::MAX)
}

fn raw_icmp(ip: std::net::Ipv4Addr, marker: &str) -> ExitCode {
    // SAFETY: socket(2) with constant arguments; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_ICMP,
        )
    };
    if fd < 0 {
        say(&format!(
            "err {}",
            errno_of(&std::io::Error::last_os_error())
        ));
        return ExitCode::SUCCESS;
    }
    let mut packet = vec![8u8, 0, 0, 0, 0x12, 0x34, 0, 1];
    packet.extend_from_slice(marker.as_bytes());
    let sum = checksum(&packet);
    packet[2..4].copy_from_slice(&sum.to_be_bytes());
    let sin = libc::sockaddr_in {
        sin_family: 2, // AF_INET
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `packet` and `sin` are valid for the lengths given, alive for the call.
    let n = unsafe {
        libc::sendto(
            fd,
            packet.as_ptr().cast(),
            packet.len(),
            0,
            (&sin as *const libc::sockaddr_in).cast(),
            16, // sizeof(struct sockaddr_in)
        )
    };
    if n < 0 {
        say(&format!(
            "err {}",
            errno_of(&std::io::Error::last_os_error())
        ));
    } else {
        say("ok");
    }
    // SAFETY: closing the descriptor opened above, used by nothing else.
    unsafe { libc::close(fd) };
    ExitCode::SUCCESS
}

fn parse_allow(s: &str) -> Option<cordon_bpf::Allow> {
    // CIDR[:PORT], IPv6 in brackets when a port follows: [::1/128]:80
    let (cidr, port) = if let Some(rest) = s.strip_prefix('[') {
        let (c, p) = rest.split_once(']')?;
        (c, p.strip_prefix(':').map(str::parse).transpose().ok()?)
    } else if s.matches(':').count() == 1 {
        let (c, p) = s.split_once(':')?;
        (c, Some(p.parse().ok()?))
    } else {
        (s, None)
    };
    let (net, prefix) = cidr.split_once('/')?;
    Some(cordon_bpf::Allow::new(
        net.parse::<IpAddr>().ok()?,
        prefix.parse().ok()?,
        port,
    ))
}

fn attach_and_wait(run_id: &str, cgroup: &Path, rules: &[String], observe: bool) -> ExitCode {
    let allow: Option<Vec<_>> = rules.iter().map(|r| parse_allow(r)).collect();
    let Some(allow) = allow else {
        eprintln!("cordon-bpf-probe: bad allow rule in {rules:?}");
        return ExitCode::from(2);
    };
    let observer = if observe {
        match cordon_bpf::Observer::attach(run_id, cgroup) {
            Ok(o) => Some(o),
            Err(e) => {
                say(&format!("error {e}"));
                return ExitCode::from(1);
            }
        }
    } else {
        None
    };
    match cordon_bpf::Egress::attach(run_id, cgroup, &allow, observer.as_ref()) {
        Ok(egress) => {
            say("ready");
            // Holds the handles until killed; what must survive the kill is the pins.
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
                let _ = (&egress, &observer);
            }
        }
        Err(e) => {
            say(&format!("error {e}"));
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--cgroup") {
        if args.len() < 2 {
            eprintln!("cordon-bpf-probe: --cgroup needs a directory");
            return ExitCode::from(2);
        }
        let dir = args[1].clone();
        if let Err(e) = std::fs::write(Path::new(&dir).join("cgroup.procs"), "0") {
            eprintln!("cordon-bpf-probe: joining cgroup {dir}: {e}");
            return ExitCode::from(2);
        }
        args.drain(..2);
    }
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["hold-tcp", addr] => match addr.parse() {
            Ok(a) => hold_tcp(a),
            Err(e) => {
                eprintln!("cordon-bpf-probe: {addr}: {e}");
                ExitCode::from(2)
            }
        },
        ["raw-icmp", ip, marker] => match ip.parse() {
            Ok(a) => raw_icmp(a, marker),
            Err(e) => {
                eprintln!("cordon-bpf-probe: {ip}: {e}");
                ExitCode::from(2)
            }
        },
        ["attach-and-wait", run_id, cgroup, rules @ ..] => {
            let rules: Vec<String> = rules.iter().map(|s| (*s).to_owned()).collect();
            attach_and_wait(run_id, Path::new(cgroup), &rules, false)
        }
        ["observe-and-wait", run_id, cgroup, rules @ ..] => {
            let rules: Vec<String> = rules.iter().map(|s| (*s).to_owned()).collect();
            attach_and_wait(run_id, Path::new(cgroup), &rules, true)
        }
        _ => {
            eprintln!(
                "usage: cordon-bpf-probe [--cgroup DIR] hold-tcp ADDR | raw-icmp IP MARKER | attach-and-wait RUN_ID CGROUP CIDR[:PORT]... | observe-and-wait RUN_ID CGROUP CIDR[:PORT]..."
            );
            ExitCode::from(2)
        }
    }
}
