//! The allowlist: rules as the caller states them, normalized and merged into the LPM-trie
//! entries the kernel looks up, and the same decision computed in Rust (to pick probe
//! destinations and to read the tries back).
//!
//! The kernel finds the longest prefix containing a destination and checks its ports. For
//! that single lookup to agree with "some rule allows it", every entry carries the ports of
//! every rule whose prefix contains the entry's prefix (rules that contain a destination are
//! nested, so the longest one's entry already knows all the others).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::wire::{AllowVal, MAX_PORTS, MAX_PREFIXES};

/// One allowed destination: a CIDR, and one port or all of them. Applies to TCP and UDP alike;
/// other protocols (ICMP, raw IP) are allowed only by rules without a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Allow {
    /// The network address (host bits are ignored).
    pub net: IpAddr,
    /// The prefix length (≤ 32 for IPv4, ≤ 128 for IPv6).
    pub prefix: u8,
    /// The one port allowed, or every port.
    pub port: Option<u16>,
}

impl Allow {
    /// A rule for a CIDR and an optional port.
    pub fn new(net: IpAddr, prefix: u8, port: Option<u16>) -> Self {
        Allow { net, prefix, port }
    }
}

/// Errors of building the tries, each naming the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowlistError {
    /// A prefix longer than the address.
    #[error("prefix /{prefix} is too long for {net}")]
    Prefix {
        /// The address.
        net: IpAddr,
        /// The prefix.
        prefix: u8,
    },
    /// More ports apply to one prefix than an entry can carry.
    #[error("{count} ports apply to {net}/{prefix}; at most {MAX_PORTS} can")]
    TooManyPorts {
        /// The prefix's address.
        net: IpAddr,
        /// Its length.
        prefix: u8,
        /// How many ports.
        count: usize,
    },
    /// More prefixes of one family than a trie holds.
    #[error("{count} IPv{family} prefixes; at most {MAX_PREFIXES}")]
    TooManyPrefixes {
        /// 4 or 6.
        family: u8,
        /// How many.
        count: usize,
    },
}

/// The merged trie contents: (address bytes, prefix) → what it permits.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tries {
    /// IPv4 entries (IPv4-mapped IPv6 rules land here too).
    pub v4: BTreeMap<([u8; 4], u8), AllowVal>,
    /// IPv6 entries.
    pub v6: BTreeMap<([u8; 16], u8), AllowVal>,
}

fn mask<const N: usize>(mut a: [u8; N], prefix: u8) -> [u8; N] {
    for (i, b) in a.iter_mut().enumerate() {
        let bits = (prefix as usize).saturating_sub(i * 8).min(8);
        *b &= if bits == 0 { 0 } else { 0xffu8 << (8 - bits) };
    }
    a
}

fn contains<const N: usize>(outer: &([u8; N], u8), inner: &([u8; N], u8)) -> bool {
    outer.1 <= inner.1 && mask(inner.0, outer.1) == outer.0
}

fn merge<const N: usize>(
    rules: BTreeMap<([u8; N], u8), AllowVal>,
    family: u8,
    show: impl Fn([u8; N]) -> IpAddr,
) -> Result<BTreeMap<([u8; N], u8), AllowVal>, AllowlistError> {
    if rules.len() > MAX_PREFIXES {
        return Err(AllowlistError::TooManyPrefixes {
            family,
            count: rules.len(),
        });
    }
    let mut out = BTreeMap::new();
    for (key, own) in &rules {
        let mut val = own.clone();
        for (other, theirs) in &rules {
            if other != key && contains(other, key) {
                val.any_port |= theirs.any_port;
                val.ports.extend_from_slice(&theirs.ports);
            }
        }
        val.ports.sort_unstable();
        val.ports.dedup();
        if val.any_port {
            val.ports.clear();
        } else if val.ports.len() > MAX_PORTS {
            return Err(AllowlistError::TooManyPorts {
                net: show(key.0),
                prefix: key.1,
                count: val.ports.len(),
            });
        }
        out.insert(*key, val);
    }
    Ok(out)
}

impl Tries {
    /// Normalizes (host bits cleared; `::ffff:a.b.c.d/96+n` becomes `a.b.c.d/n`) and merges.
    pub fn build(rules: &[Allow]) -> Result<Tries, AllowlistError> {
        let mut v4: BTreeMap<([u8; 4], u8), AllowVal> = BTreeMap::new();
        let mut v6: BTreeMap<([u8; 16], u8), AllowVal> = BTreeMap::new();
        let add = |val: &mut AllowVal, port: Option<u16>| match port {
            None => val.any_port = true,
            Some(p) => val.ports.push(p),
        };
        for r in rules {
            let bad = || AllowlistError::Prefix {
                net: r.net,
                prefix: r.prefix,
            };
            match r.net {
                IpAddr::V4(a) => {
                    if r.prefix > 32 {
                        return Err(bad());
                    }
                    add(
                        v4.entry((mask(a.octets(), r.prefix), r.prefix))
                            .or_default(),
                        r.port,
                    );
                }
                IpAddr::V6(a) => {
                    if r.prefix > 128 {
                        return Err(bad());
                    }
                    match a.to_ipv4_mapped() {
                        Some(m) if r.prefix >= 96 => {
                            let p = r.prefix - 96;
                            add(v4.entry((mask(m.octets(), p), p)).or_default(), r.port);
                        }
                        _ => add(
                            v6.entry((mask(a.octets(), r.prefix), r.prefix))
                                .or_default(),
                            r.port,
                        ),
                    }
                }
            }
        }
        Ok(Tries {
            v4: merge(v4, 4, |a| IpAddr::V4(Ipv4Addr::from(a)))?,
            v6: merge(v6, 6, |a| IpAddr::V6(Ipv6Addr::from(a)))?,
        })
    }

    /// The decision the kernel programs make for a TCP or UDP destination (`port`), or a
    /// portless packet (`None`): the longest matching entry must permit the port. IPv4-mapped
    /// IPv6 destinations are judged by the IPv4 entries.
    pub fn permits(&self, dest: IpAddr, port: Option<u16>) -> bool {
        let ok = |v: &AllowVal| v.any_port || port.is_some_and(|p| v.ports.contains(&p));
        match dest {
            IpAddr::V4(a) => longest(&self.v4, a.octets(), 32).is_some_and(ok),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(m) => longest(&self.v4, m.octets(), 32).is_some_and(ok),
                None => longest(&self.v6, a.octets(), 128).is_some_and(ok),
            },
        }
    }
}

fn longest<const N: usize>(
    map: &BTreeMap<([u8; N], u8), AllowVal>,
    addr: [u8; N],
    bits: u8,
) -> Option<&AllowVal> {
    (0..=bits).rev().find_map(|p| map.get(&(mask(addr, p), p)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn host_bits_are_cleared_and_mapped_rules_become_ipv4() {
        let t = Tries::build(&[
            Allow::new(ip("10.1.2.3"), 8, None),
            Allow::new(ip("::ffff:192.0.2.7"), 120, Some(53)),
        ])
        .unwrap();
        assert!(t.v4.contains_key(&([10, 0, 0, 0], 8)));
        assert_eq!(
            t.v4[&([192, 0, 2, 0], 24)],
            AllowVal {
                any_port: false,
                ports: vec![53]
            }
        );
        assert!(t.v6.is_empty());
    }

    #[test]
    fn broader_rules_lend_their_ports_to_nested_ones() {
        let t = Tries::build(&[
            Allow::new(ip("10.0.0.0"), 8, Some(443)),
            Allow::new(ip("10.1.0.0"), 16, Some(80)),
        ])
        .unwrap();
        // 10.1.x.x matches the /16 entry, which must still allow the /8's port.
        assert!(t.permits(ip("10.1.2.3"), Some(443)));
        assert!(t.permits(ip("10.1.2.3"), Some(80)));
        assert!(!t.permits(ip("10.2.0.1"), Some(80)));
        assert!(t.permits(ip("10.2.0.1"), Some(443)));
        assert!(!t.permits(ip("10.1.2.3"), None));
        assert!(!t.permits(ip("11.0.0.1"), Some(443)));
    }

    #[test]
    fn any_port_wins_and_mapped_destinations_use_the_ipv4_list() {
        let t = Tries::build(&[
            Allow::new(ip("192.0.2.0"), 24, None),
            Allow::new(ip("192.0.2.8"), 29, Some(22)),
            Allow::new(ip("2001:db8::"), 32, Some(443)),
        ])
        .unwrap();
        assert!(t.permits(ip("192.0.2.9"), Some(80)));
        assert!(t.permits(ip("192.0.2.9"), None));
        assert!(t.permits(ip("::ffff:192.0.2.1"), Some(1)));
        assert!(!t.permits(ip("::ffff:198.51.100.1"), Some(443)));
        assert!(t.permits(ip("2001:db8::1"), Some(443)));
        assert!(!t.permits(ip("2001:db8::1"), Some(80)));
        assert!(!t.permits(ip("::1"), Some(443)));
    }

    #[test]
    fn limits_are_errors_naming_the_rule() {
        assert_eq!(
            Tries::build(&[Allow::new(ip("10.0.0.0"), 33, None)]),
            Err(AllowlistError::Prefix {
                net: ip("10.0.0.0"),
                prefix: 33
            })
        );
        let many: Vec<Allow> = (1..=17)
            .map(|p| Allow::new(ip("10.0.0.0"), 8, Some(p)))
            .collect();
        assert!(matches!(
            Tries::build(&many),
            Err(AllowlistError::TooManyPorts { count: 17, .. })
        ));
        let prefixes: Vec<Allow> = (0..=u32::try_from(MAX_PREFIXES).unwrap())
            .map(|i| Allow::new(IpAddr::V4(Ipv4Addr::from(i << 8)), 24, None))
            .collect();
        assert!(matches!(
            Tries::build(&prefixes),
            Err(AllowlistError::TooManyPrefixes { family: 4, .. })
        ));
    }
}
