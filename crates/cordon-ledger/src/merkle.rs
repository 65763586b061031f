//! RFC 6962 Merkle trees: leaf and node hashes, a streaming [`Frontier`]
//! that computes tree heads in O(log n) memory, and inclusion and consistency
//! proofs (generation as lists of subtree ranges, verification as in RFC 9162
//! §2.1.3.2 and §2.1.4.2).

use sha2::{Digest, Sha256};
use thiserror::Error;

/// A SHA-256 digest.
pub type Hash = [u8; 32];

/// SHA-256 of the empty string: the head of the empty tree.
pub fn empty_root() -> Hash {
    Sha256::digest([]).into()
}

/// `SHA-256(0x00 ‖ data)`.
pub fn leaf_hash(data: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(data);
    h.finalize().into()
}

/// `SHA-256(0x01 ‖ left ‖ right)`.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// Why a proof does not verify.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MerkleError {
    /// An inclusion proof does not lead to the expected root.
    #[error("inclusion proof for leaf {index} in a tree of {size} does not verify: {reason}")]
    VerifyInclusion {
        /// The leaf's index.
        index: u64,
        /// The tree size.
        size: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// A consistency proof does not connect the two roots.
    #[error("consistency proof from size {old_size} to {new_size} does not verify: {reason}")]
    VerifyConsistency {
        /// The older tree size.
        old_size: u64,
        /// The newer tree size.
        new_size: u64,
        /// What is wrong.
        reason: &'static str,
    },
}

/// The right edge of a growing tree: one subtree root per set bit of its
/// size. Enough to compute the tree head at any moment, in O(log n) memory.
#[derive(Debug, Clone, Default)]
pub struct Frontier {
    size: u64,
    stack: Vec<Hash>,
}

impl Frontier {
    /// An empty tree.
    pub fn new() -> Frontier {
        Frontier::default()
    }

    /// Adds the next leaf (already leaf-hashed).
    pub fn push(&mut self, leaf: Hash) {
        let mut h = leaf;
        let mut k = self.size;
        while k & 1 == 1 {
            // A set bit means a complete subtree of the same height to merge.
            let left = self.stack.pop().unwrap_or_default();
            h = node_hash(&left, &h);
            k >>= 1;
        }
        self.stack.push(h);
        self.size += 1;
    }

    /// Leaves so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The RFC 6962 Merkle tree hash of the leaves so far.
    pub fn root(&self) -> Hash {
        let mut it = self.stack.iter().rev();
        let Some(&last) = it.next() else {
            return empty_root();
        };
        it.fold(last, |acc, left| node_hash(left, &acc))
    }
}

/// The tree head over `leaves` (already leaf-hashed).
pub fn root(leaves: &[Hash]) -> Hash {
    let mut f = Frontier::new();
    for &l in leaves {
        f.push(l);
    }
    f.root()
}

/// The largest power of two strictly below `n` (n ≥ 2).
fn split(n: u64) -> u64 {
    1 << (63 - (n - 1).leading_zeros())
}

/// A half-open range of leaf indices `[start, end)`, whose subtree hash is a
/// proof element.
pub type Range = (u64, u64);

/// The subtrees whose hashes make the inclusion proof of leaf `index` in a
/// tree of `size` leaves, in proof order (RFC 6962 §2.1.1 `PATH`).
pub fn inclusion_ranges(index: u64, size: u64) -> Vec<Range> {
    fn path(m: u64, lo: u64, hi: u64, out: &mut Vec<Range>) {
        let n = hi - lo;
        if n <= 1 {
            return;
        }
        let k = split(n);
        if m < k {
            path(m, lo, lo + k, out);
            out.push((lo + k, hi));
        } else {
            path(m - k, lo + k, hi, out);
            out.push((lo, lo + k));
        }
    }
    let mut out = Vec::new();
    if index < size {
        path(index, 0, size, &mut out);
    }
    out
}

/// The subtrees whose hashes make the consistency proof between tree sizes
/// `old` and `new`, in proof order (RFC 6962 §2.1.2 `PROOF`). Empty when
/// `old` is 0 or equal to `new`.
pub fn consistency_ranges(old: u64, new: u64) -> Vec<Range> {
    fn sub(m: u64, lo: u64, hi: u64, whole: bool, out: &mut Vec<Range>) {
        let n = hi - lo;
        if m == n {
            if !whole {
                out.push((lo, hi));
            }
            return;
        }
        let k = split(n);
        if m <= k {
            sub(m, lo, lo + k, whole, out);
            out.push((lo + k, hi));
        } else {
            sub(m - k, lo + k, hi, false, out);
            out.push((lo, lo + k));
        }
    }
    let mut out = Vec::new();
    if 0 < old && old < new {
        sub(old, 0, new, true, &mut out);
    }
    out
}

/// Computes the hashes of a set of subtree ranges from leaves streamed in
/// order, holding O(log n) state per range.
#[derive(Debug)]
pub struct RangeHasher {
    ranges: Vec<(Range, Frontier)>,
}

impl RangeHasher {
    /// Prepares to hash `ranges`.
    pub fn new(ranges: &[Range]) -> RangeHasher {
        RangeHasher {
            ranges: ranges.iter().map(|&r| (r, Frontier::new())).collect(),
        }
    }

    /// Feeds leaf `index`; leaves must come in order from 0.
    pub fn push(&mut self, index: u64, leaf: &Hash) {
        for ((start, end), f) in &mut self.ranges {
            if *start <= index && index < *end {
                f.push(*leaf);
            }
        }
    }

    /// The subtree hashes, in the order the ranges were given, or `None` if
    /// some range has not seen all its leaves.
    pub fn finish(self) -> Option<Vec<Hash>> {
        self.ranges
            .into_iter()
            .map(|((start, end), f)| (f.size() == end - start).then(|| f.root()))
            .collect()
    }
}

/// Verifies that `leaf` is leaf `index` of the tree of `size` leaves whose
/// head is `root` (RFC 9162 §2.1.3.2).
pub fn verify_inclusion(
    leaf: &Hash,
    index: u64,
    size: u64,
    proof: &[Hash],
    root: &Hash,
) -> Result<(), MerkleError> {
    let fail = |reason| MerkleError::VerifyInclusion {
        index,
        size,
        reason,
    };
    if index >= size {
        return Err(fail("the index is not inside the tree"));
    }
    let (mut fnode, mut snode) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if snode == 0 {
            return Err(fail("the proof is too long"));
        }
        if fnode & 1 == 1 || fnode == snode {
            r = node_hash(p, &r);
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    if snode != 0 {
        return Err(fail("the proof is too short"));
    }
    if r != *root {
        return Err(fail("it leads to a different root"));
    }
    Ok(())
}

/// Verifies that the tree of `old_size` leaves with head `old_root` is a
/// prefix of the tree of `new_size` leaves with head `new_root` (RFC 9162
/// §2.1.4.2).
pub fn verify_consistency(
    old_size: u64,
    new_size: u64,
    old_root: &Hash,
    new_root: &Hash,
    proof: &[Hash],
) -> Result<(), MerkleError> {
    let fail = |reason| MerkleError::VerifyConsistency {
        old_size,
        new_size,
        reason,
    };
    if old_size > new_size {
        return Err(fail("the old tree is larger than the new one"));
    }
    if old_size == new_size {
        if !proof.is_empty() {
            return Err(fail("equal sizes need an empty proof"));
        }
        return if old_root == new_root {
            Ok(())
        } else {
            Err(fail("equal sizes with different roots"))
        };
    }
    if old_size == 0 {
        return if proof.is_empty() {
            Ok(())
        } else {
            Err(fail("the empty tree needs an empty proof"))
        };
    }
    if proof.is_empty() {
        return Err(fail("the proof is empty"));
    }
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if old_size.is_power_of_two() {
        path.push(*old_root);
    }
    path.extend_from_slice(proof);
    let (mut fnode, mut snode) = (old_size - 1, new_size - 1);
    while fnode & 1 == 1 {
        fnode >>= 1;
        snode >>= 1;
    }
    let (mut fr, mut sr) = (path[0], path[0]);
    for c in &path[1..] {
        if snode == 0 {
            return Err(fail("the proof is too long"));
        }
        if fnode & 1 == 1 || fnode == snode {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        } else {
            sr = node_hash(&sr, c);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    if snode != 0 {
        return Err(fail("the proof is too short"));
    }
    if fr != *old_root {
        return Err(fail("it does not lead to the old root"));
    }
    if sr != *new_root {
        return Err(fail("it does not lead to the new root"));
    }
    Ok(())
}

#[cfg(test)]
// Test trees have a few dozen leaves: indices fit any usize.
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn h(s: &str) -> Hash {
        hex::decode(s).unwrap().try_into().unwrap()
    }

    /// The Certificate Transparency reference leaves (RFC 6962 test data).
    fn ct_leaves() -> Vec<Hash> {
        [
            "",
            "00",
            "10",
            "2021",
            "3031",
            "40414243",
            "5051525354555657",
            "606162636465666768696a6b6c6d6e6f",
        ]
        .iter()
        .map(|s| leaf_hash(&hex::decode(s).unwrap()))
        .collect()
    }

    const CT_ROOTS: [&str; 9] = [
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    ];

    /// Computes proof hashes the slow way, from all leaves in memory.
    fn hashes(leaves: &[Hash], ranges: &[Range]) -> Vec<Hash> {
        ranges
            .iter()
            .map(|&(a, b)| root(&leaves[a as usize..b as usize]))
            .collect()
    }

    #[test]
    fn ct_roots() {
        let leaves = ct_leaves();
        for (n, want) in CT_ROOTS.iter().enumerate() {
            assert_eq!(hex::encode(root(&leaves[..n])), *want, "size {n}");
        }
    }

    #[test]
    fn ct_inclusion_proofs() {
        let leaves = ct_leaves();
        let cases: &[(u64, u64, &[&str])] = &[
            (0, 1, &[]),
            (
                0,
                8,
                &[
                    "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                    "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                    "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
                ],
            ),
            (
                5,
                8,
                &[
                    "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
                    "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
                ],
            ),
        ];
        for &(index, size, want) in cases {
            let got = hashes(&leaves, &inclusion_ranges(index, size));
            let want: Vec<Hash> = want.iter().map(|s| h(s)).collect();
            assert_eq!(got, want, "inclusion({index}, {size})");
            let r = h(CT_ROOTS[size as usize]);
            verify_inclusion(&leaves[index as usize], index, size, &want, &r).unwrap();
        }
    }

    #[test]
    fn ct_consistency_proofs() {
        let leaves = ct_leaves();
        let cases: &[(u64, u64, &[&str])] = &[
            (1, 1, &[]),
            (
                1,
                8,
                &[
                    "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                    "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                    "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
                ],
            ),
            (
                2,
                5,
                &[
                    "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                    "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
                ],
            ),
            (
                2,
                8,
                &[
                    "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                    "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
                ],
            ),
            (
                6,
                8,
                &[
                    "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
                    "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
                ],
            ),
        ];
        for &(old, new, want) in cases {
            let got = hashes(&leaves, &consistency_ranges(old, new));
            let want: Vec<Hash> = want.iter().map(|s| h(s)).collect();
            assert_eq!(got, want, "consistency({old}, {new})");
            let (r1, r2) = (h(CT_ROOTS[old as usize]), h(CT_ROOTS[new as usize]));
            verify_consistency(old, new, &r1, &r2, &want).unwrap();
        }
    }

    fn leaves(n: u64) -> Vec<Hash> {
        (0..n).map(|i| leaf_hash(&i.to_be_bytes())).collect()
    }

    #[test]
    fn every_inclusion_proof_verifies_and_every_mangled_one_fails() {
        let all = leaves(40);
        for size in 1..=40u64 {
            let r = root(&all[..size as usize]);
            for index in 0..size {
                let proof = hashes(&all, &inclusion_ranges(index, size));
                let leaf = &all[index as usize];
                verify_inclusion(leaf, index, size, &proof, &r).unwrap();
                assert!(
                    verify_inclusion(&all[(index as usize + 1) % 40], index, size, &proof, &r)
                        .is_err()
                );
                if size < 40 {
                    let bigger = root(&all[..size as usize + 1]);
                    assert!(verify_inclusion(leaf, index, size + 1, &proof, &bigger).is_err());
                }
                if !proof.is_empty() {
                    let mut bad = proof.clone();
                    bad[0][0] ^= 1;
                    assert!(verify_inclusion(leaf, index, size, &bad, &r).is_err());
                    assert!(verify_inclusion(leaf, index, size, &proof[1..], &r).is_err());
                }
                let mut long = proof.clone();
                long.push([7; 32]);
                assert!(verify_inclusion(leaf, index, size, &long, &r).is_err());
            }
        }
    }

    #[test]
    fn every_consistency_proof_verifies_and_every_mangled_one_fails() {
        let all = leaves(40);
        for new in 1..=40u64 {
            let r2 = root(&all[..new as usize]);
            for old in 0..=new {
                let r1 = root(&all[..old as usize]);
                let proof = hashes(&all, &consistency_ranges(old, new));
                verify_consistency(old, new, &r1, &r2, &proof).unwrap();
                if 0 < old && old < new {
                    let mut bad = proof.clone();
                    let last = bad.len() - 1;
                    bad[last][3] ^= 0x80;
                    assert!(verify_consistency(old, new, &r1, &r2, &bad).is_err());
                    assert!(verify_consistency(old, new, &r1, &r2, &proof[..last]).is_err());
                    let other = root(&leaves(old)[..old as usize - 1]);
                    assert!(verify_consistency(old, new, &other, &r2, &proof).is_err());
                }
                assert!(verify_consistency(old, new, &r1, &[9; 32], &proof).is_err() || old == 0);
            }
        }
    }

    #[test]
    fn streamed_range_hashes_equal_the_in_memory_ones() {
        let all = leaves(37);
        let ranges = consistency_ranges(13, 37);
        let mut rh = RangeHasher::new(&ranges);
        for (i, l) in all.iter().enumerate() {
            rh.push(i as u64, l);
        }
        assert_eq!(rh.finish().unwrap(), hashes(&all, &ranges));
        let mut short = RangeHasher::new(&ranges);
        short.push(0, &all[0]);
        assert!(short.finish().is_none());
    }
}
