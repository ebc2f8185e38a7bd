//! The real binary under the Lambda runtime emulator: `cargo lambda watch`
//! serves the Runtime API and Function URLs, `cargo lambda invoke` sends
//! events. Started once per test process, stopped when the process exits.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::{Stack, repo_root};

/// The bearer token the emulated function is configured with.
pub const WEBHOOK_TOKEN: &str = "test-token-0123456789abcdef";

/// A running `cargo lambda watch`.
#[derive(Debug)]
pub struct Emulator {
    /// The invoke port on 127.0.0.1.
    pub port: u16,
    /// Its log file.
    pub log: PathBuf,
    /// The function's name, its binary's: `node-fencer`, or `node-fencer-full`
    /// (the same main built with every feature).
    pub function: &'static str,
}

/// The package and binary an emulator runs.
#[derive(Clone, Copy, Debug)]
struct Function {
    package: &'static str,
    bin: &'static str,
}

/// The handler's binary, as the Lambda package builds it (default features).
const LAMBDA: Function = Function {
    package: "node-fencer",
    bin: "node-fencer",
};

/// The handler's `main` built with every feature, a binary of the
/// harness's package (see `tests/Cargo.toml`).
const FULL: Function = Function {
    package: "node-fencer-tests",
    bin: "node-fencer-full",
};

static EMULATOR: OnceLock<Result<Emulator, String>> = OnceLock::new();

/// The emulator of this test process, started on first use.
///
/// # Panics
/// When `cargo lambda` is missing or does not start: run `make setup`.
pub fn emulator(stack: &Stack) -> &'static Emulator {
    match EMULATOR.get_or_init(|| start(stack).map_err(|e| format!("{e:#}"))) {
        Ok(e) => e,
        Err(e) => panic!("cargo lambda watch is not available: {e}"),
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts a new emulator for `stack` (e.g. the controller stack of
/// [`crate::cluster::cluster_stack`]), with the same function configuration
/// as [`emulator`] except for the variables in `overrides` (e.g.
/// `MAX_OUT_OF_SERVICE`). Each call starts its own `cargo lambda watch`,
/// which runs until this process exits.
pub fn start_emulator(stack: &Stack, overrides: &[(&str, &str)]) -> anyhow::Result<Emulator> {
    start_with(stack, overrides, LAMBDA)
}

/// [`start_emulator`] for Compute Engine: the handler's `main` built with
/// every feature (the Lambda package has no Compute Engine client; the binary is
/// `node-fencer-full` of the harness's package, so the emulator reuses the
/// test build), pointed at the fake Compute Engine of [`crate::gce`]
/// (`COMPUTE_ENDPOINT`), which is started for `stack` if it is not running.
pub fn start_gce_emulator(stack: &Stack, overrides: &[(&str, &str)]) -> anyhow::Result<Emulator> {
    let endpoint = crate::gce::started_fake(&stack.dir)?.endpoint();
    let mut with = vec![("COMPUTE_ENDPOINT", endpoint.as_str())];
    with.extend_from_slice(overrides);
    start_with(stack, &with, FULL)
}

/// [`start_emulator`] with the handler built as the harness builds it
/// (`node-fencer-full`, the same `main`): a run that builds the harness
/// anyway (`make run`) builds the dependency tree once, not twice with two
/// feature sets. The Lambda package itself is `make package`'s.
pub fn start_harness_emulator(
    stack: &Stack,
    overrides: &[(&str, &str)],
) -> anyhow::Result<Emulator> {
    start_with(stack, overrides, FULL)
}

fn start(stack: &Stack) -> anyhow::Result<Emulator> {
    start_with(stack, &[], LAMBDA)
}

/// The function's environment on the stack: the restricted kubeconfig,
/// moto's endpoint and credentials, the webhook token, JSON logs. A Node
/// still Ready is waited for 5 s only: on the bare stack nothing turns it
/// NotReady but a test (the controller stack's scenarios ask for more).
pub fn function_env(stack: &Stack) -> [(&'static str, &str); 12] {
    [
        ("KUBECONFIG", stack.var("NODE_FENCER_KUBECONFIG_RESTRICTED")),
        ("AWS_ENDPOINT_URL", stack.var("AWS_ENDPOINT_URL")),
        ("AWS_REGION", stack.var("AWS_REGION")),
        ("AWS_ACCESS_KEY_ID", stack.var("AWS_ACCESS_KEY_ID")),
        ("AWS_SECRET_ACCESS_KEY", stack.var("AWS_SECRET_ACCESS_KEY")),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("WEBHOOK_TOKEN", WEBHOOK_TOKEN),
        ("MAX_OUT_OF_SERVICE", "1000"),
        ("VOLUME_DETACH_TIMEOUT_SECONDS", "10"),
        ("NOT_READY_WAIT_SECONDS", "5"),
        ("LOG_FORMAT", "json"),
        ("RUST_LOG", "info"),
    ]
}

fn start_with(
    stack: &Stack,
    overrides: &[(&str, &str)],
    function: Function,
) -> anyhow::Result<Emulator> {
    let port = free_port()?;
    let env_file = stack.dir.join(format!("lambda-{port}.env"));
    let mut f = std::fs::File::create(&env_file)?;
    let defaults = function_env(stack);
    for (k, v) in &defaults {
        let v = overrides
            .iter()
            .find(|(name, _)| name == k)
            .map_or(*v, |(_, value)| *value);
        writeln!(f, "{k}={v}")?;
    }
    for (k, v) in overrides {
        if !defaults.iter().any(|(name, _)| name == k) {
            writeln!(f, "{k}={v}")?;
        }
    }
    let log = stack
        .dir
        .join("logs")
        .join(format!("cargo-lambda-{port}.log"));
    let log_file = std::fs::File::create(&log)?;
    // The emulator runs in its own session; a shell beside it ends the whole
    // group when this test process is gone, so no run leaks an emulator.
    let script = format!(
        "cargo lambda watch --ignore-changes --invoke-address 127.0.0.1 --invoke-port {port} \
         --env-file '{}' --package {package} --bin {bin} & \
         while kill -0 {pid} 2>/dev/null; do sleep 1; done; kill -- -$$",
        env_file.display(),
        package = function.package,
        bin = function.bin,
        pid = std::process::id()
    );
    let mut emulator = Command::new("setsid");
    // The variables cargo sets for this process (CARGO_MANIFEST_DIR,
    // CARGO_PKG_*, ...) would reach the emulator's own cargo and its build
    // scripts, which rebuild (ring's does) whenever they differ from the
    // build before.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
            "CARGO_PRIMARY_",
            "CARGO_TARGET_TMPDIR",
        ]
        .iter()
        .any(|p| name.starts_with(p))
        {
            emulator.env_remove(name.as_ref());
        }
    }
    emulator
        .arg("bash")
        .arg("-c")
        .arg(script)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .spawn()
        .context("starting cargo lambda watch (is the stack venv on PATH? run `make setup`)")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!(
                "cargo lambda watch did not listen on {port}; see {}",
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let emulator = Emulator {
        port,
        log,
        function: function.bin,
    };
    // The emulator builds the function on its first invocation: a harmless
    // one here (a check of a Node that does not exist), so that no test's
    // own first invocation waits for a build, however loaded the machine.
    let _ = emulator.invoke(&serde_json::json!({"action": "check", "node": "warm-up"}));
    Ok(emulator)
}

/// The answer to one invocation.
#[derive(Debug)]
pub struct Invocation {
    /// Whether the function returned an error.
    pub error: bool,
    /// The payload (the report, the Function URL response, or the error).
    pub output: String,
}

impl Emulator {
    /// The CloudWatch EMF lines the function wrote for one invocation, found
    /// in the emulator's log by their `CorrelationId` (waits up to 5 s for
    /// the log to catch up).
    pub fn metric_lines(&self, correlation_id: &str) -> anyhow::Result<Vec<Value>> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let log = std::fs::read_to_string(&self.log)?;
            let lines: Vec<Value> = log
                .lines()
                .filter(|l| l.starts_with('{') && l.contains("\"_aws\""))
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|v| v["CorrelationId"] == correlation_id)
                .collect();
            if !lines.is_empty() || Instant::now() > deadline {
                return Ok(lines);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends an event with `cargo lambda invoke`, as the Lambda service would.
    pub fn invoke(&self, event: &Value) -> anyhow::Result<Invocation> {
        let file = tempfile_with(&event.to_string())?;
        let out = Command::new("cargo")
            .args([
                "lambda",
                "invoke",
                self.function,
                "--invoke-address",
                "127.0.0.1",
            ])
            .args(["--invoke-port", &self.port.to_string()])
            .arg("--data-file")
            .arg(&file)
            .args(["--output-format", "json"])
            .output()
            .context("running cargo lambda invoke")?;
        let _ = std::fs::remove_file(&file);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        Ok(Invocation {
            error: !out.status.success(),
            output: if out.status.success() {
                stdout
            } else {
                format!("{stdout}{stderr}")
            },
        })
    }

    /// Posts to the emulated Function URL; returns the HTTP status and body.
    pub fn post_function_url(
        &self,
        body: &str,
        authorization: Option<&str>,
    ) -> anyhow::Result<(u16, String)> {
        let file = tempfile_with(body)?;
        let mut cmd = Command::new("curl");
        cmd.args([
            "-sS",
            "--max-time",
            "600",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
        ])
        .args(["-H", "content-type: application/json"])
        .arg("--data-binary")
        .arg(format!("@{}", file.display()));
        if let Some(a) = authorization {
            cmd.args(["-H", &format!("authorization: {a}")]);
        }
        let out = cmd
            .arg(format!(
                "http://127.0.0.1:{}/lambda-url/{}/",
                self.port, self.function
            ))
            .output()
            .context("running curl")?;
        let _ = std::fs::remove_file(&file);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').context("no status from curl")?;
        Ok((code.trim().parse()?, body.to_owned()))
    }
}

fn tempfile_with(content: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::temp_dir().join(format!(
        "node-fencer-event-{}.json",
        crate::fixtures::unique("ev")
    ));
    std::fs::write(&path, content)?;
    Ok(path)
}
