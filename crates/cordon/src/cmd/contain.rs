//! `cordon contain`: stop an active run now, verifiably, and record every step.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde_json::json;

use cordon_ledger::Ledger;
use cordon_sandbox::cgroup::RunCgroup;
use cordon_sandbox::contain::{Containment, contain};
use cordon_sandbox::state::{DEFAULT_STATE_DIR, StateDir};

/// Exit status when containment could not be shown complete.
const EXIT_INCOMPLETE: u8 = 1;

#[derive(Debug, Args)]
#[command(
    about = "Contain an active run: block its egress, freeze, record, kill, verify",
    long_about = "Contain an active run now. In order: block its egress (when it has an egress \
provider), freeze it (cgroup.freeze, confirmed by frozen 1), record its process tree, kill it \
(cgroup.kill) and verify that nothing is left (populated 0). Every step's state goes into the \
run's ledger and the report printed on standard output. A contained run stays dead: there is no \
recovery.\n\nActive runs are found in a state directory that only root can write.",
    after_help = "\
Examples:
  cordon contain --list
  cordon contain r1795958129-8b802c03
  cordon contain r1795958129-8b802c03 --report containment.json

Exit status: 0 contained and verified; 1 containment ran but a step could not be verified;
2 unusable input (no such run, untrusted state directory)."
)]
pub struct ContainArgs {
    /// The run to contain (as printed by `cordon run -v`, in its report, or by --list)
    #[arg(required_unless_present = "list")]
    run_id: Option<String>,
    /// List the active runs instead
    #[arg(long, conflicts_with = "run_id")]
    list: bool,
    /// The state directory where active runs are registered
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Record into this ledger instead of the run's own
    #[arg(long, value_name = "DIR")]
    ledger: Option<PathBuf>,
    /// Also write the containment report (JSON) to FILE
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
}

impl ContainArgs {
    /// Runs the command.
    pub fn run(self) -> anyhow::Result<u8> {
        let dir = StateDir::open(&self.state_dir)?;
        // Entries of runs whose cordon died before its teardown point at nothing: drop them.
        dir.prune();
        if self.list {
            for r in dir.list() {
                println!(
                    "{}\tinit pid {}\t{}",
                    r.run_id,
                    r.init_pid,
                    r.cgroup.v2.display()
                );
            }
            return Ok(0);
        }
        let run_id = self.run_id.as_deref().unwrap_or_default();
        let state = dir.load(run_id)?;
        let cgroup = RunCgroup::open(&state.cgroup)
            .with_context(|| format!("run {run_id}: its cgroup is not the one it registered"))?;
        // Mark first, so that the run's own supervisor attributes the kill to containment; then
        // act, and only then record: nothing the ledger does (a stalled disk, a lock) may delay
        // stopping the run.
        dir.mark_contained(run_id)?;
        // The egress block goes through the run's pins, so it works whether or not the run's
        // own cordon is still alive, and is read back from the kernel before it counts.
        let root = std::path::Path::new(cordon_bpf::bpffs::DEFAULT_ROOT);
        let mut block = || -> Result<String, String> {
            cordon_bpf::block_pinned(root, run_id).map_err(|e| e.to_string())?;
            match cordon_bpf::egress::pinned_blocked(root, run_id) {
                Ok(true) => {
                    Ok("block-all set in the run's pinned control map and read back".into())
                }
                Ok(false) => Err("block-all written but the pinned control map reads 0".into()),
                Err(e) => Err(format!("block-all written but not readable back: {e}")),
            }
        };
        let egress: Option<cordon_sandbox::contain::EgressBlock<'_>> = if state.egress.is_some() {
            Some(&mut block)
        } else {
            None
        };
        let outcome: Containment = contain(&cgroup, egress);

        let ledger_dir = self.ledger.clone().or(state.ledger.clone());
        let ledger = match &ledger_dir {
            Some(d) => {
                Some(Ledger::open(d).with_context(|| format!("opening ledger {}", d.display()))?)
            }
            None => None,
        };
        if let Some(l) = &ledger {
            let mut entries = vec![(
                "contain.start".to_owned(),
                json!({ "run_id": run_id, "cgroup": state.cgroup.v2, "cgroup_id": state.cgroup.id }),
            )];
            for step in &outcome.steps {
                entries.push((
                    "contain.step".to_owned(),
                    json!({ "run_id": run_id, "step": step }),
                ));
            }
            entries.push((
                "contain.end".to_owned(),
                json!({
                    "run_id": run_id,
                    "verified_dead": outcome.verified_dead,
                    "complete": outcome.complete(),
                    "processes": outcome.processes,
                    "total_us": outcome.total_us,
                }),
            ));
            l.append_all(entries).context("recording the containment")?;
        }

        let report = json!({
            "run_id": run_id,
            "complete": outcome.complete(),
            "verified_dead": outcome.verified_dead,
            "steps": outcome.steps,
            "processes": outcome.processes,
            "total_us": outcome.total_us,
            "ledger": ledger.as_ref().and_then(|l| l.head()).map(|h| json!({"seq": h.seq, "head": h.hash_hex()})),
        });
        let text = serde_json::to_string_pretty(&report)?;
        println!("{text}");
        if let Some(p) = &self.report {
            let mut f = super::create_report_file(p)?;
            writeln!(f, "{text}")?;
        }
        for s in &outcome.steps {
            eprintln!(
                "cordon: contain {run_id}: {:<12} {:<20} {}",
                s.action, s.state, s.detail
            );
        }
        Ok(if outcome.complete() {
            0
        } else {
            EXIT_INCOMPLETE
        })
    }
}
