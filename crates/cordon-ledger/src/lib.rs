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
