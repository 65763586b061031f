//! Integration tests of cordon-ledger, one module per topic.

mod append;
mod canonical;
mod checkpoint;
mod crash;
mod tamper;
mod util;
