//! The evidence ledger: an append-only, hash-chained JSONL log with RFC 6962
//! checkpoints, signed notes and receipts.
#![forbid(unsafe_code)]

pub mod chain;
pub mod checkpoint;
pub mod entry;
pub mod jcs;
pub mod keys;
pub mod ledger;
pub mod merkle;
pub mod note;
pub mod proof;
pub mod receipt;

pub use chain::{Damage, DamageKind, Report, VerifyOptions, verify};
pub use ledger::{Head, Ledger, Paths, sign_checkpoint};
