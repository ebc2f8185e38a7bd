//! The function under AWS's own Lambda Runtime Interface Emulator
//! (`aws-lambda-rie`, the Runtime API of Lambda's base images), as Lambda
//! runs it: each invocation's deadline is its start plus
//! `AWS_LAMBDA_FUNCTION_TIMEOUT`; an invocation that overruns it is answered
//! "Task timed out" and its process killed; a process that exits mid-run
//! is answered `Runtime.ExitError`; either way the next invocation starts a
//! fresh process (a new init). `cargo lambda watch` ([`crate::lambda`])
//! does none of this: it sends a constant deadline and never kills.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::lambda::function_env;
use crate::process::{Watched, signal, spawn_watched};
use crate::{Stack, repo_root};

/// The function timeout of the Terraform module at its defaults
/// (`infra/modules/node-fencer`, `local.function_timeout`), in seconds.
/// `tests/infra/test_tofu_plan.py` holds it to the module's plan.
pub const MODULE_DEFAULT_TIMEOUT_SECONDS: u64 = 270;

/// A binary the emulator can run.
#[derive(Clone, Copy, Debug)]
pub enum Function {
    /// The Lambda build: the `node-fencer` package's binary, its features as
    /// `make package` builds it (none of the images' features, no test faults).
    Lambda,
    /// The handler's `main` as the harness builds it (`node-fencer-full`),
    /// with the test-only fault trigger (`test-faults`).
    Harness,
}

impl Function {
    fn package_and_bin(self) -> (&'static str, &'static str) {
        match self {
            Self::Lambda => ("node-fencer", "node-fencer"),
            Self::Harness => ("node-fencer-tests", "node-fencer-full"),
        }
    }

    /// Its debug build, built first if it is not up to date (once per test
    /// process; a no-op in `make test`, which builds both beforehand).
    pub fn binary(self) -> anyhow::Result<PathBuf> {
        static LAMBDA: OnceLock<Result<PathBuf, String>> = OnceLock::new();
        static HARNESS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
        let cell = match self {
            Self::Lambda => &LAMBDA,
            Self::Harness => &HARNESS,
        };
        cell.get_or_init(|| build(self).map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(|e| anyhow::anyhow!(e))
    }
}

/// `cargo build` of `function` into the test binary's own target directory.
fn build(function: Function) -> anyhow::Result<PathBuf> {
    let (package, bin) = function.package_and_bin();
    // This test binary is TARGET/debug/deps/NAME: the binary goes to TARGET/debug.
    let exe = std::env::current_exe()?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .context("the test binary is not in a cargo target directory")?
        .to_path_buf();
    let mut cargo = Command::new("cargo");
    // The variables cargo set for this process would reach the build
    // scripts, which rerun (ring's does) whenever they differ.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_") && name != "CARGO_HOME" && name != "CARGO_TARGET_DIR" {
            cargo.env_remove(name.as_ref());
        }
    }
    let target_dir = profile_dir
        .parent()
        .context("the test binary's profile directory has no parent")?;
    let status = cargo
        .args(["build", "--locked", "-q", "-p", package, "--bin", bin])
        .env("CARGO_TARGET_DIR", target_dir)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build -p {package} --bin {bin} failed ({status})");
    }
    let binary = profile_dir.join(bin);
    anyhow::ensure!(binary.is_file(), "{} was not built", binary.display());
    Ok(binary)
}

/// A running emulator with its function; both end when dropped.
#[derive(Debug)]
pub struct Rie {
    /// The invoke port on 127.0.0.1.
    pub port: u16,
    /// The function's timeout, in seconds.
    pub timeout: u64,
    process: Watched,
    http: reqwest::Client,
}

/// The emulator's answer to one invocation.
#[derive(Debug)]
pub struct Answer {
    /// The HTTP status: 200 for a result, an error the function reported,
    /// and a timeout alike; 502 when the process exited mid-run.
    pub status: u16,
    /// The body: the function's result or error, or the emulator's own words.
    pub body: String,
    /// How long the invocation took, as the caller saw it.
    pub took: Duration,
}

impl Answer {
    /// The body as JSON (an error's `errorType` and `errorMessage`, or the report).
    pub fn json(&self) -> anyhow::Result<Value> {
        serde_json::from_str(&self.body).with_context(|| format!("not JSON: {}", self.body))
    }
    /// The emulator ended the invocation at the function's timeout.
    pub fn timed_out(&self) -> bool {
        self.body.starts_with("Task timed out after")
    }
    /// The `errorType` of an error the function (or the emulator) reported.
    pub fn error_type(&self) -> Option<String> {
        self.json()
            .ok()?
            .get("errorType")?
            .as_str()
            .map(str::to_owned)
    }
}

/// Two free ports, told apart: the first is still held while the second
/// is asked for, or the kernel may hand out the same port twice (the
/// emulator's Runtime API then fails to listen, "address already in use").
fn free_ports() -> anyhow::Result<(u16, u16)> {
    let first = std::net::TcpListener::bind("127.0.0.1:0")?;
    let second = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok((first.local_addr()?.port(), second.local_addr()?.port()))
}

impl Rie {
    /// Starts the emulator for `function` on `stack`, with the function's
    /// environment of [`function_env`] and `overrides` (which may replace any
    /// of it, `AWS_ENDPOINT_URL` included), and `timeout` seconds per
    /// invocation. The emulator starts the function on the first invocation.
    pub fn start(
        stack: &Stack,
        function: Function,
        timeout: u64,
        overrides: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        Self::start_binary(stack, &function.binary()?, timeout, overrides)
    }

    /// [`Rie::start`] with `binary` as the function's bootstrap (e.g. the
    /// deployable zip's).
    pub fn start_binary(
        stack: &Stack,
        binary: &Path,
        timeout: u64,
        overrides: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let rie = std::env::var("NODE_FENCER_LAMBDA_RIE")
            .context("NODE_FENCER_LAMBDA_RIE is not set: run `make setup` and source its env.sh")?;
        anyhow::ensure!(
            Path::new(&rie).is_file(),
            "NODE_FENCER_LAMBDA_RIE={rie} does not exist: run `make setup`"
        );
        let (port, runtime_port) = free_ports()?;
        // The emulator hands the function its own environment, whole: it
        // starts from an empty one, as Lambda's does.
        let mut command = Command::new("env");
        command.arg("-i");
        let timeout_s = timeout.to_string();
        let mut env: Vec<(&str, &str)> = vec![
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
            ("AWS_LAMBDA_FUNCTION_TIMEOUT", &timeout_s),
            ("AWS_LAMBDA_FUNCTION_NAME", "node-fencer"),
        ];
        env.extend(function_env(stack));
        for (k, v) in overrides {
            env.retain(|(name, _)| name != k);
            env.push((k, v));
        }
        command.args(env.iter().map(|(k, v)| format!("{k}={v}")));
        command
            .arg(rie)
            .arg(format!(
                "--runtime-interface-emulator-address=127.0.0.1:{port}"
            ))
            .arg(format!("--runtime-api-address=127.0.0.1:{runtime_port}"))
            .arg(binary);
        let process = spawn_watched(&stack.dir, &format!("aws-lambda-rie-{port}"), &command)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!(
                    "aws-lambda-rie did not listen on {port}; see {}",
                    process.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self {
            port,
            timeout,
            process,
            http: reqwest::Client::new(),
        })
    }

    /// Sends `event` as Lambda's invoke API does, and waits for the answer
    /// (at most the timeout and a minute: a first invocation also starts
    /// the function).
    pub async fn invoke(&self, event: &Value) -> anyhow::Result<Answer> {
        let sent = Instant::now();
        let response = self
            .http
            .post(format!(
                "http://127.0.0.1:{}/2015-03-31/functions/function/invocations",
                self.port
            ))
            .body(event.to_string())
            .timeout(Duration::from_secs(self.timeout + 60))
            .send()
            .await
            .context("invoking through aws-lambda-rie")?;
        let status = response.status().as_u16();
        let body = response.text().await?;
        Ok(Answer {
            status,
            body,
            took: sent.elapsed(),
        })
    }

    /// The function's process, while one runs (the emulator's child, started
    /// by whichever of its threads: each thread lists its own children).
    pub fn function_pid(&self) -> Option<u32> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.process.pid)).ok()?;
        tasks.flatten().find_map(|task| {
            std::fs::read_to_string(task.path().join("children"))
                .ok()?
                .split_whitespace()
                .find_map(|p| p.parse().ok())
        })
    }

    /// Kills the function's process where it stands (`SIGKILL`), as a
    /// lost execution environment ends.
    pub fn kill_function(&self) -> anyhow::Result<()> {
        let pid = self
            .function_pid()
            .context("no function process is running under the emulator")?;
        signal(pid, "KILL")
    }

    /// The emulator's log: its own lines (`START`, `END`, `REPORT`, the
    /// resets) and the function's output.
    pub fn log(&self) -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(&self.process.log)?)
    }

    /// How many times the emulator started the function (its inits).
    pub fn inits(&self) -> anyhow::Result<usize> {
        Ok(self.log()?.matches("INIT START").count())
    }

    /// The emulator's figures, in milliseconds, for every line of its log
    /// that holds `key` followed by a number (`INIT REPORT(durationMs: ` for
    /// each init: the process's start to its first poll for an event;
    /// `\tDuration: ` for each invocation), in order.
    pub fn reported_ms(&self, key: &str) -> anyhow::Result<Vec<f64>> {
        Ok(self
            .log()?
            .lines()
            .filter_map(|l| {
                let rest = &l[l.find(key)? + key.len()..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .unwrap_or(rest.len());
                rest[..end].parse().ok()
            })
            .collect())
    }
}

impl Drop for Rie {
    fn drop(&mut self) {
        let _ = signal(self.process.pid, "KILL");
    }
}
