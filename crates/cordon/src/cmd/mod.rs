//! Subcommands. Each returns the process exit code on success; an `Err` is
//! reported on standard error and mapped to the subcommand's documented
//! failure code (see `../shared/CONTRACT.md` and each command's `--help`).

use clap::Subcommand;

mod contain;
mod key;
mod ledger;
mod policy;
mod receipt;
pub mod run;

#[derive(Debug, Subcommand)]
pub enum Command {
    Run(Box<run::RunArgs>),
    Contain(contain::ContainArgs),
    /// Append to, verify, checkpoint and prove the evidence ledger
    #[command(subcommand)]
    Ledger(ledger::LedgerCommand),
    /// Sign and verify receipts (cordon-receipt/1)
    #[command(subcommand)]
    Receipt(receipt::ReceiptCommand),
    /// Generate signing keys
    #[command(subcommand)]
    Key(key::KeyCommand),
    /// Check policy files and replay recorded agent actions against them
    Policy(policy::PolicyArgs),
}

impl Command {
    /// Runs the subcommand, returning its exit code (`net`: the network namespace
    /// [`run::net_ahead`] started for `cordon run`, if any).
    pub fn run(self, net: Option<cordon_sandbox::netns::Pending>) -> anyhow::Result<u8> {
        match self {
            Command::Run(args) => run::run(*args, net),
            Command::Contain(args) => args.run(),
            Command::Ledger(c) => c.run(),
            Command::Receipt(c) => c.run(),
            Command::Key(c) => c.run(),
            Command::Policy(args) => args.run(),
        }
    }

    /// The exit code for an error that stops the command before it could
    /// reach its own verdict ("unusable input" in the contract's words).
    pub fn failure_code(&self) -> u8 {
        match self {
            Command::Run(_) => run::EXIT_REFUSED,
            Command::Contain(_) => 2,
            Command::Ledger(_) | Command::Receipt(_) | Command::Key(_) => 2,
            Command::Policy(_) => 2,
        }
    }
}

/// Creates (or truncates) a report file for writing, never through a symlink: a report may be
/// asked for in a directory a contained command can write.
pub fn create_report_file(path: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use anyhow::Context;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o644)
        .open(path)
        .with_context(|| format!("opening report file {}", path.display()))
}

/// The exit code for a command line that does not parse. `cordon run` owes
/// 125 for anything that stops it before the command starts; elsewhere the
/// conventional 2 for usage errors (the same as "unusable input").
pub fn usage_error_code(err: &clap::Error) -> u8 {
    use clap::error::ErrorKind;
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => 0,
        _ => {
            if std::env::args().nth(1).as_deref() == Some("run") {
                125
            } else {
                2
            }
        }
    }
}
