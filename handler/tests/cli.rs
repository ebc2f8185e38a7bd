//! The command line as a newcomer meets it, without AWS or a cluster: every
//! configuration problem exits 2 with one line naming what to set, before
//! any client is built; `--help` and `manifest` need no configuration.

use std::path::PathBuf;
use std::process::{Command, Output};

/// An empty home, so no AWS profile or kubeconfig of this machine is found.
fn empty_home() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "node-fencer-cli-{}-{}",
        std::process::id(),
        fastrand_suffix()
    ));
    std::fs::create_dir_all(&dir).expect("a temporary home");
    dir
}

fn fastrand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()))
}

/// Runs node-fencer with only `env` (and a PATH) in its environment.
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let home = empty_home();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_node-fencer"));
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &home)
        // No instance metadata here; a real laptop has none either.
        .env("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("node-fencer runs");
    let _ = std::fs::remove_dir_all(home);
    out
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Exit 2, nothing on stdout, and one line on stderr containing `needle`.
fn assert_config_error(out: &Output, needle: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line, no SDK dump: {err}");
    assert!(lines[0].starts_with("node-fencer: "), "{err}");
    assert!(lines[0].contains(needle), "{needle:?} in {err}");
}

const COMMANDS: [&[&str]; 6] = [
    &["check", "ip-10-0-1-1.ec2.internal"],
    &["fence", "i-0123456789abcdef0"],
    &["recover"],
    &["sweep"],
    &["preflight"],
    &["handle", "-"],
];

#[test]
fn a_missing_region_is_a_configuration_error_in_one_line() {
    for args in COMMANDS {
        let out = run(args, &[("KUBECONFIG", "/nonexistent")]);
        assert_config_error(&out, "AWS_REGION is not set");
    }
}

#[test]
fn a_missing_kubernetes_configuration_is_a_configuration_error_in_one_line() {
    for args in COMMANDS {
        let out = run(args, &[("AWS_REGION", "us-east-1")]);
        assert_config_error(&out, "KUBECONFIG");
        assert_config_error(&out, "CLUSTER_NAME");
    }
}

#[test]
fn an_invalid_setting_names_its_variable_and_exits_2() {
    for args in COMMANDS.iter().copied().chain([&["config"][..]]) {
        let out = run(
            args,
            &[("AWS_REGION", "us-east-1"), ("MAX_OUT_OF_SERVICE", "0")],
        );
        assert_config_error(&out, "MAX_OUT_OF_SERVICE");
    }
}

#[test]
fn bad_input_exits_2_before_any_client() {
    let env = [("AWS_REGION", "us-east-1"), ("KUBECONFIG", "/nonexistent")];
    // The configuration is checked first: a broken kubeconfig path is
    // reported before the target.
    let out = run(&["check", "Not_A_Node"], &env);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = run(&["frobnicate"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn help_and_manifest_need_no_configuration() {
    let out = run(&["--help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("Exit status: 0 done, 1 work left undone"),
        "{help}"
    );
    assert!(help.contains("sweep"), "{help}");
    let out = run(&["manifest"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let manifest: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the manifest is JSON");
    assert!(manifest["aws_actions"].is_array());
}
