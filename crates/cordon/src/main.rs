//! `cordon`: the command-line front end. Thin glue: argument parsing, exit
//! codes and error messages live here; every decision lives in a library crate.
// Doc comments on the argument types are clap's help text, printed verbatim to users
// (`[filesystem]`, `<name>.key`): rustdoc's link and HTML checks do not apply to them.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

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

fn main() -> ExitCode {
    // The sandbox's init is this same binary, started by `cordon run` under another name.
    let mut args = std::env::args_os();
    if args.next().as_deref() == Some(std::ffi::OsStr::new(cordon_sandbox::proto::INIT_ARGV0)) {
        let args: Vec<String> = std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        cordon_sandbox::init::main(&args);
    }
    cordon_runtime::mark("main");
    let cli = match Cli::try_parse() {
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
    match cli.command.run() {
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
