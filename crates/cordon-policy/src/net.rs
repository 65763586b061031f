//! Network destinations: CIDR blocks and host names, each with an optional
//! port, as written in `[network] allow` and in `--net allow:…`.
//!
//! Syntax of one destination ([`NetDest::parse`]):
//!
//! | written | means |
//! |---|---|
//! | `10.1.2.0/24` | every address in the block, any port |
//! | `10.1.2.7` | that address (a `/32`), any port |
//! | `10.1.2.0/24:443` | the block, port 443 only |
//! | `2001:db8::/32` | an IPv6 block, any port |
//! | `[2001:db8::/32]:443`, `[2001:db8::1]:443` | IPv6 with a port (brackets needed) |
//! | `api.example.com:443` | that host name, port 443 |
//! | `api.example.com` | that host name, any port |
//!
//! A block must be written by its network address: `10.1.2.3/24` is refused
//! with the suggestion `10.1.2.0/24`, because a reader cannot tell which of the
//! two the author meant. Host names are kept as written (lower-cased, without
//! a trailing dot): this crate does no I/O, so it never resolves them. The run
//! layer decides at launch whether it resolves a name or refuses it.
//!
//! IPv4 and IPv6 are separate address families here: `::ffff:10.0.0.1` is not
//! inside `10.0.0.0/8`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why a network destination or `--net` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// [`NetDest::parse`] refused a destination.
    #[error("invalid network destination {input:?}: {reason}")]
    ParseDest {
        /// The text as given.
        input: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
    /// [`NetMode::parse`] or [`parse_net_flag`] refused a mode.
    #[error("invalid network mode {input:?} (use none, host or allow:CIDR[,CIDR...])")]
    ParseMode {
        /// The text as given.
        input: String,
    },
    /// `allow:` was given with nothing after it.
    #[error("empty allow list in {input:?} (name at least one destination, e.g. allow:10.0.0.0/8)")]
    EmptyAllow {
        /// The text as given.
        input: String,
    },
    /// An allow list contains a block covering every address without the
    /// explicit acknowledgement.
    #[error(
        "{dest} allows every address: that is no network boundary at all (use --net host if you mean it, or name the destinations)"
    )]
    Everything {
        /// The offending destination.
        dest: NetDest,
    },
}

/// How a run reaches the network.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum NetMode {
    /// No network at all (the default).
    #[default]
    None,
    /// The host's network, uncontained.
    Host,
    /// Only the destinations in the allow list.
    Allow,
}

impl NetMode {
    /// The mode's name as written in a policy file.
    pub fn as_str(self) -> &'static str {
        match self {
            NetMode::None => "none",
            NetMode::Host => "host",
            NetMode::Allow => "allow",
        }
    }

    /// Parses `none`, `host` or `allow`.
    pub fn parse(input: &str) -> Result<Self, NetError> {
        match input {
            "none" => Ok(NetMode::None),
            "host" => Ok(NetMode::Host),
            "allow" => Ok(NetMode::Allow),
            _ => Err(NetError::ParseMode {
                input: input.to_owned(),
            }),
        }
    }
}

impl fmt::Display for NetMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An IP block: an address family, a network address and a prefix length.
/// Always normalized (host bits zero), so equal blocks compare equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// The block of `addr/prefix`, or `None` when the prefix is longer than
    /// the family allows or `addr` has host bits set.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        let cidr = Cidr { addr, prefix };
        (prefix <= cidr.max_prefix() && cidr.masked(addr) == addr).then_some(cidr)
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length in bits.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether this block covers every address of its family (`0.0.0.0/0`,
    /// `::/0`).
    pub fn is_everything(&self) -> bool {
        self.prefix == 0
    }

    fn max_prefix(&self) -> u8 {
        match self.addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        }
    }

    fn masked(&self, addr: IpAddr) -> IpAddr {
        match addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        }
    }

    /// Whether `addr` lies in this block.
    pub fn contains_addr(&self, addr: IpAddr) -> bool {
        addr.is_ipv4() == self.addr.is_ipv4() && self.masked(addr) == self.addr
    }

    /// Whether every address of `other` lies in this block.
    pub fn contains(&self, other: &Cidr) -> bool {
        other.prefix >= self.prefix && self.contains_addr(other.addr)
    }

    /// The addresses in both blocks. Two blocks are either nested or disjoint,
    /// so the intersection is the smaller block or nothing.
    pub fn intersect(&self, other: &Cidr) -> Option<Cidr> {
        if self.contains(other) {
            Some(*other)
        } else if other.contains(self) {
            Some(*self)
        } else {
            None
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Where a network connection may go: an IP block or a host name, with an
/// optional port (`None` = any port). See the [module docs](self) for the
/// syntax.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NetDest {
    /// An IP block.
    Cidr {
        /// The block.
        net: Cidr,
        /// The port, or `None` for any.
        port: Option<u16>,
    },
    /// A host name, lower-cased, unresolved.
    Host {
        /// The name.
        name: String,
        /// The port, or `None` for any.
        port: Option<u16>,
    },
}

impl NetDest {
    /// Parses one destination; see the [module docs](self).
    pub fn parse(input: &str) -> Result<Self, NetError> {
        let fail = |reason: String| NetError::ParseDest {
            input: input.to_owned(),
            reason,
        };
        let text = input.trim();
        if text.is_empty() {
            return Err(fail(
                "empty (write e.g. \"10.0.0.0/8\" or \"api.example.com:443\")".into(),
            ));
        }
        // Split off the port.
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let Some((inside, after)) = rest.split_once(']') else {
                return Err(fail(
                    "missing ']' (write e.g. \"[2001:db8::1]:443\")".into(),
                ));
            };
            let port = match after {
                "" => None,
                p => match p.strip_prefix(':') {
                    Some(p) => Some(p),
                    None => return Err(fail(format!("unexpected {p:?} after ']'"))),
                },
            };
            (inside, port)
        } else if text.matches(':').count() >= 2 {
            // Bare IPv6: no port possible without brackets.
            (text, None)
        } else {
            match text.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (text, None),
            }
        };
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(0) | Err(_) => {
                    return Err(fail(format!("port {p:?} is not a number from 1 to 65535")));
                }
                Ok(p) => Some(p),
            },
        };
        if host.is_empty() {
            return Err(fail("missing address or host name before the port".into()));
        }
        // An IP block or address?
        let (addr_text, prefix_text) = match host.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (host, None),
        };
        if let Ok(addr) = IpAddr::from_str(addr_text) {
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let prefix = match prefix_text {
                None => max,
                Some(p) if addr.is_ipv6() && p.contains(':') => {
                    let (len, port) = p.split_once(':').unwrap_or((p, ""));
                    return Err(fail(format!(
                        "an IPv6 block with a port needs brackets (write \"[{addr_text}/{len}]:{port}\")"
                    )));
                }
                Some(p) => match p.parse::<u8>() {
                    Ok(p) if p <= max => p,
                    _ => {
                        return Err(fail(format!(
                            "prefix length {p:?} is not a number from 0 to {max}"
                        )));
                    }
                },
            };
            let probe = Cidr { addr, prefix };
            let network = probe.masked(addr);
            if network != addr {
                let port_suffix = match port {
                    Some(p) if addr.is_ipv6() => {
                        return Err(fail(format!(
                            "host bits are set (did you mean \"[{network}/{prefix}]:{p}\"?)"
                        )));
                    }
                    Some(p) => format!(":{p}"),
                    None => String::new(),
                };
                return Err(fail(format!(
                    "host bits are set (did you mean \"{network}/{prefix}{port_suffix}\"?)"
                )));
            }
            return Ok(NetDest::Cidr {
                net: Cidr { addr, prefix },
                port,
            });
        }
        if prefix_text.is_some() || addr_text.chars().all(|c| c.is_ascii_digit() || c == '.') {
            return Err(fail("not a valid IP address or block".into()));
        }
        let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
        validate_host_name(&name).map_err(fail)?;
        Ok(NetDest::Host { name, port })
    }

    /// The port, or `None` for any port.
    pub fn port(&self) -> Option<u16> {
        match self {
            NetDest::Cidr { port, .. } | NetDest::Host { port, .. } => *port,
        }
    }

    /// Whether this destination lets a connection reach every address of a
    /// family (a `/0` block).
    pub fn is_everything(&self) -> bool {
        matches!(self, NetDest::Cidr { net, .. } if net.is_everything())
    }

    /// Whether every connection `other` admits is admitted by `self`.
    pub fn contains(&self, other: &NetDest) -> bool {
        let port_ok = match (self.port(), other.port()) {
            (None, _) => true,
            (Some(a), Some(b)) => a == b,
            (Some(_), None) => false,
        };
        port_ok
            && match (self, other) {
                (NetDest::Cidr { net: a, .. }, NetDest::Cidr { net: b, .. }) => a.contains(b),
                (NetDest::Host { name: a, .. }, NetDest::Host { name: b, .. }) => a == b,
                _ => false,
            }
    }

    /// The connections both admit, or `None` if there are none. Host names
    /// and IP blocks never intersect (this crate does not resolve names).
    pub fn intersect(&self, other: &NetDest) -> Option<NetDest> {
        let port = match (self.port(), other.port()) {
            (None, p) | (p, None) => p,
            (Some(a), Some(b)) if a == b => Some(a),
            _ => return None,
        };
        match (self, other) {
            (NetDest::Cidr { net: a, .. }, NetDest::Cidr { net: b, .. }) => {
                a.intersect(b).map(|net| NetDest::Cidr { net, port })
            }
            (NetDest::Host { name: a, .. }, NetDest::Host { name: b, .. }) if a == b => {
                Some(NetDest::Host {
                    name: a.clone(),
                    port,
                })
            }
            _ => None,
        }
    }
}

fn validate_host_name(name: &str) -> Result<(), String> {
    if name.len() > 253 {
        return Err("host name longer than 253 characters".into());
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("empty label in host name (two dots in a row?)".into());
        }
        if label.len() > 63 {
            return Err(format!(
                "host name label {label:?} is longer than 63 characters"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("host name label {label:?} starts or ends with '-'"));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            return Err(format!(
                "{c:?} is not allowed in a host name (write an IP block like \"10.0.0.0/8\" or a name like \"api.example.com:443\")"
            ));
        }
    }
    Ok(())
}

impl fmt::Display for NetDest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetDest::Cidr { net, port: None } => write!(f, "{net}"),
            NetDest::Cidr { net, port: Some(p) } => {
                if net.addr.is_ipv6() {
                    write!(f, "[{net}]:{p}")
                } else {
                    write!(f, "{net}:{p}")
                }
            }
            NetDest::Host { name, port: None } => f.write_str(name),
            NetDest::Host {
                name,
                port: Some(p),
            } => write!(f, "{name}:{p}"),
        }
    }
}

impl FromStr for NetDest {
    type Err = NetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        NetDest::parse(s)
    }
}

impl Serialize for NetDest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for NetDest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        NetDest::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Parses the value of `cordon run --net`: `none`, `host` or
/// `allow:DEST[,DEST...]`. A `/0` block is refused here: on the command line
/// there is no `i_understand`; `--net host` says the same thing plainly.
///
/// ```
/// use cordon_policy::net::{parse_net_flag, NetMode};
/// let (mode, allow) = parse_net_flag("allow:10.1.2.0/24,api.example.com:443").unwrap();
/// assert_eq!(mode, NetMode::Allow);
/// assert_eq!(allow.len(), 2);
/// assert!(parse_net_flag("allow:0.0.0.0/0").is_err());
/// ```
pub fn parse_net_flag(input: &str) -> Result<(NetMode, Vec<NetDest>), NetError> {
    match input.split_once(':') {
        None => match NetMode::parse(input)? {
            NetMode::Allow => Err(NetError::EmptyAllow {
                input: input.to_owned(),
            }),
            mode => Ok((mode, Vec::new())),
        },
        Some(("allow", list)) => {
            let mut dests = Vec::new();
            for item in list.split(',').filter(|s| !s.trim().is_empty()) {
                let dest = NetDest::parse(item)?;
                if dest.is_everything() {
                    return Err(NetError::Everything { dest });
                }
                dests.push(dest);
            }
            if dests.is_empty() {
                return Err(NetError::EmptyAllow {
                    input: input.to_owned(),
                });
            }
            Ok((NetMode::Allow, dests))
        }
        Some(_) => Err(NetError::ParseMode {
            input: input.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> NetDest {
        NetDest::parse(s).unwrap()
    }

    #[test]
    fn parses_and_displays_every_form() {
        for s in [
            "10.1.2.0/24",
            "10.1.2.7/32",
            "10.1.2.0/24:443",
            "2001:db8::/32",
            "[2001:db8::/32]:443",
            "api.example.com:443",
            "api.example.com",
            "0.0.0.0/0",
            "::/0",
        ] {
            assert_eq!(d(s).to_string(), s);
        }
        assert_eq!(d("10.1.2.7").to_string(), "10.1.2.7/32");
        assert_eq!(d("[2001:db8::1]:443").to_string(), "[2001:db8::1/128]:443");
        assert_eq!(d("API.Example.COM.:443").to_string(), "api.example.com:443");
    }

    #[test]
    fn refuses_malformed_destinations_with_reasons() {
        let err = |s: &str| NetDest::parse(s).unwrap_err().to_string();
        assert!(
            err("10.1.2.3/24").contains(r#"did you mean "10.1.2.0/24"?"#),
            "{}",
            err("10.1.2.3/24")
        );
        assert!(err("10.1.2.3/24:80").contains(r#""10.1.2.0/24:80""#));
        assert!(err("10.0.0.0/33").contains("prefix length"));
        assert!(err("10.0.0.0/8:0").contains("port"));
        assert!(err("10.0.0.0/8:70000").contains("port"));
        assert!(err("host:http").contains("port"));
        assert!(err("300.1.1.1").contains("not a valid IP"));
        assert!(err("exa mple.com").contains("not allowed in a host name"));
        assert!(err("a..b").contains("empty label"));
        assert!(err("-a.com").contains("starts or ends"));
        assert!(err("[::1").contains("missing ']'"));
        assert!(
            err("::/0:443").contains(r#"needs brackets (write "[::/0]:443")"#),
            "{}",
            err("::/0:443")
        );
        assert!(err(":443").contains("missing address"));
        assert!(err("").contains("empty"));
    }

    #[test]
    fn cidr_intersection_is_nesting() {
        let a = d("10.0.0.0/8");
        let b = d("10.1.0.0/16");
        let c = d("192.168.0.0/16");
        assert_eq!(a.intersect(&b), Some(b.clone()));
        assert_eq!(b.intersect(&a), Some(b.clone()));
        assert_eq!(a.intersect(&c), None);
        assert_eq!(
            d("10.0.0.0/8:443").intersect(&b),
            Some(d("10.1.0.0/16:443"))
        );
        assert_eq!(d("10.0.0.0/8:443").intersect(&d("10.0.0.0/8:80")), None);
        assert_eq!(d("::/0").intersect(&a), None, "families are disjoint");
        assert!(a.contains(&b) && !b.contains(&a));
        assert!(!d("10.0.0.0/8:443").contains(&a));
        assert!(d("h.example:443").intersect(&a).is_none());
        assert_eq!(
            d("h.example").intersect(&d("h.example:443")),
            Some(d("h.example:443"))
        );
    }

    #[test]
    fn net_flag_forms() {
        assert_eq!(parse_net_flag("none").unwrap(), (NetMode::None, vec![]));
        assert_eq!(parse_net_flag("host").unwrap(), (NetMode::Host, vec![]));
        let (mode, list) = parse_net_flag("allow:10.0.0.0/8,api.example.com:443").unwrap();
        assert_eq!(mode, NetMode::Allow);
        assert_eq!(list, vec![d("10.0.0.0/8"), d("api.example.com:443")]);
        assert!(matches!(
            parse_net_flag("allow:"),
            Err(NetError::EmptyAllow { .. })
        ));
        assert!(matches!(
            parse_net_flag("allow"),
            Err(NetError::EmptyAllow { .. })
        ));
        assert!(matches!(
            parse_net_flag("all"),
            Err(NetError::ParseMode { .. })
        ));
        assert!(matches!(
            parse_net_flag("deny:1.2.3.4"),
            Err(NetError::ParseMode { .. })
        ));
        assert!(matches!(
            parse_net_flag("allow:::/0"),
            Err(NetError::Everything { .. })
        ));
        assert!(matches!(
            parse_net_flag("allow:10.1.1.1/8"),
            Err(NetError::ParseDest { .. })
        ));
    }
}
