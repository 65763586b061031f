//! Every validation error a policy author can meet, with its message and
//! location.

use std::path::{Path, PathBuf};

use cordon_policy::load::{LoadError, load};
use cordon_policy::{NetDest, NetMode};

use crate::{errors, policy, warnings};

#[test]
fn unknown_key_is_located_with_a_suggestion() {
    let text = "# a policy\n\n[network]\nmode = \"none\"\n\n[limits]\npids = 3\n\n\n\n[filesystem]\nwirte = [\"./workspace\"]\n";
    assert_eq!(
        errors(text),
        ["policy.toml:12:1: unknown key \"wirte\" in [filesystem] (did you mean \"write\"?)"]
    );
}

#[test]
fn unknown_keys_and_sections_everywhere() {
    let e = errors(
        "[netwrok]\nmode = \"none\"\n[limits]\nmemroy = \"1G\"\n[[sequences]]\nname = \"x\"\n[actions]\ncedar_fil = \"a\"\n",
    );
    assert_eq!(
        e,
        [
            "policy.toml:1:2: unknown section [netwrok] (did you mean \"network\"?)",
            "policy.toml:4:1: unknown key \"memroy\" in [limits] (did you mean \"memory\"?)",
            "policy.toml:5:3: unknown section [sequences] (did you mean \"sequence\"? (write [[sequence]]))",
            "policy.toml:7:1: warning: [actions] has no cedar rules: every action will be denied (add cedar = '''...''' or cedar_file = \"agent.cedar\")",
            "policy.toml:8:1: unknown key \"cedar_fil\" in [actions] (did you mean \"cedar_file\"?)",
        ]
    );
    let e = errors("[process]\nfoo = 1\n");
    assert_eq!(
        e,
        ["policy.toml:2:1: unknown key \"foo\" in [process] (expected one of \"env\", \"cwd\")"]
    );
}

#[test]
fn wrong_types() {
    let e = errors(
        "[filesystem]\nread = \"/usr\"\nwrite = [1]\n[network]\nmode = 3\ni_understand = \"yes\"\n[limits]\npids = \"256\"\ntimeout = 30\nmemory = true\n[process]\nenv = \"A=b\"\n",
    );
    assert_eq!(
        e,
        [
            "policy.toml:2:8: [filesystem] read must be a list of strings, found a string (write e.g. [\"/usr\", \"./workspace\"])",
            "policy.toml:3:10: [filesystem] write must contain only strings, found an integer (write e.g. [\"./workspace\"])",
            "policy.toml:5:8: [network] mode must be a string, found an integer (write e.g. mode = \"none\")",
            "policy.toml:6:16: [network] i_understand must be true or false, found a string",
            "policy.toml:8:8: [limits] pids must be a whole number, found a string (write e.g. pids = 256)",
            "policy.toml:9:11: [limits] timeout must be a duration string, found an integer (write e.g. timeout = \"30m\")",
            "policy.toml:10:10: [limits] memory must be a size like \"2G\", found a boolean",
            "policy.toml:12:7: [process] env must be a table, found a string (write it as a section: [process] env)",
        ]
    );
    assert_eq!(
        errors("filesystem = 3\n"),
        [
            "policy.toml:1:14: [filesystem] must be a table, found an integer (write it as a section: [filesystem])"
        ]
    );
}

#[test]
fn writable_root_in_every_spelling() {
    let e =
        errors("[filesystem]\nwrite = [\"/\", \"//\", \"/./\", \"/..\", \"../../../../../..\"]\n");
    assert_eq!(
        e,
        [
            "policy.toml:2:10: [filesystem] write includes the whole host file system (name the directories the command must change, e.g. \"./workspace\")",
            "policy.toml:2:15: [filesystem] write includes the whole host file system (\"//\" is \"/\") (name the directories the command must change, e.g. \"./workspace\")",
            "policy.toml:2:21: [filesystem] write includes the whole host file system (\"/./\" is \"/\") (name the directories the command must change, e.g. \"./workspace\")",
            "policy.toml:2:28: [filesystem] write includes the whole host file system (\"/..\" is \"/\") (name the directories the command must change, e.g. \"./workspace\")",
            "policy.toml:2:35: [filesystem] write includes the whole host file system (\"../../../../../..\" is \"/\") (name the directories the command must change, e.g. \"./workspace\")",
        ]
    );
    // Negative control: a work directory is fine, and `/` may be read (with
    // a warning).
    assert!(warnings("[filesystem]\nwrite = [\"./w\"]\n").is_empty());
    assert_eq!(
        warnings("[filesystem]\nread = [\"/\"]\n"),
        [
            "policy.toml:2:9: warning: [filesystem] read includes \"/\": the command may read every file on the host, secrets included (name the directories it needs, e.g. \"/usr\")"
        ]
    );
}

#[test]
fn writable_host_directories_warn() {
    assert_eq!(
        warnings("[filesystem]\nwrite = [\"/etc/app\", \"/\\u0075sr/local/..\"]\n"),
        [
            "policy.toml:2:22: warning: [filesystem] write /usr covers /usr: the command could change the host itself (write only to a work directory, e.g. \"./workspace\")",
        ]
    );
    assert_eq!(
        warnings("[filesystem]\nwrite = [\"/var\", \"/home\"]\n"),
        [
            "policy.toml:2:10: warning: [filesystem] write /var covers /var: the command could change the host itself (write only to a work directory, e.g. \"./workspace\")"
        ]
    );
}

#[test]
fn paths_resolve_against_the_policy_directory_lexically() {
    let p = policy(
        "[filesystem]\nread = [\"data\", \"../shared/./x\", \"/abs//y/\"]\nexec = []\n[process]\ncwd = \".\"\n",
    );
    assert_eq!(
        p.filesystem.read,
        [
            PathBuf::from("/srv/policies/data"),
            PathBuf::from("/srv/shared/x"),
            PathBuf::from("/abs/y")
        ]
    );
    assert_eq!(
        p.filesystem.exec,
        Some(vec![]),
        "an empty exec list forbids exec everywhere"
    );
    assert_eq!(p.process.cwd.as_deref(), Some(Path::new("/srv/policies")));
    assert_eq!(
        policy("").filesystem.exec,
        None,
        "no exec key: not restricted by path"
    );
    assert_eq!(
        errors("[filesystem]\nread = [\"~/src\", \"\"]\n"),
        [
            "policy.toml:2:9: \"~/src\" in [filesystem] read: '~' is not expanded (write the absolute path, or a path relative to the policy file)",
            "policy.toml:2:18: empty path in [filesystem] read (write e.g. \"./workspace\")",
        ]
    );
}

#[test]
fn everything_allow_entries_need_i_understand() {
    let e = errors(
        "[network]\nmode = \"allow\"\nallow = [\"10.0.0.0/8\", \"0.0.0.0/0\", \"::/0:443\"]\n",
    );
    assert_eq!(
        e,
        [
            "policy.toml:3:24: [network] allow \"0.0.0.0/0\" allows every address (set i_understand = true in [network] if you mean it, or name the destinations)",
            "policy.toml:3:37: [network] allow: invalid network destination \"::/0:443\": an IPv6 block with a port needs brackets (write \"[::/0]:443\")",
        ]
    );
    let p = policy(
        "[network]\nmode = \"allow\"\ni_understand = true\nallow = [\"0.0.0.0/0\", \"[::/0]:443\"]\n",
    );
    assert_eq!(p.network.mode, NetMode::Allow);
    assert!(p.network.i_understand);
    assert_eq!(
        p.network.allow,
        [
            NetDest::parse("0.0.0.0/0").unwrap(),
            NetDest::parse("[::/0]:443").unwrap()
        ]
    );
    assert_eq!(
        warnings("[network]\nmode = \"allow\"\ni_understand = true\nallow = [\"10.0.0.0/8\"]\n"),
        [
            "policy.toml:3:16: warning: [network] i_understand = true has no effect: no allow entry covers every address (remove it)"
        ]
    );
}

#[test]
fn network_mode_consistency() {
    assert_eq!(
        errors("[network]\nmode = \"allow\"\n"),
        [
            "policy.toml:2:8: [network] mode = \"allow\" with an empty allow list (list destinations in allow, or use mode = \"none\")"
        ]
    );
    assert_eq!(
        errors("[network]\nmode = \"none\"\nallow = [\"10.0.0.0/8\"]\n"),
        [
            "policy.toml:3:9: [network] allow is only used with mode = \"allow\" (mode is \"none\") (set mode = \"allow\", or remove allow)"
        ]
    );
    assert_eq!(
        errors("[network]\nallow = [\"10.1.2.3/24\", \"bad host\"]\nmode = \"allow\"\n"),
        [
            "policy.toml:2:10: [network] allow: invalid network destination \"10.1.2.3/24\": host bits are set (did you mean \"10.1.2.0/24\"?)",
            "policy.toml:2:25: [network] allow: invalid network destination \"bad host\": ' ' is not allowed in a host name (write an IP block like \"10.0.0.0/8\" or a name like \"api.example.com:443\")",
        ]
    );
    assert_eq!(
        errors("[network]\nmode = \"nnoe\"\n"),
        ["policy.toml:2:8: unknown network mode \"nnoe\" (did you mean \"none\"?)"]
    );
    assert_eq!(
        warnings("[network]\nmode = \"host\"\n"),
        [
            "policy.toml:2:8: warning: [network] mode = \"host\" shares the host's network: there is no network boundary (use mode = \"allow\" with the destinations the command needs)"
        ]
    );
    assert_eq!(
        policy("").network.mode,
        NetMode::None,
        "no network by default"
    );
}

#[test]
fn limits_out_of_range() {
    let e = errors("[limits]\nmemory = 0\npids = 0\ntimeout = \"0s\"\ncpu = 0\n");
    assert_eq!(
        e,
        [
            "policy.toml:2:10: [limits] memory = 0 runs nothing (leave the limit out, or write e.g. \"2G\")",
            "policy.toml:3:8: [limits] pids = 0 runs nothing (leave the limit out, or write e.g. 256)",
            "policy.toml:4:11: [limits] timeout: invalid duration \"0s\": zero duration (a zero limit runs nothing; leave the limit out instead)",
            "policy.toml:5:7: [limits] cpu must be between 0.001 and 4096 cores (write e.g. cpu = 1.5)",
        ]
    );
    let e = errors("[limits]\nmemory = \"12Q\"\npids = -1\ntimeout = \"-3s\"\n");
    assert_eq!(
        e,
        [
            "policy.toml:2:10: [limits] memory: invalid size \"12Q\": unknown unit \"Q\" (use K, M, G or T)",
            "policy.toml:3:8: [limits] pids must not be negative (write e.g. pids = 256)",
            "policy.toml:4:11: [limits] timeout: invalid duration \"-3s\": negative duration (write e.g. \"3s\")",
        ]
    );
    assert_eq!(
        errors("[limits]\npids = 4294967296\n"),
        ["policy.toml:2:8: [limits] pids is too large (the largest is 4294967295)"]
    );
    let l = policy("[limits]\nmemory = 1048576\ncpu = 0.5\n").limits;
    assert_eq!((l.memory, l.cpu_millicores), (Some(1 << 20), Some(500)));
}

#[test]
fn process_environment() {
    let p = policy("[process]\nenv = { LANG = \"C.UTF-8\", _X = \"\" }\n");
    assert_eq!(
        p.process.env.get("LANG").map(String::as_str),
        Some("C.UTF-8")
    );
    assert_eq!(
        errors("[process.env]\n\"A-B\" = \"x\"\nOK = 1\n"),
        [
            "policy.toml:2:1: [process] env: \"A-B\" is not a variable name (use letters, digits and '_', not starting with a digit)",
            "policy.toml:3:6: [process] env OK must be a string, found an integer (write e.g. OK = \"1\")",
        ]
    );
}

#[test]
fn inline_cedar_errors_are_located_in_the_toml_file() {
    let text = "[actions]\ncedar = '''\n@id(\"ok\") permit(principal, action, resource);\n@id(\"typo\")\npermit(principal, acton, resource);\n'''\n";
    assert_eq!(
        errors(text),
        [
            "policy.toml:5:19: invalid cedar: found an invalid variable in the policy scope: acton (policy scopes must contain a `principal`, `action`, and `resource` element in that order)"
        ]
    );
    // Basic strings with escapes are mapped through the escapes.
    let text = "[actions]\ncedar = \"@id(\\\"a\\\") permit(principal, action, resource) when { 1 = 1 };\"\n";
    let e = errors(text);
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("policy.toml:2:64: invalid cedar: '=' is not a valid operator"),
        "{e:?}"
    );
}

#[test]
fn cedar_rules_must_name_themselves_and_use_known_annotations() {
    let text = r#"[actions]
cedar = '''
permit(principal, action, resource);
@id("dup") permit(principal, action, resource);
@id("dup") permit(principal, action, resource);
@id("x") @effect("stop") forbid(principal, action, resource);
@id("y") @effect("halt") permit(principal, action, resource);
@id("z") @efect("halt") forbid(principal, action, resource);
@id("default-deny") permit(principal, action, resource);
@id("has space") permit(principal, action, resource);
@id("t") permit(principal == ?principal, action, resource);
'''
"#;
    assert_eq!(
        errors(text),
        [
            "policy.toml:3:1: cedar policy has no @id annotation (write @id(\"some-name\") before permit or forbid: decisions name the rule that decided)",
            "policy.toml:5:1: duplicate rule id \"dup\" (another policy already uses it; ids must be unique)",
            "policy.toml:6:10: unknown @effect(\"stop\") (the only effect is \"halt\"; leave @effect out for a plain deny)",
            "policy.toml:7:10: @effect on a permit policy (@effect(\"halt\") applies only to forbid policies)",
            "policy.toml:8:10: unknown annotation @efect (did you mean \"effect\"?)",
            "policy.toml:9:1: rule id \"default-deny\" is reserved for the engine's own decisions (pick another id)",
            "policy.toml:10:1: invalid rule id \"has space\" (use a non-empty id without spaces, e.g. \"read-ok\")",
            "policy.toml:11:1: cedar templates (policies with ?principal or ?resource slots) are not supported (write the entity directly, e.g. principal == Agent::\"a1\")",
        ]
    );
}

#[test]
fn a_missing_semicolon_is_not_silently_dropped() {
    let e = errors("[actions]\ncedar = '''@id(\"a\") permit(principal, action, resource)'''\n");
    assert_eq!(e.len(), 1);
    assert!(e[0].starts_with("policy.toml:2:"), "{e:?}");
    assert!(e[0].contains("invalid cedar"), "{e:?}");
}

#[test]
fn cedar_files_are_read_relative_to_the_policy_and_located_in_themselves() {
    let text = "[actions]\ncedar_file = \"rules/agent.cedar\"\n";
    let mut asked = Vec::new();
    let err = load("conf/p.toml", text, Path::new("/etc/cordon/conf"), &mut |path| {
        asked.push(path.to_path_buf());
        Ok("@id(\"a\") permit(principal, action, resource);\n\n  @id(\"b\") permit(principal, action, resorce);\n".into())
    })
    .unwrap_err();
    assert_eq!(asked, [PathBuf::from("/etc/cordon/conf/rules/agent.cedar")]);
    let rendered: Vec<String> = err.diagnostics().iter().map(ToString::to_string).collect();
    assert_eq!(rendered.len(), 2);
    assert_eq!(
        rendered[0],
        "conf/p.toml:2:14: cedar file conf/rules/agent.cedar has errors (listed below)"
    );
    assert!(rendered[1].starts_with("conf/rules/agent.cedar:3:38: invalid cedar: found an invalid variable in the policy scope: resorce"), "{rendered:?}");

    let err = load("p.toml", text, Path::new("/x"), &mut |_| {
        Err("No such file or directory (os error 2)".into())
    })
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "p.toml:2:14: cannot read cedar file \"rules/agent.cedar\" (/x/rules/agent.cedar): No such file or directory (os error 2) (the path is relative to the policy file's directory)"
    );
    let loaded = load("p.toml", text, Path::new("/x"), &mut |_| {
        Ok("@id(\"a\") permit(principal, action, resource);".into())
    })
    .unwrap();
    assert_eq!(loaded.policy.actions.rules.len(), 1);
    assert_eq!(
        loaded.policy.actions.source.as_deref(),
        Some("/x/rules/agent.cedar")
    );
    assert_eq!(
        errors("[actions]\ncedar = ''''''\ncedar_file = \"a.cedar\"\n"),
        [
            "policy.toml:3:14: [actions] has both cedar and cedar_file (keep one: inline text or a file)"
        ]
    );
}

#[test]
fn sequence_rules_are_checked() {
    let text = r#"
[[sequence]]
name = "s"
actions = []
decision = "halt"

[[sequence]]
name = "s"
actions = ["a", "b"]
decision = "stop"

[[sequence]]
actions = ["a"]

[[sequence]]
name = "w"
actions = ["a", "b", "c"]
decision = "deny"
within_actions = 2
within_time = "soon"
consecutive = "yes"
where = [{ step = 4, field = "args.x", in = ["y"] }, { step = 1, field = "dest", not_in = [] }, { step = 1, field = "args.x" }, { step = 2, field = "resource", in = ["a"], not_in = ["b"] }]
"#;
    assert_eq!(
        errors(text),
        [
            "policy.toml:4:11: sequence \"s\" actions is empty (name at least one action)",
            "policy.toml:8:8: duplicate sequence name \"s\" (names must be unique)",
            "policy.toml:10:12: unknown sequence \"s\" decision \"stop\" (expected one of \"deny\", \"halt\")",
            "policy.toml:12:1: [[sequence]] has no name (add name = \"...\": decisions name the rule)",
            "policy.toml:12:1: [[sequence]] decision is missing (write decision = \"deny\" or decision = \"halt\")",
            "policy.toml:19:18: sequence \"w\" within_actions = 2 can never be met: the sequence has 3 steps (use at least 3)",
            "policy.toml:20:15: sequence \"w\" within_time: invalid duration \"soon\": expected a number at \"soon\" (write e.g. \"30s\" or \"1h30m\")",
            "policy.toml:21:15: sequence \"w\" consecutive must be true or false, found a string",
            "policy.toml:22:19: sequence \"w\" where step = 4 is not a step of the sequence (steps are numbered 1 to 3)",
            "policy.toml:22:74: unknown field \"dest\" in sequence \"w\" where (use \"resource\" or \"args.<name>\"; did you mean \"args.dest\"?)",
            "policy.toml:22:91: sequence \"w\" where has an empty pattern list (list at least one pattern)",
            "policy.toml:22:97: sequence \"w\" where has neither in nor not_in (write e.g. not_in = [\"s3://corp-bucket/*\"])",
            "policy.toml:22:182: sequence \"w\" where has both in and not_in (keep one; write two conditions for both)",
        ]
    );
}

#[test]
fn sequence_names_and_cedar_ids_share_one_namespace() {
    let e = errors(
        "[actions]\ncedar = '''@id(\"x\") permit(principal, action, resource);'''\n[[sequence]]\nname = \"x\"\nactions = [\"a\"]\ndecision = \"deny\"\n",
    );
    assert_eq!(
        e,
        [
            "policy.toml:4:8: sequence name \"x\" is also the @id of a cedar rule (rule ids must be unique, so decisions name one rule)"
        ]
    );
}

#[test]
fn invalid_toml_is_located() {
    let e = errors("[filesystem]\nread = [\"/usr\"\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("policy.toml:2:"), "{e:?}");
    assert!(e[0].contains("invalid TOML"), "{e:?}");
}

#[test]
fn all_errors_are_collected() {
    let text =
        "[filesystem]\nwrite = [\"/\"]\n[network]\nmode = \"allow\"\n[limits]\npids = 0\n[bogus]\n";
    let e = errors(text);
    assert_eq!(e.len(), 4, "{e:?}");
    let err = cordon_policy::load::parse("policy.toml", text, Path::new("/")).unwrap_err();
    let LoadError::Invalid { file, diagnostics } = &err;
    assert_eq!(file, "policy.toml");
    assert_eq!(err.to_string().lines().count(), diagnostics.len());
}

#[test]
fn the_contract_example_loads() {
    let p = policy(
        r#"
[filesystem]
read  = ["/usr", "/etc/ssl"]
write = ["./workspace"]
exec  = ["/usr/bin"]
[network]
mode  = "allow"
allow = ["10.1.2.0/24", "api.example.com:443"]
[limits]
memory = "2G"
pids = 256
timeout = "30m"
[actions]
cedar = '''@id("read-ok") permit(principal, action == Action::"read_file", resource);'''
[[sequence]]
name = "prevent-download-upload-delete"
actions = ["download_file", "upload_file", "delete_file"]
decision = "halt"
"#,
    );
    assert_eq!(
        p.filesystem.write,
        [PathBuf::from("/srv/policies/workspace")]
    );
    assert_eq!(p.network.allow[1].to_string(), "api.example.com:443");
    assert_eq!(p.actions.rules[0].id, "read-ok");
    assert_eq!(p.sequences[0].name, "prevent-download-upload-delete");
}
