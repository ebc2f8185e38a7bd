//! The performance budget: the release `bootstrap` under a minimal Runtime
//! API stand-in, against moto and the kube-apiserver. Measures cold start
//! (process start to the first poll for an event), the CPU time of the
//! function's own work per invocation (its threads' time on a CPU, so waiting
//! on the network is excluded), peak RSS, the zip size, and a storm of one
//! Alertmanager batch growing from 10 to 100 to 500 stopped nodes, with the
//! API calls per fenced node counted at a pass-through proxy. Prints medians
//! with min/max; figures, not pass/fail.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use node_fencer_tests::bench::{Clock, median};
use node_fencer_tests::faults::FaultProxy;
use node_fencer_tests::fixtures::*;
use node_fencer_tests::lambda::{WEBHOOK_TOKEN, function_env};
use node_fencer_tests::runtime_api::{Answer, RuntimeApi};
use node_fencer_tests::scene::{eventbridge_event, function_url_event, kube_node_not_ready};
use node_fencer_tests::{Stack, repo_root, stack};
use serde_json::Value;

const USAGE: &str = "\
usage: bench-budget [--zip PATH | --binary PATH] [--starts N] [--events N] [--batch N]
                    [--repeats N] [--storm N,N,...]

Runs the release bootstrap (built by `make package`) under a Runtime API
stand-in against the test stack and prints medians with min/max:
  --zip PATH      the deployable zip, whose bootstrap is run
                  (default target/lambda/node-fencer/bootstrap.zip)
  --binary PATH   run this binary instead (e.g. a debug build)
  --starts N      cold starts to time (default 20)
  --events N      single EventBridge `stopped` events, each fencing one node
                  (default 50)
  --batch N       alerts in the Alertmanager batch (default 100): fenced once,
                  then sent again --repeats times (default 5) when all are
                  already fenced
  --storm SIZES   stopped nodes per storm batch (default 10,100,500; `none`
                  skips the storm)

Set NODE_FENCER_STACK_DIR to use a running stack; otherwise one is started.";

struct Args {
    zip: PathBuf,
    binary: Option<PathBuf>,
    starts: usize,
    events: usize,
    batch: usize,
    repeats: usize,
    storm: Vec<usize>,
}

fn parse_args() -> anyhow::Result<Option<Args>> {
    let mut args = Args {
        zip: repo_root().join("target/lambda/node-fencer/bootstrap.zip"),
        binary: None,
        starts: 20,
        events: 50,
        batch: 100,
        repeats: 5,
        storm: vec![10, 100, 500],
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        let number = |name: &str, v: String| -> anyhow::Result<usize> {
            v.parse()
                .with_context(|| format!("{name}: a number, not {v:?}"))
        };
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "--zip" => args.zip = PathBuf::from(value("--zip")?),
            "--binary" => args.binary = Some(PathBuf::from(value("--binary")?)),
            "--starts" => args.starts = number("--starts", value("--starts")?)?,
            "--events" => args.events = number("--events", value("--events")?)?,
            "--batch" => args.batch = number("--batch", value("--batch")?)?,
            "--repeats" => args.repeats = number("--repeats", value("--repeats")?)?,
            "--storm" => {
                let v = value("--storm")?;
                args.storm = if v == "none" {
                    Vec::new()
                } else {
                    v.split(',')
                        .map(|n| number("--storm", n.trim().to_owned()))
                        .collect::<anyhow::Result<_>>()?
                };
            }
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    Ok(Some(args))
}

/// Prints a result line as soon as it is measured, and keeps it for the
/// tables at the end.
fn keep(lines: &mut Vec<String>, line: String) {
    println!("    {line}");
    lines.push(line);
}

fn row(name: &str, unit: &str, samples: &[f64]) -> String {
    match median(samples) {
        Some((med, min, max)) => format!(
            "| {name} | {med:.2} {unit} | {min:.2} | {max:.2} | {} |",
            samples.len()
        ),
        None => format!("| {name} | - | - | - | 0 |"),
    }
}

/// The function's CPU time so far, in ms: the scheduler's per-thread
/// nanoseconds (fine-grained, but a thread that exited is gone from it).
fn cpu_ms(pid: u32) -> anyhow::Result<f64> {
    let mut ns: u64 = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let stat = std::fs::read_to_string(task?.path().join("schedstat")).unwrap_or_default();
        ns += stat
            .split_whitespace()
            .next()
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(ns as f64 / 1e6)
}

/// The function's CPU time so far, in ms, from utime + stime (clock ticks,
/// exited threads included): the cross-check over a whole phase.
fn cpu_ticks_ms(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(") ").context("malformed stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of the line; `after` starts at field 3.
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    Ok(ticks as f64 * 10.0)
}

/// `VmHWM` (peak RSS) and `VmRSS`, in MB.
fn memory_mb(pid: u32) -> anyhow::Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<f64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("{name} missing"))?;
        let kb: f64 = line
            .split_whitespace()
            .nth(1)
            .context("no value")?
            .parse()?;
        Ok(kb / 1024.0)
    };
    Ok((field("VmHWM:")?, field("VmRSS:")?))
}

/// The function process, killed when dropped.
struct Function {
    child: Child,
    api: RuntimeApi,
    started: Instant,
}

impl Drop for Function {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Function {
    async fn start(binary: &Path, env: &[(&str, String)], log: &Path) -> anyhow::Result<Self> {
        let api = RuntimeApi::start().await?;
        let log = std::fs::File::create(log)?;
        let mut cmd = Command::new(binary);
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("AWS_LAMBDA_RUNTIME_API", &api.address)
            .env("AWS_LAMBDA_FUNCTION_NAME", "node-fencer")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/node-fencer")
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "bench")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let started = Instant::now();
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Self {
            child,
            api,
            started,
        })
    }

    async fn cold_start(&self) -> anyhow::Result<Duration> {
        let polled = self.api.first_poll(Duration::from_secs(10)).await?;
        Ok(polled.duration_since(self.started))
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Invokes once; returns the answer, the CPU ms it cost and the wall time.
    async fn invoke(&self, event: Value) -> anyhow::Result<(Answer, f64, Duration)> {
        let before = cpu_ms(self.pid())?;
        let t = Instant::now();
        let answer = self.api.invoke(event, Duration::from_secs(120)).await?;
        let wall = t.elapsed();
        Ok((answer, cpu_ms(self.pid())? - before, wall))
    }
}

async fn targets(stack: &Stack, n: usize, clock: &Clock) -> anyhow::Result<Vec<Target>> {
    clock.say(&format!("creating {n} stopped nodes with a volume each"));
    futures::stream::iter(0..n)
        .map(|_| target(stack, false))
        .buffer_unordered(8)
        .try_collect()
        .await
}

/// Nodes the answer reports fenced; a Function URL answer carries the
/// report as its `body` string.
fn fenced(answer: &Answer) -> usize {
    let report = match answer.body["body"].as_str() {
        Some(body) => serde_json::from_str(body).unwrap_or(Value::Null),
        None => answer.body.clone(),
    };
    report["results"]
        .as_array()
        .map_or(0, |r| r.iter().filter(|r| r["outcome"] == "fenced").count())
}

fn alert_batch(nodes: &[Target]) -> Value {
    let names: Vec<&str> = nodes.iter().map(|t| t.node.as_str()).collect();
    function_url_event(
        &kube_node_not_ready(&names).to_string(),
        &format!("Bearer {WEBHOOK_TOKEN}"),
    )
}

/// Extracts `bootstrap` from the deployable zip into the stack directory.
fn unzip(zip: &Path, stack: &Stack) -> anyhow::Result<PathBuf> {
    if !zip.is_file() {
        bail!(
            "{} does not exist: build it with `make package` (or pass --binary)",
            zip.display()
        );
    }
    let dir = stack.dir.join("bench-bootstrap");
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(zip)
        .arg(&dir)
        .status()
        .context("running python3 to unzip the bootstrap")?;
    if !status.success() {
        bail!("could not extract {}", zip.display());
    }
    let binary = dir.join("bootstrap");
    // zipfile does not restore the mode bits.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755))?;
    Ok(binary)
}

/// node-fencer's kubeconfig pointing at `server`, written to a file.
fn kubeconfig_via(stack: &Stack, server: &str) -> anyhow::Result<PathBuf> {
    let kc = stack.fencer_kubeconfig_via(server)?;
    let path = stack
        .dir
        .join(format!("kubeconfig-bench-{}", std::process::id()));
    std::fs::write(&path, serde_json::to_string(&kc)?)?;
    Ok(path)
}

async fn run(args: Args) -> anyhow::Result<()> {
    let clock = Clock::start();
    clock.say("starting the stack");
    let stack = tokio::task::spawn_blocking(stack).await?;
    let (binary, zip_size) = match &args.binary {
        Some(b) => (b.clone(), None),
        None => (
            unzip(&args.zip, stack)?,
            Some(std::fs::metadata(&args.zip)?.len()),
        ),
    };
    if !binary.is_file() {
        bail!("{} is not a file", binary.display());
    }
    let size = std::fs::metadata(&binary)?.len();
    let ec2_proxy = FaultProxy::to_http(stack.var("AWS_ENDPOINT_URL")).await?;
    let kube_proxy = FaultProxy::to_apiserver(stack.var("KUBECONFIG")).await?;
    let kubeconfig = kubeconfig_via(stack, &kube_proxy.url)?;
    let mut env: Vec<(&str, String)> = function_env(stack)
        .iter()
        .map(|(k, v)| (*k, (*v).to_owned()))
        .collect();
    for (k, v) in &mut env {
        match *k {
            "KUBECONFIG" => *v = kubeconfig.display().to_string(),
            "AWS_ENDPOINT_URL" => *v = ec2_proxy.url.clone(),
            "RUST_LOG" => *v = "warn".into(),
            _ => {}
        }
    }
    let log = stack.dir.join("logs").join("bench-budget.log");
    let mut out = vec![
        "| | median | min | max | n |".to_owned(),
        "| --- | ---: | ---: | ---: | ---: |".to_owned(),
    ];

    clock.say(&format!("{} cold starts", args.starts));
    let mut starts = Vec::new();
    for _ in 0..args.starts {
        let f = Function::start(&binary, &env, &log).await?;
        starts.push(f.cold_start().await?.as_secs_f64() * 1000.0);
    }
    keep(
        &mut out,
        row(
            "cold start: process start to first Runtime API poll",
            "ms",
            &starts,
        ),
    );

    let singles = targets(stack, args.events, &clock).await?;
    let batch = targets(stack, args.batch, &clock).await?;
    let f = Function::start(&binary, &env, &log).await?;
    f.cold_start().await?;
    // The first event pays for connections; it is reported on its own.
    let warm = eventbridge_event("i-00000000000000000", "stopped");
    let (_, first_cpu, first_wall) = f.invoke(warm).await?;
    keep(
        &mut out,
        row(
            "first invocation (unknown instance): own CPU",
            "ms",
            &[first_cpu],
        ),
    );
    keep(
        &mut out,
        row(
            "first invocation: wall",
            "ms",
            &[first_wall.as_secs_f64() * 1000.0],
        ),
    );
    let (_, rss_after_start) = memory_mb(f.pid())?;

    clock.say(&format!(
        "{} single events, each fencing one node",
        singles.len()
    ));
    let (mut cpu, mut wall) = (Vec::new(), Vec::new());
    let ticks_before = cpu_ticks_ms(f.pid())?;
    for t in &singles {
        let (answer, c, w) = f
            .invoke(eventbridge_event(&t.m.instance, "stopped"))
            .await?;
        if answer.error || fenced(&answer) != 1 {
            bail!("{} was not fenced: {}", t.node, answer.body);
        }
        cpu.push(c);
        wall.push(w.as_secs_f64() * 1000.0);
    }
    let ticks = (cpu_ticks_ms(f.pid())? - ticks_before) / singles.len().max(1) as f64;
    keep(
        &mut out,
        row("one event fencing one node: own CPU", "ms", &cpu),
    );
    keep(
        &mut out,
        row(
            "  the same, mean from utime+stime over the phase",
            "ms",
            &[ticks],
        ),
    );
    keep(
        &mut out,
        row("one event fencing one node: wall", "ms", &wall),
    );

    clock.say(&format!("a batch of {} alerts", batch.len()));
    let (answer, c, w) = f.invoke(alert_batch(&batch)).await?;
    if answer.error || fenced(&answer) != batch.len() {
        bail!("the batch did not fence every node: {}", answer.body);
    }
    keep(
        &mut out,
        row(
            &format!(
                "{} alerts fencing {} nodes: own CPU",
                batch.len(),
                batch.len()
            ),
            "ms",
            &[c],
        ),
    );
    keep(
        &mut out,
        row(
            &format!("{} alerts fencing {} nodes: wall", batch.len(), batch.len()),
            "ms",
            &[w.as_secs_f64() * 1000.0],
        ),
    );
    let (mut cpu, mut wall) = (Vec::new(), Vec::new());
    for _ in 0..args.repeats {
        let (answer, c, w) = f.invoke(alert_batch(&batch)).await?;
        if answer.error {
            bail!("the repeated batch failed: {}", answer.body);
        }
        cpu.push(c);
        wall.push(w.as_secs_f64() * 1000.0);
    }
    keep(
        &mut out,
        row(
            &format!("{} alerts, all already fenced: own CPU", batch.len()),
            "ms",
            &cpu,
        ),
    );
    keep(
        &mut out,
        row(
            &format!("{} alerts, all already fenced: wall", batch.len()),
            "ms",
            &wall,
        ),
    );
    let (peak, rss) = memory_mb(f.pid())?;
    keep(&mut out, row("RSS after start", "MB", &[rss_after_start]));
    keep(&mut out, row("RSS at the end", "MB", &[rss]));
    keep(&mut out, row("peak RSS (VmHWM)", "MB", &[peak]));
    keep(&mut out, row("bootstrap size", "MB", &[size as f64 / 1e6]));
    if let Some(z) = zip_size {
        keep(&mut out, row("bootstrap.zip size", "MB", &[z as f64 / 1e6]));
    }

    let mut storm = vec![
        "| stopped nodes | fenced | wall | nodes/s | own CPU | CPU per node | API calls per node | peak RSS |".to_owned(),
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |".to_owned(),
    ];
    for &n in &args.storm {
        let nodes = targets(stack, n, &clock).await?;
        clock.say(&format!("storm: one batch of {n} alerts"));
        let calls_before = ec2_proxy.seen().len() + kube_proxy.seen().len();
        let (answer, c, w) = f.invoke(alert_batch(&nodes)).await?;
        let calls = ec2_proxy.seen().len() + kube_proxy.seen().len() - calls_before;
        let done = fenced(&answer);
        let (peak, _) = memory_mb(f.pid())?;
        keep(
            &mut storm,
            format!(
                "| {n} | {done} | {:.2} s | {:.1} | {c:.1} ms | {:.3} ms | {:.2} | {peak:.1} MB |",
                w.as_secs_f64(),
                done as f64 / w.as_secs_f64().max(1e-9),
                c / done.max(1) as f64,
                calls as f64 / done.max(1) as f64,
            ),
        );
    }
    drop(f);

    println!("\n### Budget\n");
    for l in &out {
        println!("{l}");
    }
    if !args.storm.is_empty() {
        println!("\n### Storm: one Alertmanager batch, growing\n");
        for l in &storm {
            println!("{l}");
        }
    }
    println!(
        "\nOwn CPU: the function's threads' time on a CPU (/proc/PID/task/*/schedstat) \
         between handing out the event and receiving the answer; waiting on moto and the \
         apiserver is not in it. Function log: {}",
        log.display()
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let Some(args) = parse_args()? else {
        println!("{USAGE}");
        return Ok(());
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}
