//! The ledger, receipt and key commands as a user (or an outside checker)
//! runs them: outputs, exit codes of the contract (0 intact/valid, 1
//! tampered/invalid, 2 unusable input), and one-line errors for bad input.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn cordon(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(args)
        .output()
        .unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Bad input gets exactly one line on stderr, `cordon: …`, and no panic.
fn assert_one_line_error(o: &Output, want: &str) {
    let err = stderr(o);
    assert_eq!(code(o), 2, "stdout: {} stderr: {err}", stdout(o));
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("cordon: "), "{err}");
    assert!(err.contains(want), "wanted {want:?} in {err}");
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A ledger with `n` entries in `dir/L`.
fn ledger(dir: &Path, n: usize) -> PathBuf {
    let l = dir.join("L");
    for i in 0..n {
        let o = cordon(&[
            "ledger",
            "append",
            s(&l),
            "--kind",
            "test",
            "--data",
            &format!("{{\"i\":{i}}}"),
        ]);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let ack: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        assert_eq!(ack["seq"], i);
        assert_eq!(ack["hash"].as_str().unwrap().len(), 64);
    }
    l
}

fn rewrite_lines(file: &Path, f: impl FnOnce(&mut Vec<String>)) {
    let mut lines: Vec<String> = std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    f(&mut lines);
    std::fs::write(
        file,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
}

fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    let key = dir.join(format!("{}.key", name.replace('/', "_")));
    let o = cordon(&["key", "generate", "--out", s(&key), "--name", name]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    (key, stdout(&o).trim().to_owned())
}

#[test]
fn append_then_verify_is_intact_by_directory_and_by_file() {
    let dir = tempfile::tempdir().unwrap();
    let l = ledger(dir.path(), 3);
    let o = cordon(&["ledger", "verify", s(&l)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).starts_with("intact: "), "{}", stdout(&o));
    assert!(stdout(&o).contains("3 entries"));
    let o = cordon(&["ledger", "verify", s(&l.join("ledger.jsonl"))]);
    assert_eq!(code(&o), 0);
    let o = cordon(&["ledger", "verify", s(&l), "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["intact"].clone(), v["entries"].clone()),
        (Value::Bool(true), 3.into())
    );
}

#[test]
fn each_kind_of_tampering_exits_1_naming_the_first_bad_seq() {
    let dir = tempfile::tempdir().unwrap();
    let l = ledger(dir.path(), 6);
    let file = l.join("ledger.jsonl");
    let pristine = std::fs::read(&file).unwrap();
    type Edit = fn(&mut Vec<String>);
    let cases: [(&str, Edit, &str); 5] = [
        (
            "edit",
            |v| v[2] = v[2].replace("\"i\":2", "\"i\":9"),
            "ledger.jsonl:3: seq 2 edited",
        ),
        (
            "delete",
            |v| drop(v.remove(3)),
            "ledger.jsonl:4: seq 3 missing",
        ),
        ("swap", |v| v.swap(1, 2), "ledger.jsonl:2: seq 1 reordered"),
        (
            "duplicate",
            |v| v.insert(5, v[4].clone()),
            "ledger.jsonl:6: seq 4 inserted",
        ),
        (
            "junk",
            |v| v[0] = "\u{1}\u{2}binary".into(),
            "ledger.jsonl:1: seq 0 malformed",
        ),
    ];
    for (name, edit, want) in cases {
        std::fs::write(&file, &pristine).unwrap();
        rewrite_lines(&file, edit);
        let o = cordon(&["ledger", "verify", s(&l)]);
        assert_eq!(code(&o), 1, "{name}: {}{}", stdout(&o), stderr(&o));
        assert!(
            stdout(&o).starts_with("tampered: "),
            "{name}: {}",
            stdout(&o)
        );
        assert!(stdout(&o).contains(want), "{name}: {}", stdout(&o));
    }
}

#[test]
fn truncation_and_rewrites_behind_a_checkpoint_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let l = ledger(dir.path(), 5);
    let (key, vkey) = keygen(dir.path(), "cordon.test/k");
    let o = cordon(&["ledger", "checkpoint", s(&l), "--key", s(&key)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("\n5\n"));
    let o = cordon(&["ledger", "verify", s(&l), "--key", &vkey]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    assert!(stdout(&o).contains("signature verified"));
    let file = l.join("ledger.jsonl");
    rewrite_lines(&file, |v| v.truncate(3));
    let o = cordon(&["ledger", "verify", s(&l), "--key", &vkey]);
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).contains("seq 3 truncated"), "{}", stdout(&o));
    // A checkpoint by another key is not trusted.
    let (_k2, other) = keygen(dir.path(), "cordon.test/other");
    let o = cordon(&["ledger", "verify", s(&l), "--key", &other]);
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).contains("checkpoint mismatch"), "{}", stdout(&o));
    // Signing over the truncated ledger is refused.
    let o = cordon(&["ledger", "checkpoint", s(&l), "--key", s(&key)]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("refusing to sign"), "{}", stderr(&o));
}

#[test]
fn unusable_input_exits_2_with_one_line_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let l = ledger(dir.path(), 1);
    let missing = dir.path().join("nope");
    assert_one_line_error(
        &cordon(&["ledger", "verify", s(&missing)]),
        "no such ledger",
    );
    assert_one_line_error(
        &cordon(&[
            "ledger",
            "append",
            s(&l),
            "--kind",
            "k",
            "--data",
            "{not json",
        ]),
        "--data: not valid JSON: byte 1",
    );
    assert_one_line_error(
        &cordon(&["ledger", "append", s(&l), "--kind", "k", "--data", "[1,2]"]),
        "must be a JSON object",
    );
    assert_one_line_error(
        &cordon(&[
            "ledger",
            "append",
            s(&l),
            "--kind",
            "k",
            "--data",
            "{\"a\":1,\"a\":2}",
        ]),
        "duplicate member name",
    );
    let bad_cp = dir.path().join("bad.checkpoint");
    std::fs::write(&bad_cp, b"\x00\xffjunk").unwrap();
    assert_one_line_error(
        &cordon(&["ledger", "verify", s(&l), "--checkpoint", s(&bad_cp)]),
        "bad.checkpoint",
    );
    assert_one_line_error(
        &cordon(&["ledger", "verify", s(&l), "--key", "nobody+00000000+AAAA"]),
        "verifier key",
    );
    assert_one_line_error(
        &cordon(&["ledger", "verify", s(&l), "--key", "/no/such/key"]),
        "/no/such/key",
    );
    // A damaged last entry blocks appends rather than being "repaired".
    rewrite_lines(&l.join("ledger.jsonl"), |v| {
        v[0] = v[0].replace("\"i\":0", "\"i\":5")
    });
    assert_one_line_error(
        &cordon(&["ledger", "append", s(&l), "--kind", "k", "--data", "{}"]),
        "does not match its hash",
    );
}

#[test]
fn huge_lines_and_binary_junk_are_named_not_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let l = ledger(dir.path(), 2);
    let file = l.join("ledger.jsonl");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.extend(std::iter::repeat_n(b'x', 10 << 20));
    bytes.push(b'\n');
    std::fs::write(&file, &bytes).unwrap();
    let o = cordon(&["ledger", "verify", s(&l)]);
    assert_eq!(code(&o), 1);
    assert!(
        stdout(&o).contains("ledger.jsonl:3: seq 2 malformed: line is 10485760 bytes long"),
        "{}",
        stdout(&o)
    );
    let junk = dir.path().join("junk.jsonl");
    std::fs::write(
        &junk,
        (0..=255u8).cycle().take(100_000).collect::<Vec<u8>>(),
    )
    .unwrap();
    let o = cordon(&["ledger", "verify", s(&junk)]);
    assert_eq!(code(&o), 1, "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("junk.jsonl:1: seq 0 malformed"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn keys_are_0600_never_overwritten_and_refused_when_others_can_read_them() {
    let dir = tempfile::tempdir().unwrap();
    let (key, vkey) = keygen(dir.path(), "cordon.test/k");
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(vkey.starts_with("cordon.test/k+"), "{vkey}");
    let vfile = key.with_extension("vkey");
    assert_eq!(std::fs::read_to_string(&vfile).unwrap().trim(), vkey);
    assert_one_line_error(
        &cordon(&["key", "generate", "--out", s(&key), "--name", "x"]),
        "File exists",
    );
    let l = ledger(dir.path(), 1);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_one_line_error(
        &cordon(&["ledger", "checkpoint", s(&l), "--key", s(&key)]),
        "chmod 600",
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        code(&cordon(&["ledger", "checkpoint", s(&l), "--key", s(&key)])),
        0
    );
    // Generating into a directory names the file after the key.
    let o = cordon(&[
        "key",
        "generate",
        "--out",
        s(dir.path()),
        "--name",
        "cordon.test/dirkey",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(dir.path().join("cordon.test_dirkey.key").exists());
    assert_one_line_error(
        &cordon(&[
            "key",
            "generate",
            "--out",
            s(&dir.path().join("n")),
            "--name",
            "a b",
        ]),
        "not valid",
    );
}

#[test]
fn receipts_sign_and_verify_with_ed25519_and_hmac() {
    let dir = tempfile::tempdir().unwrap();
    let (key, vkey) = keygen(dir.path(), "cordon.test/r");
    let hmac = dir.path().join("shared.hmac");
    assert_eq!(
        code(&cordon(&[
            "key",
            "generate",
            "--out",
            s(&hmac),
            "--type",
            "hmac"
        ])),
        0
    );
    let payload = r#"{"run_id":"r1","verdict":"ALLOWED"}"#;
    for (signer, checker) in [
        (s(&key).to_owned(), vkey.clone()),
        (s(&hmac).to_owned(), s(&hmac).to_owned()),
    ] {
        let o = cordon(&["receipt", "sign", "--key", &signer, "--payload", payload]);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let receipt = dir.path().join("r.json");
        std::fs::write(&receipt, &o.stdout).unwrap();
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["version"], "cordon-receipt/1");
        let o = cordon(&["receipt", "verify", s(&receipt), "--key", &checker]);
        assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
        let tampered = String::from_utf8(std::fs::read(&receipt).unwrap())
            .unwrap()
            .replace("ALLOWED", "KILLED");
        std::fs::write(&receipt, tampered).unwrap();
        let o = cordon(&["receipt", "verify", s(&receipt), "--key", &checker]);
        assert_eq!(code(&o), 1, "{}", stdout(&o));
        assert!(stdout(&o).starts_with("invalid: "));
    }
    let receipt = dir.path().join("r.json");
    std::fs::write(&receipt, b"{\"version\":").unwrap();
    assert_one_line_error(
        &cordon(&["receipt", "verify", s(&receipt), "--key", &vkey]),
        "malformed receipt",
    );
    let short = dir.path().join("short.hmac");
    std::fs::write(&short, format!("{}\n", "ab".repeat(31))).unwrap();
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_one_line_error(
        &cordon(&["receipt", "sign", "--key", s(&short), "--payload", payload]),
        "short.hmac",
    );
}

#[test]
fn proofs_are_printed_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let l = ledger(dir.path(), 4);
    let (key, vkey) = keygen(dir.path(), "cordon.test/p");
    let old = dir.path().join("old.cp");
    assert_eq!(
        code(&cordon(&[
            "ledger",
            "checkpoint",
            s(&l),
            "--key",
            s(&key),
            "--out",
            s(&old)
        ])),
        0
    );
    for i in 0..3 {
        cordon(&[
            "ledger",
            "append",
            s(&l),
            "--kind",
            "k",
            "--data",
            &format!("{{\"more\":{i}}}"),
        ]);
    }
    assert_eq!(
        code(&cordon(&["ledger", "checkpoint", s(&l), "--key", s(&key)])),
        0
    );
    let o = cordon(&["ledger", "prove", s(&l), "--seq", "5"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let proof = dir.path().join("p.json");
    std::fs::write(&proof, &o.stdout).unwrap();
    let o = cordon(&["ledger", "verify-proof", s(&proof), "--key", &vkey]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("seq 5"));
    let forged = std::fs::read_to_string(&proof)
        .unwrap()
        .replace("\"more\":1", "\"more\":7");
    std::fs::write(&proof, forged).unwrap();
    assert_eq!(
        code(&cordon(&[
            "ledger",
            "verify-proof",
            s(&proof),
            "--key",
            &vkey
        ])),
        1
    );
    let o = cordon(&["ledger", "prove", s(&l), "--from", s(&old)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    std::fs::write(&proof, &o.stdout).unwrap();
    let o = cordon(&["ledger", "verify-proof", s(&proof), "--key", &vkey]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("at size 4 is a prefix of its tree at size 7"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn every_command_teaches_with_examples() {
    for cmd in [
        &["ledger", "append"][..],
        &["ledger", "verify"],
        &["ledger", "checkpoint"],
        &["ledger", "prove"],
        &["ledger", "verify-proof"],
        &["receipt", "sign"],
        &["receipt", "verify"],
        &["key", "generate"],
    ] {
        let mut args = cmd.to_vec();
        args.push("--help");
        let o = cordon(&args);
        assert_eq!(code(&o), 0);
        assert!(stdout(&o).contains("Examples:"), "{cmd:?}");
        assert!(stdout(&o).contains("Exit status"), "{cmd:?}");
    }
}
