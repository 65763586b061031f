//! The evidence ledger: an append-only, hash-chained JSONL log with RFC 6962
//! checkpoints, signed notes and receipts.
#![forbid(unsafe_code)]

pub mod entry;
pub mod jcs;
pub mod merkle;
pub mod checkpoint;
pub mod keys;
pub mod note;
pub mod receipt;
pub mod chain;
pub mod ledger;
pub mod proof;

pub use chain::{Damage, DamageKind, Report, VerifyOptions, verify};
pub use ledger::{Head, Ledger, Paths, sign_checkpoint};
