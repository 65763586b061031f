//! `cordon receipt …`: sign and verify `cordon-receipt/1` documents.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use cordon_ledger::keys;
use cordon_ledger::receipt::{MAX_RECEIPT, Receipt, ReceiptError};
use serde_json::Value;

#[derive(Debug, Subcommand)]
pub enum ReceiptCommand {
    /// Sign a JSON payload, printing the receipt
    #[command(after_help = "\
The signature covers the RFC 8785 canonical bytes of the payload. KEY is a private key file from
`cordon key generate`: Ed25519 (anyone with the verifier key can check the receipt) or HMAC (only
holders of the shared secret can check it, and any of them could have made it).

Examples:
  cordon receipt sign --key ledger.key --payload '{\"run_id\":\"r1\",\"verdict\":\"ALLOWED\"}'
  cordon receipt sign --key shared.hmac --payload @payload.json > receipt.json

Exit status: 0 signed; 2 unusable input.")]
    Sign(SignArgs),
    /// Check a receipt's signature
    #[command(after_help = "\
KEY is an Ed25519 verifier key (the vkey string, inline or in a file) or an HMAC key file (64 hex
digits; it must be readable by its owner only).

Examples:
  cordon receipt verify receipt.json --key ledger.vkey
  cordon receipt verify receipt.json --key 'cordon+1a2b3c4d+AQ…'

Exit status: 0 valid; 1 invalid (wrong key, edited payload or signature); 2 unusable input.")]
    Verify(VerifyArgs),
}

#[derive(Debug, Args)]
pub struct SignArgs {
    /// Private key file (Ed25519 or HMAC)
    #[arg(long)]
    key: PathBuf,
    /// The payload: a JSON object, or @FILE
    #[arg(long)]
    payload: String,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Receipt file (- for standard input)
    receipt: PathBuf,
    /// Verifier key (vkey string or file) or HMAC key file
    #[arg(long)]
    key: String,
}

impl ReceiptCommand {
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            ReceiptCommand::Sign(a) => {
                let key = keys::load_private(&a.key)?;
                let Value::Object(payload) = super::ledger::json_arg("--payload", &a.payload)?
                else {
                    bail!("--payload: must be a JSON object");
                };
                let receipt = Receipt::sign(payload, &key)?;
                println!("{}", String::from_utf8(receipt.to_json()?)?);
                Ok(0)
            }
            ReceiptCommand::Verify(a) => {
                let bytes = if a.receipt.as_os_str() == "-" {
                    let mut b = Vec::new();
                    std::io::Read::read_to_end(
                        &mut std::io::Read::take(std::io::stdin(), MAX_RECEIPT as u64 + 1),
                        &mut b,
                    )
                    .context("cannot read standard input")?;
                    b
                } else {
                    cordon_ledger::proof::read_limited(&a.receipt, MAX_RECEIPT as u64)
                        .with_context(|| format!("cannot read {}", a.receipt.display()))?
                };
                let key = keys::load_check_key(&a.key)?;
                let receipt =
                    Receipt::parse(&bytes).with_context(|| a.receipt.display().to_string())?;
                match receipt.verify(&key) {
                    Ok(()) => {
                        println!(
                            "valid: {}: {} signature by key {}",
                            a.receipt.display(),
                            receipt.alg.name(),
                            receipt.key_id
                        );
                        Ok(0)
                    }
                    Err(e @ ReceiptError::Verify(_)) => {
                        println!("invalid: {}: {e}", a.receipt.display());
                        Ok(1)
                    }
                    Err(e) => Err(e).context(a.receipt.display().to_string()),
                }
            }
        }
    }
}
