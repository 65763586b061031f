//! The kernel's tags of this build's egress programs, computed from the embedded object, so
//! that a run can tell whether the shared programs pinned in bpffs are the ones this build
//! would load (and not look-alikes pinned in their place).
//!
//! The kernel tags a program with the first 8 bytes of a hash of its instructions as loaded,
//! with the immediates of map references (`ld_imm64` with `BPF_PSEUDO_MAP_FD`/`_VALUE`)
//! zeroed: SHA-256 since Linux 6.18, SHA-1 before. The egress object needs no CO-RE
//! relocation and has no subprograms or global data, so the only change a loader makes to its
//! instructions is marking map loads (`src_reg = BPF_PSEUDO_MAP_FD`, descriptor in the
//! immediate, which the tag ignores): the tags follow from the ELF alone. The exec observer's
//! instructions are relocated against the running kernel's BTF, so its tag cannot be known
//! without parsing that BTF; see SECURITY.md.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use sha2::Digest;

use crate::EGRESS_OBJECT;
use crate::egress::HOOKS;

/// A program's expected tag. The hash differs between kernels: SHA-256 since 6.18 (computed
/// at once), SHA-1 before (computed only when the SHA-256 one does not match).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag {
    /// SHA-256 based (Linux ≥ 6.18).
    pub sha256: [u8; 8],
    /// The instructions hashed, for the SHA-1 tag of older kernels.
    hashed: Vec<u8>,
}

impl Tag {
    /// Whether the kernel's tag is this one.
    pub fn matches(&self, kernel: &[u8; 8]) -> bool {
        self.sha256 == *kernel || self.sha1() == *kernel
    }

    /// The SHA-1 based tag (Linux < 6.18).
    pub fn sha1(&self) -> [u8; 8] {
        let mut t = [0u8; 8];
        t.copy_from_slice(&sha1_digest(&self.hashed)[..8]);
        t
    }
}

/// Why tags could not be computed from an object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("computing program tags: {0}")]
pub struct TagError(String);

fn err(s: impl Into<String>) -> TagError {
    TagError(s.into())
}

/// The tags of the six egress programs of this build, by program name.
pub fn egress_tags() -> Result<&'static BTreeMap<&'static str, Tag>, TagError> {
    static TAGS: OnceLock<Result<BTreeMap<&'static str, Tag>, TagError>> = OnceLock::new();
    TAGS.get_or_init(|| {
        let names: Vec<&'static str> = HOOKS.iter().map(|h| h.program).collect();
        object_tags(EGRESS_OBJECT, &names)
    })
    .as_ref()
    .map_err(Clone::clone)
}

struct Elf<'a> {
    b: &'a [u8],
    sections: Vec<Section>,
    shstr: usize,
}

#[derive(Debug, Clone, Copy)]
struct Section {
    name: u32,
    kind: u32,
    offset: usize,
    size: usize,
    link: u32,
    info: u32,
}

const SHT_SYMTAB: u32 = 2;
const SHT_REL: u32 = 9;
const STT_FUNC: u8 = 2;
const R_BPF_64_64: u32 = 1;
const BPF_LD_IMM64: u8 = 0x18;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const BPF_PSEUDO_MAP_VALUE: u8 = 2;

impl<'a> Elf<'a> {
    fn parse(b: &'a [u8]) -> Result<Elf<'a>, TagError> {
        if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
            return Err(err("not a 64-bit little-endian ELF object"));
        }
        let shoff = usize_at(b, 0x28)?;
        let shentsize = usize::from(u16_at(b, 0x3a)?);
        let shnum = usize::from(u16_at(b, 0x3c)?);
        let shstrndx = usize::from(u16_at(b, 0x3e)?);
        if shentsize != 64 {
            return Err(err("unexpected section header size"));
        }
        let mut sections = Vec::with_capacity(shnum);
        for i in 0..shnum {
            let h = shoff + i * 64;
            sections.push(Section {
                name: u32_at(b, h)?,
                kind: u32_at(b, h + 4)?,
                offset: usize_at(b, h + 24)?,
                size: usize_at(b, h + 32)?,
                link: u32_at(b, h + 40)?,
                info: u32_at(b, h + 44)?,
            });
        }
        let shstr = sections
            .get(shstrndx)
            .ok_or_else(|| err("no section name table"))?
            .offset;
        let elf = Elf { b, sections, shstr };
        for s in &elf.sections {
            elf.data(s)?;
        }
        Ok(elf)
    }

    fn data(&self, s: &Section) -> Result<&'a [u8], TagError> {
        self.b
            .get(
                s.offset
                    ..s.offset
                        .checked_add(s.size)
                        .ok_or_else(|| err("overflow"))?,
            )
            .ok_or_else(|| err("a section lies outside the object"))
    }

    fn str_at(&self, table: usize, off: u32) -> Result<&'a str, TagError> {
        let start = table + off as usize;
        let rest = self
            .b
            .get(start..)
            .ok_or_else(|| err("a name lies outside the object"))?;
        let end = rest
            .iter()
            .position(|&c| c == 0)
            .ok_or_else(|| err("unterminated name"))?;
        std::str::from_utf8(&rest[..end]).map_err(|_| err("a name is not UTF-8"))
    }

    fn section_name(&self, s: &Section) -> Result<&'a str, TagError> {
        self.str_at(self.shstr, s.name)
    }
}

fn u16_at(b: &[u8], o: usize) -> Result<u16, TagError> {
    b.get(o..o + 2)
        .map(|x| u16::from_le_bytes([x[0], x[1]]))
        .ok_or_else(|| err("truncated object"))
}

fn u32_at(b: &[u8], o: usize) -> Result<u32, TagError> {
    b.get(o..o + 4)
        .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
        .ok_or_else(|| err("truncated object"))
}

fn u64_at(b: &[u8], o: usize) -> Result<u64, TagError> {
    let x = b.get(o..o + 8).ok_or_else(|| err("truncated object"))?;
    let mut a = [0u8; 8];
    a.copy_from_slice(x);
    Ok(u64::from_le_bytes(a))
}

fn usize_at(b: &[u8], o: usize) -> Result<usize, TagError> {
    usize::try_from(u64_at(b, o)?).map_err(|_| err("offset too large"))
}

struct Symbol<'a> {
    name: &'a str,
    kind: u8,
    shndx: usize,
    value: usize,
    size: usize,
}

fn symbols<'a>(elf: &Elf<'a>) -> Result<Vec<Symbol<'a>>, TagError> {
    let symtab = elf
        .sections
        .iter()
        .find(|s| s.kind == SHT_SYMTAB)
        .ok_or_else(|| err("no symbol table"))?;
    let strtab = elf
        .sections
        .get(symtab.link as usize)
        .ok_or_else(|| err("no string table"))?
        .offset;
    let data = elf.data(symtab)?;
    let mut out = Vec::new();
    for e in data.chunks_exact(24) {
        out.push(Symbol {
            name: elf.str_at(strtab, u32_at(e, 0)?)?,
            kind: e[4] & 0xf,
            shndx: usize::from(u16_at(e, 6)?),
            value: usize_at(e, 8)?,
            size: usize_at(e, 16)?,
        });
    }
    Ok(out)
}

/// The tags of the named programs of an ELF object.
pub fn object_tags(
    object: &[u8],
    programs: &[&'static str],
) -> Result<BTreeMap<&'static str, Tag>, TagError> {
    let elf = Elf::parse(object)?;
    let syms = symbols(&elf)?;
    let maps = elf
        .sections
        .iter()
        .position(|s| elf.section_name(s).is_ok_and(|n| n == ".maps"));
    // Code outside the programs' own sections would be appended by the loader (subprograms).
    if let Some(text) = elf
        .sections
        .iter()
        .find(|s| elf.section_name(s).is_ok_and(|n| n == ".text"))
        && text.size > 0
    {
        return Err(err("the object has subprograms in .text"));
    }
    let mut out = BTreeMap::new();
    for &name in programs {
        let sym = syms
            .iter()
            .find(|s| s.kind == STT_FUNC && s.name == name)
            .ok_or_else(|| err(format!("no program {name}")))?;
        let section = elf
            .sections
            .get(sym.shndx)
            .ok_or_else(|| err(format!("program {name} has no section")))?;
        let data = elf.data(section)?;
        let mut insns = data
            .get(sym.value..sym.value + sym.size)
            .ok_or_else(|| err(format!("program {name} lies outside its section")))?
            .to_vec();
        if insns.len() % 8 != 0 {
            return Err(err(format!("program {name} is not whole instructions")));
        }
        for rel in elf
            .sections
            .iter()
            .filter(|s| s.kind == SHT_REL && s.info as usize == sym.shndx)
        {
            for e in elf.data(rel)?.chunks_exact(16) {
                let offset = usize_at(e, 0)?;
                let info = u64_at(e, 8)?;
                if offset < sym.value || offset >= sym.value + sym.size {
                    continue;
                }
                let at = offset - sym.value;
                let target = syms
                    .get((info >> 32) as usize)
                    .ok_or_else(|| err("a relocation names no symbol"))?;
                let kind = (info & 0xffff_ffff) as u32;
                // Global data (constants in .rodata included) would reach the program through
                // a map whose contents the tag does not cover: the object must have none.
                if kind != R_BPF_64_64
                    || Some(target.shndx) != maps
                    || insns.get(at) != Some(&BPF_LD_IMM64)
                    || at + 16 > insns.len()
                {
                    let what = elf
                        .sections
                        .get(target.shndx)
                        .and_then(|s| elf.section_name(s).ok())
                        .unwrap_or("?");
                    return Err(err(format!(
                        "program {name}: a relocation other than a map load at {offset} (to {what}: global data?)"
                    )));
                }
                // What the loader does: mark the map load, put the descriptor in the immediate.
                insns[at + 1] = (insns[at + 1] & 0x0f) | (BPF_PSEUDO_MAP_FD << 4);
                insns[at + 4..at + 8].copy_from_slice(&[0; 4]);
            }
        }
        out.insert(name, kernel_tag(&insns));
    }
    Ok(out)
}

/// The kernel's `bpf_prog_calc_tag`: map references' immediates zeroed, then hashed.
pub fn kernel_tag(insns: &[u8]) -> Tag {
    let mut dst = insns.to_vec();
    let mut was_ld_map = false;
    for ins in dst.chunks_exact_mut(8) {
        let code = ins[0];
        let dst_reg = ins[1] & 0x0f;
        let src_reg = ins[1] >> 4;
        let off = u16::from_le_bytes([ins[2], ins[3]]);
        if !was_ld_map
            && code == BPF_LD_IMM64
            && (src_reg == BPF_PSEUDO_MAP_FD || src_reg == BPF_PSEUDO_MAP_VALUE)
        {
            was_ld_map = true;
            ins[4..8].copy_from_slice(&[0; 4]);
        } else if was_ld_map && code == 0 && dst_reg == 0 && src_reg == 0 && off == 0 {
            was_ld_map = false;
            ins[4..8].copy_from_slice(&[0; 4]);
        } else {
            was_ld_map = false;
        }
    }
    let mut sha256 = [0u8; 8];
    sha256.copy_from_slice(&sha2::Sha256::digest(&dst)[..8]);
    Tag {
        sha256,
        hashed: dst,
    }
}

/// SHA-1 (FIPS 180-4), for kernels before 6.18. Used only to recognize a tag, never to protect
/// anything on its own.
fn sha1_digest(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xefcd_ab89,
        0x98ba_dcfe,
        0x1032_5476,
        0xc3d2_e1f0,
    ];
    let mut msg = data.to_vec();
    let bits = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bits.to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 80];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5a82_7999),
                20..=39 => (b ^ c ^ d, 0x6ed9_eba1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8f1b_bcdc),
                _ => (b ^ c ^ d, 0xca62_c1d6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (o, x) in out.chunks_exact_mut(4).zip(h) {
        o.copy_from_slice(&x.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha1_matches_the_standard_vectors() {
        let hex = |d: [u8; 20]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(
            hex(sha1_digest(b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(
            hex(sha1_digest(b"")),
            "da39a3ee5e6b4b0d3255bfef95601890afd80709"
        );
        assert_eq!(
            hex(sha1_digest(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1"
        );
    }

    #[test]
    fn every_egress_program_has_a_tag() {
        let tags = egress_tags().unwrap();
        assert_eq!(tags.len(), HOOKS.len());
        // Distinct programs, distinct tags.
        let mut seen: Vec<_> = tags.values().map(|t| t.sha256).collect();
        assert!(
            tags.values()
                .all(|t| t.matches(&t.sha1()) && t.sha1() != t.sha256)
        );
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), HOOKS.len());
    }

    #[test]
    fn map_immediates_do_not_change_the_tag() {
        // r1 = map (ld_imm64, pseudo map fd 7), exit
        let mut a = vec![0x18, 0x11, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        a.extend_from_slice(&[0x95, 0, 0, 0, 0, 0, 0, 0]);
        let mut b = a.clone();
        b[4] = 9;
        assert_eq!(kernel_tag(&a), kernel_tag(&b));
        // Another instruction does change it.
        b[16] = 0x05;
        assert_ne!(kernel_tag(&a), kernel_tag(&b));
    }
}
