//! `cordon`: the command-line front end. Thin glue: argument parsing, exit
//! codes and error messages live here; every decision lives in a library crate.
// Doc comments on the argument types are clap's help text, printed verbatim to users
// (`[filesystem]`, `<name>.key`): rustdoc's link and HTML checks do not apply to them.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

#[cfg(target_env = "musl")]
mod allocator;
mod cmd;

use std::process::ExitCode;

use clap::Parser;

/// Runtime containment for AI agents: run commands inside a kernel-enforced
/// boundary, authorize agent actions, and keep evidence anyone can verify.
#[derive(Debug, Parser)]
#[command(name = "cordon", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: cmd::Command,
}

/// Parses the command line. `cordon run`, started once per sandboxed tool call, is parsed
/// against its own subcommand only: building every subcommand's arguments (ledger, policy,
/// keys…) cost ~0.1 ms of each run. The result, `--help` and the errors are the whole CLI's
/// (a test compares them).
fn parse_from<I>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = std::ffi::OsString>,
{
    use clap::FromArgMatches;
    let args: Vec<std::ffi::OsString> = args.into_iter().collect();
    if args.get(1).map(std::ffi::OsString::as_os_str) == Some(std::ffi::OsStr::new("run")) {
        let mut matches = run_only().try_get_matches_from(&args)?;
        if let Some((_, mut sub)) = matches.remove_subcommand() {
            let run = cmd::run::RunArgs::from_arg_matches_mut(&mut sub)?;
            return Ok(Cli {
                command: cmd::Command::Run(Box::new(run)),
            });
        }
    }
    Cli::try_parse_from(args)
}

/// The CLI with only `cordon run` in it.
fn run_only() -> clap::Command {
    use clap::Args;
    clap::Command::new("cordon")
        .version(env!("CARGO_PKG_VERSION"))
        .propagate_version(true)
        .subcommand(cmd::run::RunArgs::augment_args(clap::Command::new("run")))
}

/// The allocator, on musl (the C library cordon is built against: `.cargo/config.toml`).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOC: allocator::Allocator = allocator::Allocator::new();

fn main() -> ExitCode {
    // Built for glibc (another target), one malloc arena for every thread. Left alone, glibc
    // gives each new thread that allocates an arena of its own (three system calls to reserve
    // and trim 64 MiB of address space, then fresh page faults), and a run starts several
    // short-lived threads, some on its critical path; none of them allocates much, nor for long.
    // SAFETY: mallopt takes two integers and changes only the allocator's settings; no other
    // thread exists yet.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1)
    };
    #[cfg(target_env = "musl")]
    allocator::hold_allocator_groups();
    // The sandbox's init is this same binary, started by `cordon run` under another name.
    let mut args = std::env::args_os();
    if args.next().as_deref() == Some(std::ffi::OsStr::new(cordon_sandbox::proto::INIT_ARGV0)) {
        let args: Vec<String> = std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        cordon_sandbox::init::main(&args);
    }
    cordon_runtime::mark("main");
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // `cordon run` ends with its run: what it maps for the run (helper threads' stacks, the
    // event ring) is left for its exit to take down. Said before its first helper starts.
    if args.get(1).is_some_and(|a| a == "run") {
        cordon_sandbox::thread::one_shot_process();
    }
    let net = cmd::run::net_ahead(&args);
    cordon_runtime::mark("net ahead");
    let cli = match parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            let code = cmd::usage_error_code(&err);
            // Help and version are not errors: clap prints them and we exit 0.
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    cordon_runtime::mark("parsed");
    let failure_code = cli.command.failure_code();
    match cli.command.run(net) {
        Ok(code) => {
            cordon_runtime::mark("exit");
            ExitCode::from(code)
        }
        Err(err) => {
            eprintln!("cordon: {err:#}");
            ExitCode::from(failure_code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn argv(line: &[&str]) -> Vec<std::ffi::OsString> {
        std::iter::once("cordon")
            .chain(line.iter().copied())
            .map(Into::into)
            .collect()
    }

    /// `cordon run`'s own parser is the whole CLI's: same help, same results, same errors.
    #[test]
    fn run_is_parsed_as_the_whole_cli_would() {
        let mut whole = Cli::command();
        whole.build();
        let mut alone = run_only();
        alone.build();
        let help = |c: &mut clap::Command| {
            let run = c.find_subcommand_mut("run").unwrap();
            (
                run.render_long_help().to_string(),
                run.render_help().to_string(),
                run.render_usage().to_string(),
            )
        };
        assert_eq!(help(&mut whole), help(&mut alone));
        for line in [
            &["run", "--", "/bin/true"][..],
            &[
                "run", "--read", "/usr", "--write", ".", "--memory", "1G", "--", "sh", "-c", "x",
            ],
            &[
                "run",
                "-v",
                "--net",
                "allow:10.0.0.0/8",
                "--env",
                "A=b",
                "--",
                "x",
                "--y",
            ],
            &["run", "--exec", "/usr/bin", "--timeout", "-3s", "--", "x"],
        ] {
            let fast = format!("{:?}", parse_from(argv(line)).unwrap());
            let slow = format!("{:?}", Cli::try_parse_from(argv(line)).unwrap());
            assert_eq!(fast, slow, "{line:?}");
        }
        for line in [
            &["run"][..],
            &["run", "--bogus", "--", "x"],
            &["run", "--memory"],
            &["run", "--help"],
            &["run", "--version"],
        ] {
            let fast = parse_from(argv(line)).unwrap_err();
            let slow = Cli::try_parse_from(argv(line)).unwrap_err();
            assert_eq!(fast.kind(), slow.kind(), "{line:?}");
            assert_eq!(fast.to_string(), slow.to_string(), "{line:?}");
        }
    }
}
