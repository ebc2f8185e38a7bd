//! The performance budget: the release `bootstrap` under a minimal Runtime
//! API stand-in and under AWS's own Lambda Runtime Interface Emulator,
//! against moto and the kube-apiserver, after checking the zip's layout.
//! Measures cold start (process start to the first poll for an event), the CPU time of the
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
use node_fencer_tests::package::{check_zip, extract_bootstrap, zip_path};
use node_fencer_tests::rie::Rie;
use node_fencer_tests::runtime_api::{Answer, RuntimeApi};
use node_fencer_tests::scene::{eventbridge_event, function_url_event, kube_node_not_ready};
use node_fencer_tests::{Stack, stack};
use serde_json::Value;

const USAGE: &str = "\
usage: bench-budget [--zip PATH | --binary PATH] [--starts N] [--events N] [--batch N]
                    [--repeats N] [--storm N,N,...] [--scale N,N,...]

Checks the deployable zip (one executable `bootstrap` at its root, an x86-64
ELF needing no newer glibc than Amazon Linux 2023's), then runs its
bootstrap under a Runtime API stand-in and under AWS's Lambda Runtime
Interface Emulator against the test stack and prints medians with min/max:
  --zip PATH      the deployable zip, whose bootstrap is run
                  (default target/lambda/node-fencer/bootstrap.zip)
  --binary PATH   run this binary instead (e.g. a debug build)
  --starts N      cold starts to time, under each runtime (default 20)
  --events N      single EventBridge `stopped` events, each fencing one node,
                  under each runtime (default 50)
  --batch N       alerts in the Alertmanager batch (default 100): fenced once,
                  then sent again --repeats times (default 5) when all are
                  already fenced
  --storm SIZES   stopped nodes per storm batch (default 10,100,500; `none`
                  skips the storm)
  --scale SIZES   clusters grown to these many Nodes (e.g. 100,1000,5000;
                  default none), each Node with one attached volume (a PV
                  and a VolumeAttachment): at each size, 3 events each for
                  another cluster's instance, for a Node read by name with a
                  fresh census and its recorded volumes read by name, and
                  for one with no census whose volumes are not recorded
                  (every Node, PV and VolumeAttachment listed), with
                  apiserver requests and bytes counted at the proxy; then
                  the sweep's witness round over every Node's instance:
                  3 sweeps with nothing new, one where the role lost
                  ec2:DetachVolume, one where it is granted again

Set NODE_FENCER_STACK_DIR to use a running stack; otherwise one is started.";

/// The function timeout under the emulator: longer than any run here.
const RIE_TIMEOUT: u64 = 120;
/// The emulator's log: an init's duration, and an invocation's.
const RIE_INIT: &str = "INIT REPORT(durationMs: ";
const RIE_DURATION: &str = "\tDuration: ";

struct Args {
    zip: PathBuf,
    binary: Option<PathBuf>,
    starts: usize,
    events: usize,
    batch: usize,
    repeats: usize,
    storm: Vec<usize>,
    scale: Vec<usize>,
}

fn parse_args() -> anyhow::Result<Option<Args>> {
    let mut args = Args {
        zip: zip_path(),
        binary: None,
        starts: 20,
        events: 50,
        batch: 100,
        repeats: 5,
        storm: vec![10, 100, 500],
        scale: Vec::new(),
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
            "--storm" | "--scale" => {
                let v = value(&a)?;
                let sizes = if v == "none" {
                    Vec::new()
                } else {
                    v.split(',')
                        .map(|n| number(&a, n.trim().to_owned()))
                        .collect::<anyhow::Result<_>>()?
                };
                if a == "--storm" {
                    args.storm = sizes;
                } else {
                    args.scale = sizes;
                }
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

/// The same, each Node named after its instance's private DNS name, as on
/// EKS, so that an event reads it by name.
async fn named_targets(stack: &Stack, n: usize, clock: &Clock) -> anyhow::Result<Vec<Target>> {
    clock.say(&format!(
        "creating {n} stopped nodes named after their machines, with a volume each"
    ));
    futures::stream::iter(0..n)
        .map(|_| named_target(stack, None))
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

async fn run(args: Args) -> anyhow::Result<()> {
    let clock = Clock::start();
    clock.say("starting the stack");
    let stack = tokio::task::spawn_blocking(stack).await?;
    let (binary, zip_size) = match &args.binary {
        Some(b) => (b.clone(), None),
        None => (
            extract_bootstrap(&args.zip, &stack.dir.join("bench-bootstrap"))?,
            Some(std::fs::metadata(&args.zip)?.len()),
        ),
    };
    // The zip as provided.al2023 takes it; a wrong one stops the run.
    if args.binary.is_none() {
        for fact in check_zip(&args.zip, &binary)? {
            clock.say(&format!("package: {fact}"));
        }
    }
    if !binary.is_file() {
        bail!("{} is not a file", binary.display());
    }
    let size = std::fs::metadata(&binary)?.len();
    let ec2_proxy = FaultProxy::to_http(stack.var("AWS_ENDPOINT_URL")).await?;
    let kube_proxy = FaultProxy::to_apiserver(stack.var("KUBECONFIG")).await?;
    let kubeconfig = stack.fencer_kubeconfig_file_via(&kube_proxy.url, "bench")?;
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

    // The same under AWS's own emulator: its init (the process's start to
    // its first poll, as the emulator reports it) and the first invocation,
    // each on a new emulator, from the invoke to the answer.
    let overrides: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    clock.say(&format!("{} cold starts under aws-lambda-rie", args.starts));
    let (mut inits, mut firsts) = (Vec::new(), Vec::new());
    for _ in 0..args.starts {
        let rie = Rie::start_binary(stack, &binary, RIE_TIMEOUT, &overrides)?;
        let answer = rie
            .invoke(&eventbridge_event("i-00000000000000000", "stopped"))
            .await?;
        if answer.status != 200 || answer.error_type().is_some() {
            bail!("the bootstrap's first invocation under aws-lambda-rie failed: {answer:?}");
        }
        inits.extend(rie.reported_ms(RIE_INIT)?);
        firsts.push(answer.took.as_secs_f64() * 1000.0);
    }
    keep(
        &mut out,
        row(
            "cold start under aws-lambda-rie: its INIT REPORT (process start to first poll)",
            "ms",
            &inits,
        ),
    );
    keep(
        &mut out,
        row(
            "first invocation under aws-lambda-rie (unknown instance), init included: wall",
            "ms",
            &firsts,
        ),
    );

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

    // As the 10-minute sweep does, before the stopped Nodes exist (it would
    // fence them): its census lets each event read its Node by name.
    let (answer, _, _) = f.invoke(serde_json::json!({"action": "sweep"})).await?;
    if answer.error {
        bail!("the sweep failed: {}", answer.body);
    }
    let singles = named_targets(stack, args.events, &clock).await?;
    clock.say(&format!(
        "{} single events, each fencing one node read by name",
        singles.len()
    ));
    let (mut cpu, mut wall) = (Vec::new(), Vec::new());
    let ticks_before = cpu_ticks_ms(f.pid())?;
    let events = singles.len();
    // Each fenced Node is deleted after its event, as its replacement's
    // arrival ends it in a cluster that runs on: the Nodes node-fencer
    // labelled do not pile up from one event to the next.
    for t in singles {
        let (answer, c, w) = f
            .invoke(eventbridge_event(&t.m.instance, "stopped"))
            .await?;
        if answer.error || fenced(&answer) != 1 {
            bail!("{} was not fenced: {}", t.node, answer.body);
        }
        cpu.push(c);
        wall.push(w.as_secs_f64() * 1000.0);
    }
    let ticks = (cpu_ticks_ms(f.pid())? - ticks_before) / events.max(1) as f64;
    keep(
        &mut out,
        row(
            "one event fencing one node (read by name): own CPU",
            "ms",
            &cpu,
        ),
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

    // The same events under AWS's own emulator, on one process: the
    // invocation's duration as the emulator reports it, and the wall time
    // from the invoke to the answer.
    let rie = Rie::start_binary(stack, &binary, RIE_TIMEOUT, &overrides)?;
    let answer = rie.invoke(&serde_json::json!({"action": "sweep"})).await?;
    if answer.error_type().is_some() {
        bail!("the sweep under aws-lambda-rie failed: {}", answer.body);
    }
    let singles = named_targets(stack, args.events, &clock).await?;
    clock.say(&format!(
        "{} single events under aws-lambda-rie, each fencing one node read by name",
        singles.len()
    ));
    let mut wall = Vec::new();
    for t in &singles {
        let answer = rie
            .invoke(&eventbridge_event(&t.m.instance, "stopped"))
            .await?;
        let report = answer.json()?;
        let fenced = report["results"]
            .as_array()
            .map_or(0, |r| r.iter().filter(|r| r["outcome"] == "fenced").count());
        if fenced != 1 {
            bail!(
                "{} was not fenced under aws-lambda-rie: {}",
                t.node,
                answer.body
            );
        }
        wall.push(answer.took.as_secs_f64() * 1000.0);
    }
    // The sweep's invocation first, then one per event.
    let durations = rie.reported_ms(RIE_DURATION)?;
    keep(
        &mut out,
        row(
            "one event fencing one node under aws-lambda-rie: its REPORT Duration",
            "ms",
            durations.get(1..).unwrap_or_default(),
        ),
    );
    keep(
        &mut out,
        row(
            "one event fencing one node under aws-lambda-rie: wall",
            "ms",
            &wall,
        ),
    );
    drop(rie);

    let batch = targets(stack, args.batch, &clock).await?;
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
    let (scale, witness) = if args.scale.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        scale::run(
            stack,
            &binary,
            &env,
            &log,
            &args.scale,
            &ec2_proxy,
            &kube_proxy,
            &clock,
        )
        .await?
    };

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
    if !scale.is_empty() {
        println!("\n### One event, growing clusters (medians of 3)\n");
        for l in &scale {
            println!("{l}");
        }
        println!("\n### The sweep's witness round, growing clusters (nothing new: medians of 3)\n");
        for l in &witness {
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

/// One event on clusters of growing size (issue 19): what it costs for
/// another cluster's instance, for a Node read by name with a fresh census,
/// and for one with no census, where every Node is listed.
mod scale {
    use std::path::Path;
    use std::time::Instant;

    use anyhow::{Context, bail};
    use aws_sdk_ec2::types::{Filter, Tag};
    use futures::{StreamExt, TryStreamExt};
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Node, PersistentVolume};
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use kube::Api;
    use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
    use node_fencer::core::rules::control::{CENSUS_NAME, WITNESS_FAILING, WITNESS_NAME};
    use node_fencer_tests::Stack;
    use node_fencer_tests::bench::{Clock, median};
    use node_fencer_tests::faults::FaultProxy;
    use node_fencer_tests::fixtures::*;
    use node_fencer_tests::scene::eventbridge_event;
    use serde_json::{Value, json};

    use super::{Function, fenced, keep};

    /// This cluster's name in the bench, as its tag names it.
    const CLUSTER: &str = "bench";
    /// Events per case and size.
    const EVENTS: usize = 3;
    /// The label of the Nodes this bench adds.
    const BULK: &str = "node-fencer.io/bench-bulk";

    /// A Ready Node as kwok or a kubelet reports one, on the running
    /// instance `instance` (launched before it, as a Node's machine is).
    fn bulk_node(i: usize, instance: &str) -> Value {
        let name = format!("bulk-{i:05}");
        let images: Vec<Value> = (0..8)
            .map(|k| {
                json!({"names": [format!("registry.example/team-{k}/service@sha256:{:064x}", i * 8 + k),
                                 format!("registry.example/team-{k}/service:v1.{i}")],
                       "sizeBytes": 48_000_000 + k})
            })
            .collect();
        let conditions: Vec<Value> = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
            .iter()
            .map(|t| {
                json!({
                    "type": t, "status": if *t == "Ready" { "True" } else { "False" },
                    "lastHeartbeatTime": "2026-11-24T10:00:00Z",
                    "lastTransitionTime": "2026-11-20T10:00:00Z",
                    "reason": "KubeletReady", "message": "kubelet is posting ready status"})
            })
            .collect();
        json!({
            "metadata": {"name": name, "labels": {
                BULK: "true", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "m5.large",
                "topology.kubernetes.io/zone": "us-east-1a"}},
            "spec": {"providerID": format!("aws:///us-east-1a/{instance}")},
            "status": {
                "capacity": {"cpu": "2", "memory": "7935360Ki", "pods": "29"},
                "allocatable": {"cpu": "1930m", "memory": "7246208Ki", "pods": "29"},
                "conditions": conditions,
                "addresses": [{"type": "InternalIP", "address": format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256)},
                              {"type": "Hostname", "address": name}],
                "nodeInfo": {"machineID": "ec2", "systemUUID": "ec2", "bootID": "b",
                    "kernelVersion": "6.1.112", "osImage": "Amazon Linux 2023",
                    "containerRuntimeVersion": "containerd://1.7.22", "kubeletVersion": "v1.36.3",
                    "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
                "images": images
            }
        })
    }

    /// The PersistentVolume of bulk Node `i`'s volume, as the EBS CSI
    /// driver provisions one.
    fn bulk_pv(i: usize) -> Value {
        json!({
            "metadata": {"name": format!("pvc-bulk-{i:05}"), "labels": {BULK: "true"},
                "annotations": {"pv.kubernetes.io/provisioned-by": "ebs.csi.aws.com",
                                "volume.kubernetes.io/provisioner-deletion-secret-name": "",
                                "volume.kubernetes.io/provisioner-deletion-secret-namespace": ""},
                "finalizers": ["kubernetes.io/pv-protection", "external-attacher/ebs-csi-aws-com"]},
            "spec": {
                "capacity": {"storage": "20Gi"}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "gp3",
                "volumeMode": "Filesystem",
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "default",
                             "name": format!("data-app-{i}"), "uid": format!("{i:08x}-0000-4000-8000-000000000000")},
                "csi": {"driver": "ebs.csi.aws.com", "fsType": "ext4",
                        "volumeHandle": bulk_volume(i),
                        "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity": "1732000000000-8081-ebs.csi.aws.com"}},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}]}]}}
            }
        })
    }

    fn bulk_volume(i: usize) -> String {
        format!("vol-{:017x}", 0xb000_0000_u64 + i as u64)
    }

    /// Bulk Node `i`'s VolumeAttachment, under the name Kubernetes gives it.
    fn bulk_va(i: usize) -> Value {
        let node = format!("bulk-{i:05}");
        json!({
            "metadata": {"name": ebs_attachment_name(&bulk_volume(i), &node), "labels": {BULK: "true"}},
            "spec": {"attacher": "ebs.csi.aws.com", "nodeName": node,
                     "source": {"persistentVolumeName": format!("pvc-bulk-{i:05}")}}
        })
    }

    /// Grows the bench's Nodes to `n`, each with one volume attached.
    async fn grow(stack: &Stack, n: usize, clock: &Clock) -> anyhow::Result<()> {
        let admin = stack.admin().await?;
        let nodes: Api<Node> = Api::all(admin.clone());
        let pvs: Api<PersistentVolume> = Api::all(admin.clone());
        let vas: Api<VolumeAttachment> = Api::all(admin);
        let have = nodes
            .list_metadata(&ListParams::default().labels(&format!("{BULK}=true")))
            .await?
            .items
            .len();
        clock.say(&format!(
            "growing the cluster by {} Nodes, each on a running instance",
            n.saturating_sub(have)
        ));
        let instances = launch_many(&stack.ec2().await, n.saturating_sub(have)).await?;
        futures::stream::iter((have..n).zip(instances))
            .map(|(i, instance)| {
                let (nodes, pvs, vas) = (nodes.clone(), pvs.clone(), vas.clone());
                async move {
                    let full = bulk_node(i, &instance);
                    let name = full["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    let mut bare = full.clone();
                    bare.as_object_mut().map(|o| o.remove("status"));
                    nodes
                        .create(&PostParams::default(), &serde_json::from_value(bare)?)
                        .await?;
                    let status = json!({"status": full["status"]});
                    nodes
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await?;
                    pvs.create(&PostParams::default(), &serde_json::from_value(bulk_pv(i))?)
                        .await?;
                    vas.create(&PostParams::default(), &serde_json::from_value(bulk_va(i))?)
                        .await?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    /// The default VPC moto launches into.
    async fn default_vpc(stack: &Stack) -> anyhow::Result<String> {
        let vpcs = stack
            .ec2()
            .await
            .describe_vpcs()
            .filters(Filter::builder().name("is-default").values("true").build())
            .send()
            .await?;
        vpcs.vpcs()
            .first()
            .and_then(|v| v.vpc_id())
            .map(str::to_owned)
            .context("moto has no default VPC")
    }

    /// A stopped instance tagged for another cluster.
    async fn foreign(stack: &Stack) -> anyhow::Result<String> {
        let ec2 = stack.ec2().await;
        let m = launch(&ec2).await?;
        ec2.create_tags()
            .resources(&m.instance)
            .tags(
                Tag::builder()
                    .key("kubernetes.io/cluster/other")
                    .value("owned")
                    .build(),
            )
            .send()
            .await?;
        stop(&ec2, &m).await?;
        Ok(m.instance)
    }

    /// What one invocation cost, from the proxies and the process.
    struct Cost {
        requests: usize,
        bytes: usize,
        ec2: usize,
        cpu: f64,
        wall: f64,
        to_taint: Option<f64>,
    }

    async fn measure(
        f: &Function,
        instance: &str,
        node: Option<&str>,
        ec2: &FaultProxy,
        kube: &FaultProxy,
    ) -> anyhow::Result<Cost> {
        let (k0, e0) = (kube.seen().len(), ec2.seen().len());
        let start = Instant::now();
        let (answer, cpu, wall) = f.invoke(eventbridge_event(instance, "stopped")).await?;
        if answer.error || (node.is_some() && fenced(&answer) != 1) {
            bail!("{instance}: not the expected answer: {}", answer.body);
        }
        let seen = kube.seen();
        let new = &seen[k0..];
        let to_taint = node.and_then(|n| {
            let path = format!("/api/v1/nodes/{n}");
            new.iter()
                .find(|s| s.method == http::Method::PATCH && s.path.starts_with(&path))
                .map(|s| s.at.duration_since(start).as_secs_f64() * 1000.0)
        });
        Ok(Cost {
            requests: new.len(),
            bytes: new.iter().map(|s| s.bytes).sum(),
            ec2: ec2.seen().len() - e0,
            cpu,
            wall: wall.as_secs_f64() * 1000.0,
            to_taint,
        })
    }

    /// What one sweep cost, and what its witness round told and kept.
    struct SweepCost {
        cost: Cost,
        events: usize,
        /// Pages of a list of every Node (500 a page).
        node_pages: usize,
        changes: usize,
        untold: usize,
        record: usize,
    }

    /// The witness record's size as the Lease keeps it, in bytes.
    async fn record_size(leases: &Api<Lease>) -> anyhow::Result<usize> {
        let lease = leases.get_opt(WITNESS_NAME).await?;
        Ok(lease
            .and_then(|l| l.metadata.annotations)
            .and_then(|a| a.get(WITNESS_FAILING).map(String::len))
            .unwrap_or(0))
    }

    /// One sweep, measured at the proxies; fails unless its witness round
    /// ran to its end.
    async fn sweep(
        f: &Function,
        ec2: &FaultProxy,
        kube: &FaultProxy,
        leases: &Api<Lease>,
    ) -> anyhow::Result<SweepCost> {
        let (k0, e0) = (kube.seen().len(), ec2.seen().len());
        let (answer, cpu, wall) = f.invoke(json!({"action": "sweep"})).await?;
        let report: Value = match answer.body["body"].as_str() {
            Some(body) => serde_json::from_str(body)?,
            None => answer.body.clone(),
        };
        let witness = &report["witness"];
        if answer.error || witness.is_null() || !witness["error"].is_null() {
            bail!("the sweep's witness round did not end: {}", answer.body);
        }
        let seen = kube.seen();
        let new = &seen[k0..];
        let path = |s: &node_fencer_tests::faults::Seen| {
            s.path.split('?').next().unwrap_or_default().to_owned()
        };
        Ok(SweepCost {
            events: new
                .iter()
                .filter(|s| s.method == http::Method::POST && path(s).ends_with("/events"))
                .count(),
            node_pages: new
                .iter()
                .filter(|s| s.method == http::Method::GET && path(s) == "/api/v1/nodes")
                .count(),
            changes: witness["changes"].as_array().map_or(0, Vec::len),
            untold: witness["untold"].as_u64().unwrap_or(0) as usize,
            record: record_size(leases).await?,
            cost: Cost {
                requests: new.len(),
                bytes: new.iter().map(|s| s.bytes).sum(),
                ec2: ec2.seen().len() - e0,
                cpu,
                wall: wall.as_secs_f64() * 1000.0,
                to_taint: None,
            },
        })
    }

    fn sweep_line(n: usize, case: &str, costs: &[SweepCost]) -> String {
        let c: Vec<&Cost> = costs.iter().map(|s| &s.cost).collect();
        format!(
            "| {n} | {case} | {} | {} | {} KiB | {} | {} | {} | {} B | {} ms | {} ms |",
            med(c.iter().map(|c| c.requests as f64)),
            med(costs.iter().map(|s| s.node_pages as f64)),
            med(c.iter().map(|c| c.bytes as f64 / 1024.0)),
            med(c.iter().map(|c| c.ec2 as f64)),
            med(costs.iter().map(|s| s.events as f64)),
            med(costs.iter().map(|s| (s.changes + s.untold) as f64)),
            med(costs.iter().map(|s| s.record as f64)),
            med(c.iter().map(|c| c.cpu)),
            med(c.iter().map(|c| c.wall)),
        )
    }

    /// The witness round that ends each sweep, at `n` Nodes: a sweep with
    /// nothing new, then one where the role has lost `ec2:DetachVolume`
    /// (its dry run denied at the proxy: every Node's witness fails), then
    /// one where it is granted again.
    async fn witness_rounds(
        f: &Function,
        leases: &Api<Lease>,
        n: usize,
        ec2: &FaultProxy,
        kube: &FaultProxy,
        clock: &Clock,
        out: &mut Vec<String>,
    ) -> anyhow::Result<()> {
        clock.say(&format!("{n} Nodes: sweeps whose witness has nothing new"));
        let mut costs = Vec::new();
        for _ in 0..EVENTS {
            costs.push(sweep(f, ec2, kube, leases).await?);
        }
        keep(out, sweep_line(n, "nothing new", &costs));
        clock.say(&format!("{n} Nodes: the role loses ec2:DetachVolume"));
        ec2.deny_ec2_dry_run("DetachVolume");
        let denied = sweep(f, ec2, kube, leases).await;
        ec2.heal();
        let denied = denied?;
        if denied.changes + denied.untold < n {
            bail!(
                "a denied permission changed {} of {n} Nodes' witness",
                denied.changes + denied.untold
            );
        }
        keep(
            out,
            sweep_line(n, "every witness fails: a permission denied", &[denied]),
        );
        clock.say(&format!("{n} Nodes: the permission granted again"));
        let restored = sweep(f, ec2, kube, leases).await?;
        keep(out, sweep_line(n, "every witness restored", &[restored]));
        Ok(())
    }

    fn med(values: impl Iterator<Item = f64>) -> String {
        let v: Vec<f64> = values.collect();
        median(&v).map_or("-".into(), |(m, _, _)| format!("{m:.1}"))
    }

    fn line(n: usize, case: &str, costs: &[Cost]) -> String {
        let kb = med(costs.iter().map(|c| c.bytes as f64 / 1024.0));
        let taint = costs.iter().filter_map(|c| c.to_taint);
        format!(
            "| {n} | {case} | {} | {kb} KiB | {} | {} ms | {} ms | {} |",
            med(costs.iter().map(|c| c.requests as f64)),
            med(costs.iter().map(|c| c.ec2 as f64)),
            med(costs.iter().map(|c| c.cpu)),
            med(costs.iter().map(|c| c.wall)),
            if costs.iter().any(|c| c.to_taint.is_some()) {
                format!("{} ms", med(taint))
            } else {
                "-".into()
            },
        )
    }

    /// Runs the cases at each size; returns the table's lines.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run(
        stack: &Stack,
        binary: &Path,
        env: &[(&str, String)],
        log: &Path,
        sizes: &[usize],
        ec2: &FaultProxy,
        kube: &FaultProxy,
        clock: &Clock,
    ) -> anyhow::Result<(Vec<String>, Vec<String>)> {
        let mut env = env.to_vec();
        env.push(("CLUSTER_VPC_ID", default_vpc(stack).await?));
        env.push(("CLUSTER_TAG", format!("kubernetes.io/cluster/{CLUSTER}")));
        let f = Function::start(binary, &env, log).await?;
        f.cold_start().await?;
        let leases: Api<Lease> = Api::namespaced(stack.admin().await?, "kube-system");
        let mut out = vec![
            "| Nodes | event | apiserver requests | read from the apiserver | EC2 calls | own CPU | wall | event → taint |".to_owned(),
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |".to_owned(),
        ];
        let mut witness = vec![
            "| Nodes | sweep | apiserver requests | Node list pages | read from the apiserver | EC2 calls | Events | witness changes | record | own CPU | wall |".to_owned(),
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |".to_owned(),
        ];
        for &n in sizes {
            grow(stack, n, clock).await?;
            clock.say(&format!("{n} Nodes: a sweep leaves the census"));
            let (answer, _, _) = f.invoke(json!({"action": "sweep"})).await?;
            if answer.error {
                bail!("the sweep failed: {}", answer.body);
            }
            let mut cases: Vec<(&str, Vec<Cost>)> = Vec::new();
            clock.say(&format!("{n} Nodes: another cluster's instance"));
            let mut costs = Vec::new();
            for _ in 0..EVENTS {
                let id = foreign(stack).await?;
                costs.push(measure(&f, &id, None, ec2, kube).await?);
            }
            cases.push(("another cluster's instance", costs));
            clock.say(&format!("{n} Nodes: a Node read by name"));
            let mut costs = Vec::new();
            for _ in 0..EVENTS {
                let t = named_target(stack, None).await?;
                costs.push(measure(&f, &t.m.instance, Some(&t.node), ec2, kube).await?);
            }
            cases.push(("this cluster's, read by name", costs));
            clock.say(&format!(
                "{n} Nodes: without a census, the volumes not recorded"
            ));
            let mut costs = Vec::new();
            for _ in 0..EVENTS {
                let _ = leases.delete(CENSUS_NAME, &DeleteParams::default()).await;
                let t = named_target_as(stack, None, false).await?;
                costs.push(measure(&f, &t.m.instance, Some(&t.node), ec2, kube).await?);
            }
            cases.push(("this cluster's, every Node and attachment listed", costs));
            for (case, costs) in &cases {
                keep(&mut out, line(n, case, costs));
            }
            witness_rounds(&f, &leases, n, ec2, kube, clock, &mut witness).await?;
        }
        Ok((out, witness))
    }
}
