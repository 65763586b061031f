//! `cordon key generate`: make signing keys.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use cordon_ledger::keys::{self, HmacKey, PrivateKey, SigningKey};

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Generate a key; print its verifier key (vkey)
    #[command(after_help = "\
Writes the private key to a new file with mode 0600 (never overwriting one). An Ed25519 key is
written as PRIVATE+KEY+<name>+<key id>+<base64> (the Go note format) with its verifier key beside
it in <file>.vkey; the vkey (<name>+<key id>+<base64>) is printed: publish it, it is what others
verify checkpoints and receipts with. An HMAC key is 64 hex digits; its key id is printed.

Examples:
  cordon key generate --out keys/ --name cordon.example/ledger
  cordon key generate --out shared.hmac --type hmac

Exit status: 0 written; 2 unusable input (file exists, bad name).")]
    Generate(GenerateArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum KeyType {
    Ed25519,
    Hmac,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Key file to create, or an existing directory to create <name>.key in
    #[arg(long)]
    out: PathBuf,
    /// Key name (signed-note names: no spaces, no '+')
    #[arg(long, default_value = "cordon")]
    name: String,
    /// Key type
    #[arg(long = "type", value_enum, default_value = "ed25519")]
    key_type: KeyType,
}

fn vkey_path(key: &Path) -> PathBuf {
    match key.extension() {
        Some(e) if e == "key" => key.with_extension("vkey"),
        _ => PathBuf::from(format!("{}.vkey", key.display())),
    }
}

impl KeyCommand {
    pub fn run(self) -> anyhow::Result<u8> {
        let KeyCommand::Generate(a) = self;
        let out = if a.out.is_dir() {
            let file_name = a.name.replace('/', "_");
            a.out.join(match a.key_type {
                KeyType::Ed25519 => format!("{file_name}.key"),
                KeyType::Hmac => format!("{file_name}.hmac"),
            })
        } else {
            a.out
        };
        match a.key_type {
            KeyType::Ed25519 => {
                let key = SigningKey::generate(&a.name)?;
                let vkey = key.verifier().to_vkey();
                keys::write_private(&out, &PrivateKey::Ed25519(Box::new(key)))?;
                let vpath = vkey_path(&out);
                keys::write_public(&vpath, &vkey)
                    .with_context(|| format!("private key written to {}", out.display()))?;
                eprintln!(
                    "cordon: wrote private key {} (mode 0600) and verifier key {}",
                    out.display(),
                    vpath.display()
                );
                println!("{vkey}");
            }
            KeyType::Hmac => {
                let key = HmacKey::generate();
                let id = key.key_id();
                keys::write_private(&out, &PrivateKey::Hmac(key))?;
                eprintln!("cordon: wrote HMAC key {} (mode 0600)", out.display());
                println!("{id}");
            }
        }
        Ok(0)
    }
}
