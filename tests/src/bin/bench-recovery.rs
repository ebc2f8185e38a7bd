//! The recovery-time benchmark: the seed scenario, several times, on the
//! controller stack (kube-controller-manager, kube-scheduler, kwok, moto, the
//! real CSI external-attacher in front of each driver's controller), with node-fencer through the real binary under
//! `cargo lambda watch` and in-process with every API call timed; optionally
//! the same scenario without node-fencer; and a storm of many nodes at once.
//! With `--hung`, node 2 hangs instead (its instance keeps running) and
//! active fencing powers it off on the `KubeNodeNotReady` alert.
//! With `--cloud gce`, the seed runs on Compute Engine: VMs and Persistent
//! Disks in the fake Compute Engine, node 2's VM `TERMINATED`, the direct
//! invocation as the event, through the binary.
//! Prints medians with min/max, and draws the median milestones of each case
//! on one time axis (an SVG for the docs, text for the terminal). Figures,
//! not pass/fail.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, anyhow, bail};
use node_fencer::core::inbound::suspect::{Batch, Intent, NodeRef, Origin, Suspect};
use node_fencer::core::model::instance::InstanceId;
use node_fencer::core::outbound::report::{Outcome, Report};
use node_fencer::core::rules::mode::ModeSetting;
use node_fencer::core::settings::policy::Policy;
use node_fencer::pipeline::{self, Ctx};
use node_fencer::shell::cloud::Cloud;
use node_fencer::shell::cloud::aws::Ec2;
use node_fencer::shell::cluster::{ClusterReads, Kube};
use node_fencer_tests::Stack;
use node_fencer_tests::attacher::Driver;
use node_fencer_tests::bench::{Clock, median};
use node_fencer_tests::cluster::{cluster_stack, old_cluster_stack, oldest_cluster_stack};
use node_fencer_tests::fixtures::{event_time, fenced_at, instance_state, stop, unique};
use node_fencer_tests::lambda::{Emulator, WEBHOOK_TOKEN, start_emulator, start_gce_emulator};
use node_fencer_tests::recovery_timeline::{self, Lane, Phase};
use node_fencer_tests::scene::*;
use node_fencer_tests::timing::Timeline;
use serde_json::Value;

const USAGE: &str = "\
usage: bench-recovery [--runs N] [--mode both|lambda|in-process] [--baseline]
                      [--baseline-wait SECS] [--storm NODES:STOPPED] [--no-storm]
                      [--driver ebs|cstor] [--fencing taint|legacy] [--svg PATH] [--svg-docs]
                      [--event-at-stop] [--hung] [--cloud aws|gce]
                      [--no-fast-not-ready] [--kubelet-silent-first]
                      [--graceful-shutdown SECS]
                      [--old-control-plane | --oldest-control-plane]
                      [--without-release]

Runs the seed scenario (a StatefulSet and a Deployment with ReadWriteOnce
volumes on node 2; node 2's instance stops) N times per mode and prints medians
with min/max:
  --runs N             seed runs per mode (default 5)
  --mode M             lambda: the EventBridge `stopped` event through the real
                       binary under cargo lambda watch; in-process: the same
                       pipeline with every API call timed; both (default)
  --baseline           also run the scenario without node-fencer, once left
                       alone and once with the operator's remedy (force-delete
                       the pods), watched for --baseline-wait seconds (default 420)
  --hung               instead of the stopped instance, a hung node: node 2's
                       heartbeats stop and its instance keeps running. N runs
                       through the binary (whatever --mode says) with
                       ACTIVE_FENCING=on and POWER_OFF_AFTER_SECONDS=60, sent the
                       firing KubeNodeNotReady alert through the Function URL every
                       5 s from NotReady on, as a monitoring repeats it (the early
                       ones are refused: not_ready_too_short); then one run with
                       active fencing off, watched for --baseline-wait seconds
  --storm NODES:STOPPED  storm size (default 50:20): STOPPED instances of NODES
                       stop at once, fenced as one batch in-process and as
                       concurrent EventBridge events through the binary
  --no-storm           skip the storm
  --driver D           the volumes' CSI driver: ebs (default, against moto) or
                       cstor (cStor over iSCSI, no cloud call)
  --fencing F          node-fencer's FENCING_MODE: taint (default) or legacy
  --svg PATH           where the timeline picture goes (default
                       $CARGO_TARGET_DIR/bench/recovery-timeline.svg, or
                       recovery-timeline-<driver>-<fencing>.svg there for other
                       drivers and modes: outside the checkout's tracked files);
                       the same timeline is printed as text
  --svg-docs           write the picture into docs/ instead, where the docs link
                       it: refused for docs/recovery-timeline.svg unless the
                       run drew every lane the docs show (--mode both
                       --baseline, EBS, taint mode)
  --event-at-stop      send the `stopped` event right at the stop, as EC2 does,
                       while the Node is still Ready (node-fencer waits for it
                       to turn NotReady); by default it is sent once NotReady
  --no-fast-not-ready  node-fencer with FAST_NOT_READY=false: a Node still Ready
                       is waited for until the node controller marks it. By
                       default (FAST_NOT_READY=true, node-fencer's own default),
                       one whose kubelet has not renewed its Lease since the
                       cloud's recorded stop (by 5 s), and has missed a renewal
                       it was due to make (by 5 s), is marked Ready=Unknown
                       then
  --kubelet-silent-first
                       node 2's heartbeats stop 7 s before its instance does (a
                       kubelet dead before its machine is stopped), so that the
                       Lease proves it silent since the stop; times still run
                       from the instance's stop. Run with and without
                       --no-fast-not-ready for the side-by-side
  --graceful-shutdown SECS
                       with --event-at-stop: an ordinary stop. EC2 records the
                       stop request; node 2's kubelet keeps renewing its Lease
                       for SECS (the guest's shutdown), then falls silent, and
                       the instance reaches `stopped` 7 s later, when its event
                       is sent (timed then, as EC2 times it). Times run from
                       that event; FAST_NOT_READY proves the kubelet silent
                       against the event's time, not the request's
  --old-control-plane  on the old control plane setup.sh builds (Kubernetes 1.25:
                       no out-of-service taint), with --fencing legacy; --baseline
                       adds the runbook of deleting the Node and its
                       VolumeAttachments by hand
  --oldest-control-plane
                       the same on the oldest Kubernetes node-fencer supports,
                       1.15 (seed 001's, built by setup.sh from
                       tests/stack/gomod/kubernetes-1.15), with its own
                       external-attacher (v2.0.0); node 2 is a kwok node there
                       (no hollow kubelet is built for 1.15)
  --without-release    in-process only: the legacy recipe without its release of
                       the freed volumes from the Node's volumesInUse (the call is
                       not made), as it was before, for the side-by-side
  --cloud C            aws (default): EC2 instances in moto; gce: Compute Engine
                       VMs and Persistent Disks (pd.csi.storage.gke.io) in the
                       fake Compute Engine (tests/gce/fake_compute.py, detach
                       operations DONE after 0.5 s), node 2's VM set TERMINATED,
                       node-fencer invoked directly ({\"action\": \"fence\"})
                       through the binary once the Node is NotReady (at the
                       stop with --event-at-stop; the VM's lastStopTimestamp
                       is the recorded stop); seed runs, --hung (node 2's VM
                       stays RUNNING, stopped by instances.stop), --baseline
                       and --no-fast-not-ready only (not --storm,
                       --graceful-shutdown, in-process)

The stack's --node-monitor-grace-period is 10 s; set
NODE_FENCER_NODE_MONITOR_GRACE_PERIOD=50s (Kubernetes' default) for another.

Set NODE_FENCER_CLUSTER_STACK_DIR to use a stack started with
`tests/stack/up.sh DIR --controllers`; otherwise one is started and stopped.";

/// With `--kubelet-silent-first`, how long before its instance node 2's
/// heartbeats stop: the 5 s margin, and kwok's 2 s renewal interval (the
/// missed renewal the proof also asks for comes up to 15 s after the
/// last one, with the real kubelet's 10 s cadence).
const SILENT_FIRST_SECS: u64 = 7;

struct Args {
    runs: usize,
    lambda: bool,
    in_process: bool,
    baseline: bool,
    baseline_wait: Duration,
    storm: Option<(usize, usize)>,
    driver: Driver,
    fencing: ModeSetting,
    svg: Option<PathBuf>,
    svg_docs: bool,
    event_at_stop: bool,
    hung: bool,
    gce: bool,
    fast_not_ready: bool,
    silent_first: bool,
    graceful_shutdown: Option<u64>,
    plane: Plane,
    without_release: bool,
}

/// The control plane the scenario runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plane {
    /// The stack's own Kubernetes.
    Current,
    /// The old one (1.25): no out-of-service taint.
    Old,
    /// The oldest node-fencer supports (1.15).
    Oldest,
}

impl Plane {
    /// Its pictures' suffix.
    fn tag(self) -> &'static str {
        match self {
            Self::Current => "",
            Self::Old => "-old",
            Self::Oldest => "-oldest",
        }
    }

    /// Its option.
    fn option(self) -> &'static str {
        match self {
            Self::Current => "",
            Self::Old => "--old-control-plane",
            Self::Oldest => "--oldest-control-plane",
        }
    }

    fn stack(self) -> &'static Stack {
        match self {
            Self::Current => cluster_stack(),
            Self::Old => old_cluster_stack(),
            Self::Oldest => oldest_cluster_stack(),
        }
    }
}

impl Args {
    /// The picture's path: as given; else under `docs/` when asked, by
    /// driver and mode; else the same name in the build's own directory,
    /// which no checkout tracks.
    fn svg_path(&self) -> PathBuf {
        if let Some(p) = &self.svg {
            return p.clone();
        }
        let name = picture_name(self.driver, self.fencing, self.plane);
        let dir = if self.svg_docs {
            repo_root().join("docs")
        } else {
            bench_dir()
        };
        dir.join(name)
    }
}

/// The checkout this benchmark belongs to.
fn repo_root() -> PathBuf {
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    tests.parent().unwrap_or(tests).to_path_buf()
}

/// Where a run's pictures go unless told: `bench/` under the build's own
/// directory (`CARGO_TARGET_DIR`, which `make` points outside the clone;
/// else the checkout's ignored `target/`).
fn bench_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| repo_root().join("target"), PathBuf::from)
        .join("bench")
}

/// The picture's file name, by driver and mode.
fn picture_name(driver: Driver, fencing: ModeSetting, plane: Plane) -> String {
    match (driver, fencing, plane.tag()) {
        (Driver::Ebs, ModeSetting::Taint, "") => "recovery-timeline.svg".to_owned(),
        (d, f, old) => format!("recovery-timeline-{}-{}{old}.svg", driver_tag(d), f.name()),
    }
}

/// The lanes the docs' own picture shows that `lanes` lacks, when `path`
/// is that picture; none otherwise.
fn missing_docs_lanes(
    path: &std::path::Path,
    lanes: &[recovery_timeline::Lane],
) -> Vec<&'static str> {
    if path != repo_root().join("docs").join("recovery-timeline.svg") {
        return Vec::new();
    }
    recovery_timeline::DOCS_LANES
        .into_iter()
        .filter(|want| !lanes.iter().any(|l| l.name == *want))
        .collect()
}

fn driver_tag(d: Driver) -> &'static str {
    match d {
        Driver::Ebs => "ebs",
        Driver::Cstor => "cstor",
        Driver::Pd => "pd",
    }
}

fn parse_args() -> anyhow::Result<Option<Args>> {
    let mut args = Args {
        runs: 5,
        lambda: true,
        in_process: true,
        baseline: false,
        baseline_wait: Duration::from_secs(420),
        storm: Some((50, 20)),
        driver: Driver::Ebs,
        fencing: ModeSetting::Taint,
        svg: None,
        svg_docs: false,
        event_at_stop: false,
        hung: false,
        gce: false,
        fast_not_ready: true,
        silent_first: false,
        graceful_shutdown: None,
        plane: Plane::Current,
        without_release: false,
    };
    let (mut storm_set, mut mode_set, mut driver_set) = (false, false, false);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "--runs" => args.runs = value("--runs")?.parse().context("--runs: a number")?,
            "--mode" => {
                mode_set = true;
                match value("--mode")?.as_str() {
                    "both" => (args.lambda, args.in_process) = (true, true),
                    "lambda" => (args.lambda, args.in_process) = (true, false),
                    "in-process" => (args.lambda, args.in_process) = (false, true),
                    other => bail!("--mode: both, lambda or in-process, not {other:?}"),
                }
            }
            "--baseline" => args.baseline = true,
            "--baseline-wait" => {
                args.baseline_wait = Duration::from_secs(
                    value("--baseline-wait")?
                        .parse()
                        .context("--baseline-wait: seconds")?,
                );
            }
            "--storm" => {
                let v = value("--storm")?;
                let (n, s) = v.split_once(':').context("--storm NODES:STOPPED")?;
                let (n, s): (usize, usize) = (n.parse()?, s.parse()?);
                if s == 0 || s > n {
                    bail!("--storm: 0 < STOPPED <= NODES");
                }
                args.storm = Some((n, s));
                storm_set = true;
            }
            "--no-storm" => args.storm = None,
            "--driver" => {
                driver_set = true;
                args.driver = match value("--driver")?.as_str() {
                    "ebs" => Driver::Ebs,
                    "cstor" => Driver::Cstor,
                    other => bail!("--driver: ebs or cstor, not {other:?}"),
                }
            }
            "--fencing" => {
                args.fencing = match value("--fencing")?.as_str() {
                    "taint" => ModeSetting::Taint,
                    "legacy" => ModeSetting::Legacy,
                    other => bail!("--fencing: taint or legacy, not {other:?}"),
                }
            }
            "--svg" => args.svg = Some(PathBuf::from(value("--svg")?)),
            "--svg-docs" => args.svg_docs = true,
            "--event-at-stop" => args.event_at_stop = true,
            "--hung" => args.hung = true,
            "--no-fast-not-ready" => args.fast_not_ready = false,
            "--kubelet-silent-first" => args.silent_first = true,
            "--graceful-shutdown" => {
                let secs = value("--graceful-shutdown")?;
                args.graceful_shutdown =
                    Some(secs.parse().context("--graceful-shutdown: seconds")?);
            }
            "--old-control-plane" | "--oldest-control-plane" => {
                if args.plane != Plane::Current {
                    bail!("--old-control-plane and --oldest-control-plane exclude each other");
                }
                args.plane = if a == "--old-control-plane" {
                    Plane::Old
                } else {
                    Plane::Oldest
                };
            }
            "--without-release" => args.without_release = true,
            "--cloud" => {
                args.gce = match value("--cloud")?.as_str() {
                    "aws" => false,
                    "gce" => true,
                    other => bail!("--cloud: aws or gce, not {other:?}"),
                }
            }
            other => bail!("unknown argument {other:?} (see --help)"),
        }
    }
    if args.gce {
        if driver_set || storm_set || args.graceful_shutdown.is_some() {
            bail!(
                "--cloud gce: the seed runs with Persistent Disks, --hung, --baseline, \
                 --event-at-stop and --no-fast-not-ready; not --driver, --storm or \
                 --graceful-shutdown"
            );
        }
        if mode_set && args.in_process {
            bail!("--cloud gce: through the binary only (--mode lambda)");
        }
        (args.driver, args.storm) = (Driver::Pd, None);
        (args.lambda, args.in_process) = (true, false);
    }
    if args.graceful_shutdown.is_some() && (!args.event_at_stop || args.silent_first) {
        bail!("--graceful-shutdown: with --event-at-stop, not with --kubelet-silent-first");
    }
    if args.hung {
        // The hung case replaces the stopped instance's seed runs.
        (args.lambda, args.in_process) = (false, false);
    }
    check_old_control_plane(&args)?;
    Ok(Some(args))
}

/// What the older control planes and the recipe without its release go with.
fn check_old_control_plane(args: &Args) -> anyhow::Result<()> {
    if args.plane != Plane::Current
        && (args.fencing != ModeSetting::Legacy || args.gce || args.hung || args.storm.is_some())
    {
        bail!(
            "{}: with --fencing legacy and --no-storm (the taint is not on there), not with \
             --cloud gce or --hung",
            args.plane.option()
        );
    }
    if args.without_release && (args.lambda || args.fencing != ModeSetting::Legacy) {
        bail!("--without-release: with --mode in-process and --fencing legacy");
    }
    Ok(())
}

/// Samples of one figure, in seconds.
#[derive(Default)]
struct Figure {
    name: String,
    samples: Vec<f64>,
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn fmt_secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else {
        format!("{s:.1} s")
    }
}

/// A table of figures: name, median, min, max, n.
struct Table {
    title: String,
    rows: Vec<Figure>,
}

impl Table {
    fn new(title: &str) -> Self {
        Self {
            title: title.into(),
            rows: Vec::new(),
        }
    }

    fn add(&mut self, name: &str, sample: f64) {
        match self.rows.iter_mut().find(|f| f.name == name) {
            Some(f) => f.samples.push(sample),
            None => self.rows.push(Figure {
                name: name.into(),
                samples: vec![sample],
            }),
        }
    }

    fn print(&self) {
        println!("\n### {}\n", self.title);
        println!("| | median | min | max | runs |");
        println!("| --- | ---: | ---: | ---: | ---: |");
        for f in &self.rows {
            if let Some((med, min, max)) = median(&f.samples) {
                println!(
                    "| {} | {} | {} | {} | {} |",
                    f.name,
                    fmt_secs(med),
                    fmt_secs(min),
                    fmt_secs(max),
                    f.samples.len()
                );
            }
        }
    }
}

/// Every run's milestones per case, in seconds since the stop; the
/// timeline draws their medians.
#[derive(Default)]
struct Milestones {
    lanes: Vec<CaseSamples>,
}

/// One case's samples: per phase, and how long unrecovered runs were watched.
struct CaseSamples {
    name: String,
    marks: BTreeMap<Phase, Vec<f64>>,
    watched: Vec<f64>,
}

impl Milestones {
    fn lane(&mut self, name: &str) -> &mut CaseSamples {
        let at = match self.lanes.iter().position(|c| c.name == name) {
            Some(i) => i,
            None => {
                self.lanes.push(CaseSamples {
                    name: name.to_owned(),
                    marks: BTreeMap::new(),
                    watched: Vec::new(),
                });
                self.lanes.len() - 1
            }
        };
        &mut self.lanes[at]
    }

    fn add(&mut self, lane: &str, phase: Phase, at: Duration) {
        let marks = &mut self.lane(lane).marks;
        marks.entry(phase).or_default().push(secs(at));
    }

    /// The case was watched this long without recovering.
    fn unrecovered(&mut self, lane: &str, watched: Duration) {
        self.lane(lane).watched.push(secs(watched));
    }

    fn lanes(&self) -> Vec<Lane> {
        self.lanes
            .iter()
            .map(|c| Lane {
                name: c.name.clone(),
                marks: c
                    .marks
                    .iter()
                    .filter_map(|(p, v)| median(v).map(|(m, _, _)| (*p, m)))
                    .collect(),
                watched_until: median(&c.watched).map(|(m, _, _)| m),
            })
            .collect()
    }
}

fn instance_ref(id: &str) -> anyhow::Result<NodeRef> {
    Ok(NodeRef::Instance(
        InstanceId::parse(id).ok_or_else(|| anyhow!("not an instance id: {id:?}"))?,
    ))
}

/// Clients kept across runs, as a warm execution environment keeps them
/// (connections open, TLS sessions established).
struct Warm {
    cloud: Ec2,
    cluster: Kube,
    /// `NOT_READY_WAIT_SECONDS`, as the binary gets it.
    not_ready_wait: Duration,
    /// `FAST_NOT_READY`, as the binary gets it.
    fast_not_ready: bool,
    /// The legacy recipe without its `volumesInUse` release (before).
    without_release: bool,
}

impl Warm {
    async fn new(
        stack: &Stack,
        not_ready_wait: Duration,
        (fast_not_ready, without_release): (bool, bool),
    ) -> anyhow::Result<Self> {
        let warm = Self {
            cloud: Ec2::new(stack.ec2().await),
            cluster: Kube::new(stack.fencer().await?, "bench-recovery"),
            not_ready_wait,
            fast_not_ready,
            without_release,
        };
        warm.cluster.list_nodes().await?;
        let unknown = InstanceId::parse("i-0ffffffffffffffff").context("an instance id")?;
        warm.cloud
            .describe_instances(&[unknown])
            .await
            .map_err(|e| anyhow!("{e}"))?;
        Ok(warm)
    }
}

/// The pipeline in-process on warm clients, every call timed, configured as
/// the binary is (poll interval 500 ms, detach wait 60 s).
async fn fence_timed(
    warm: &Warm,
    batch: Batch,
    max_out_of_service: usize,
    mode: ModeSetting,
) -> anyhow::Result<(Report, Timeline, Duration)> {
    let timeline = Timeline::new();
    if warm.without_release {
        timeline.without_release();
    }
    let (cloud, cluster) = timeline.wrap(&warm.cloud, &warm.cluster);
    let meter = node_fencer::core::outbound::metrics::Meter::default();
    let ctx = Ctx::new(&cloud, &cluster, &meter, unique("bench"));
    let policy = Policy {
        max_out_of_service,
        mode,
        recovery_settle: Duration::ZERO,
        detach_wait: Duration::from_secs(60),
        poll_interval: Duration::from_millis(500),
        not_ready_wait: warm.not_ready_wait,
        fast_not_ready: warm.fast_not_ready,
        ..Policy::default()
    };
    let report = pipeline::run(&ctx, &policy, batch).await?;
    let total = timeline.now();
    Ok((report, timeline, total))
}

/// Invokes the binary off the runtime's thread.
async fn invoke(emu: &'static Emulator, event: Value) -> anyhow::Result<(bool, String)> {
    tokio::task::spawn_blocking(move || emu.invoke(&event))
        .await?
        .map(|out| (out.error, out.output))
}

enum Mode<'a> {
    Lambda(&'static Emulator),
    InProcess(&'a Warm),
}

/// What every seed run shares.
struct Bench<'a> {
    stack: &'a Stack,
    clock: &'a Clock,
    driver: Driver,
    fencing: ModeSetting,
    /// The stack's `--node-monitor-grace-period`, in seconds.
    grace: u64,
    event_at_stop: bool,
    /// Node 2's heartbeats stop this long before its instance does.
    silent_first: Option<Duration>,
    /// Node 2's kubelet renews this long after its stop was asked for.
    graceful_shutdown: Option<Duration>,
}

impl Bench<'_> {
    /// Whether node-fencer taints: not in legacy mode.
    fn taints(&self) -> bool {
        !matches!(self.fencing, ModeSetting::Legacy)
    }
}

/// The stack's `--node-monitor-grace-period` in seconds, as `up.sh`
/// recorded it (`10s`, `50s`, `1m`).
fn grace_seconds(stack: &Stack) -> anyhow::Result<u64> {
    let v = stack
        .vars
        .get("NODE_FENCER_NODE_MONITOR_GRACE_PERIOD")
        .map_or("10s", String::as_str);
    let (n, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len()));
    let n: u64 = n.parse().with_context(|| format!("grace period {v:?}"))?;
    match unit {
        "" | "s" => Ok(n),
        "m" => Ok(n * 60),
        _ => bail!("grace period {v:?}: seconds (`50s`) or minutes (`1m`)"),
    }
}

/// The tables and milestones a seed run adds to.
struct Tables<'a> {
    whole: &'a mut Table,
    fencer: &'a mut Table,
    milestones: &'a mut Milestones,
}

/// When a seed run's event is sent: the scene, the stop on the wall
/// clock, and the event's time since the stop.
struct Start<'a> {
    seed: &'a Seed,
    stopped_wall: SystemTime,
    event: Duration,
}

/// Sends node 2's `stopped` event (through the binary, or in-process with
/// every call timed) and adds node-fencer's own figures; returns how long
/// it took from the event to the answer.
async fn fence_once(
    b: &Bench<'_>,
    mode: &Mode<'_>,
    at: &Start<'_>,
    fencer: &mut Table,
    milestones: &mut Milestones,
) -> anyhow::Result<Duration> {
    let admin = b.stack.admin().await?;
    let seed = at.seed;
    let node2 = seed.node2().name.clone();
    let (stopped_wall, event_at) = (at.stopped_wall, at.event);
    let event = Instant::now();
    match mode {
        Mode::Lambda(emu) => {
            let payload = if b.driver.on_gce() {
                serde_json::json!({"action": "fence", "node": node2})
            } else {
                eventbridge_event(&seed.node2().machine.instance, "stopped")
            };
            let (failed, output) = invoke(emu, payload).await?;
            let latency = event.elapsed();
            if failed {
                bail!("the invocation failed: {output}");
            }
            let report: Value = serde_json::from_str(&output)?;
            if report["results"][0]["outcome"] != "fenced" {
                bail!("not fenced: {report}");
            }
            let sent = if b.driver.on_gce() {
                "direct invocation sent → report received (through the binary)"
            } else {
                "EventBridge event sent → report received (through the binary)"
            };
            fencer.add(sent, secs(latency));
            // Inside the binary nothing is timed: the Node's `fenced-at`
            // (written with the taint) and the Events' times (recorded right
            // after the volumes were freed) tell, on the same machine's clock.
            let since_stop = |t: SystemTime| t.duration_since(stopped_wall).ok();
            if let (true, Some(t)) = (
                b.taints(),
                fenced_at(&admin, &node2).await?.and_then(since_stop),
            ) {
                milestones.add(LAMBDA_LANE, Phase::Tainted, t);
            }
            let mut freed = Vec::new();
            for reason in ["VolumesForceDetached", "VolumeAttachmentsDeleted"] {
                freed.extend(
                    event_time(&admin, &node2, reason)
                        .await?
                        .and_then(since_stop),
                );
            }
            // No such Event: node-fencer freed nothing itself (taint mode
            // with a driver other than EBS leaves it to Kubernetes).
            if let Some(freed) = freed.into_iter().max() {
                milestones.add(LAMBDA_LANE, Phase::Detached, freed);
            }
        }
        Mode::InProcess(warm) => {
            let batch = Batch {
                // As the binary reads EventBridge's `stopped` event: timed
                // when it is sent.
                suspects: vec![Suspect {
                    target: instance_ref(&seed.node2().machine.instance)?,
                    intent: Intent::Fence,
                    origin: Origin::Ec2StateChange {
                        event_id: None,
                        reported_state: "stopped".into(),
                        reported_at: Some(k8s_openapi::jiff::Timestamp::now().as_second()),
                    },
                }],
                ..Batch::default()
            };
            let (report, tl, total) = fence_timed(warm, batch, 1000, b.fencing).await?;
            if report.results.first().map(|r| r.outcome) != Some(Outcome::Fenced) {
                bail!("not fenced: {report:?}");
            }
            // In legacy mode the same patch marks the Node fenced, no taint.
            if let (true, Some(t)) = (b.taints(), tl.first_end("TaintNode")) {
                fencer.add("event received → taint applied", secs(t));
                milestones.add(IN_PROCESS_LANE, Phase::Tainted, event_at + t);
            }
            let freed = [
                tl.last_end("DetachVolume"),
                tl.last_end("DeleteVolumeAttachment"),
            ]
            .into_iter()
            .flatten()
            .max();
            if let Some(t) = freed {
                fencer.add(
                    "event received → volumes freed (DetachVolume or VolumeAttachment delete sent)",
                    secs(t),
                );
                milestones.add(IN_PROCESS_LANE, Phase::Detached, event_at + t);
            }
            fencer.add(
                "event received → volumes `available`, report ready",
                secs(total),
            );
            for (op, (count, spent)) in tl.by_op() {
                fencer.add(&format!("  {op} ({count} call(s), summed)"), secs(spent));
            }
        }
    }
    Ok(event.elapsed())
}

/// One seed run with node-fencer; adds its figures to the tables.
async fn seed_run(b: &Bench<'_>, mode: &Mode<'_>, t: Tables<'_>) -> anyhow::Result<()> {
    let Tables {
        whole,
        fencer,
        milestones,
    } = t;
    let (stack, clock) = (b.stack, b.clock);
    let admin = stack.admin().await?;
    let seed = seed_with(stack, b.driver).await?;
    let node2 = seed.node2().name.clone();
    gc_phase_pause().await;
    if let Some(before) = b.silent_first {
        silence(stack, seed.node2()).await?;
        tokio::time::sleep(before).await;
    }
    if let Some(shutdown) = b.graceful_shutdown {
        // EC2 records the request; the guest shuts down, its kubelet
        // renewing, then the instance gets to `stopped`: the stop from here.
        stop(&stack.ec2().await, &seed.node2().machine).await?;
        tokio::time::sleep(shutdown).await;
        silence(stack, seed.node2()).await?;
        tokio::time::sleep(Duration::from_secs(SILENT_FIRST_SECS)).await;
    }
    let stopped = Instant::now();
    let stopped_wall = SystemTime::now();
    kill_node2(stack, &seed, b.graceful_shutdown.is_some()).await?;
    let watch = async {
        let bound = Duration::from_secs(b.grace + 60);
        wait_not_ready(&admin, std::slice::from_ref(&node2), bound).await?;
        anyhow::Ok(stopped.elapsed())
    };
    let at = Start {
        seed: &seed,
        stopped_wall,
        event: Duration::ZERO,
    };
    let (not_ready, event_at, fenced) = if b.event_at_stop {
        // Sent at the stop, as EC2's notification comes: the invocation
        // waits for the Node to turn NotReady.
        let at = Start {
            event: stopped.elapsed(),
            ..at
        };
        let (not_ready, fenced) = tokio::join!(watch, fence_once(b, mode, &at, fencer, milestones));
        (not_ready?, at.event, fenced?)
    } else {
        let not_ready = watch.await?;
        let at = Start {
            event: stopped.elapsed(),
            ..at
        };
        (
            not_ready,
            at.event,
            fence_once(b, mode, &at, fencer, milestones).await?,
        )
    };
    let label = match mode {
        Mode::Lambda(_) => "lambda",
        Mode::InProcess(_) => "in-process",
    };
    // The controllers take it from here.
    let (pods_gone, [db, app]) = watch_recovery(stack, &seed, stopped).await?;
    let lane = match mode {
        Mode::Lambda(_) => LAMBDA_LANE,
        Mode::InProcess(_) => IN_PROCESS_LANE,
    };
    milestones.add(lane, Phase::NotReady, not_ready);
    milestones.add(lane, Phase::Event, event_at);
    milestones.add(lane, Phase::PodsDeleted, pods_gone);
    milestones.add(lane, Phase::Running, db.max(app));
    let since_event = |t: Duration| secs(t.saturating_sub(event_at));
    let machine = if b.driver.on_gce() { "VM" } else { "instance" };
    whole.add(
        &format!(
            "{machine} stopped → Node NotReady (grace period {} s)",
            b.grace
        ),
        secs(not_ready),
    );
    if b.event_at_stop {
        whole.add(&format!("{machine} stopped → event sent"), secs(event_at));
    }
    whole.add("event → node fenced (taint + detach done)", secs(fenced));
    whole.add("event → old pods force-deleted", since_event(pods_gone));
    whole.add(
        "event → db (StatefulSet) Running elsewhere, volume attached",
        since_event(db),
    );
    whole.add(
        "event → app (Deployment) Running elsewhere, volume attached",
        since_event(app),
    );
    whole.add(
        &format!("**{machine} stopped → both replacements Running with their volumes**"),
        secs(db.max(app)),
    );
    clock.say(&format!(
        "  {label}: NotReady {:.1}s, fenced {:.2}s after the event, db {:.1}s, app {:.1}s after the stop",
        secs(not_ready),
        secs(fenced),
        secs(db),
        secs(app)
    ));
    teardown_seed(&admin, &seed).await;
    Ok(())
}

/// A random pause before a run: the pod garbage collector runs every 20 s
/// and a run takes about as long, so that the runs do not all meet it at
/// one phase.
async fn gc_phase_pause() {
    let nanos = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(u64::from(nanos % 20_000))).await;
}

/// Once node 2 is fenced, waits (up to 180 s) until its pods are gone and
/// both workloads run elsewhere with their volumes; returns those times,
/// counted from `from`.
async fn watch_recovery(
    stack: &Stack,
    seed: &Seed,
    from: Instant,
) -> anyhow::Result<(Duration, [Duration; 2])> {
    let admin = stack.admin().await?;
    let mut pods_gone = None;
    let mut back = [None, None];
    let deadline = Instant::now() + Duration::from_secs(180);
    while back.iter().any(Option::is_none) || pods_gone.is_none() {
        if Instant::now() > deadline {
            bail!("not recovered 180 s after node 2 was fenced");
        }
        if pods_gone.is_none() && pods_left_on_node2(&admin, seed).await? == 0 {
            pods_gone = Some(from.elapsed());
        }
        note_recoveries(stack, seed, from, &mut back).await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok((
        pods_gone.unwrap_or_default(),
        back.map(Option::unwrap_or_default),
    ))
}

/// Records in `back` when db and app (in that order) first ran away from
/// node 2 with their volumes, counted from `stopped`; returns the names of
/// those that did since the last call.
async fn note_recoveries(
    stack: &Stack,
    seed: &Seed,
    stopped: Instant,
    back: &mut [Option<Duration>; 2],
) -> anyhow::Result<Vec<&'static str>> {
    let node2 = seed.node2().name.as_str();
    let mut now_back = Vec::new();
    for ((name, w), t) in [("db", &seed.db), ("app", &seed.app)]
        .into_iter()
        .zip(back.iter_mut())
    {
        if t.is_none()
            && running_with_volume(stack, seed, w, Some(node2))
                .await?
                .is_some()
        {
            *t = Some(stopped.elapsed());
            now_back.push(name);
        }
    }
    Ok(now_back)
}

/// The timeline's lane of each case.
const LAMBDA_LANE: &str = "node-fencer, through the binary";
const IN_PROCESS_LANE: &str = "node-fencer, in-process";
const RUNBOOK_LANE: &str = "force-delete runbook (no node-fencer)";
const NODE_RUNBOOK_LANE: &str = "Node and VolumeAttachments deleted by hand (no node-fencer)";
const ALONE_LANE: &str = "left alone (no node-fencer)";

/// What an operator does without node-fencer, once the node is NotReady.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Remedy {
    /// Nothing: the seed left alone.
    None,
    /// Force-delete the stuck pods (the usual runbook).
    ForceDeletePods,
    /// Delete the Node object and its VolumeAttachments (the runbook of an
    /// old self-managed cluster without the taint).
    DeleteNodeAndAttachments,
}

impl Remedy {
    fn lane(self) -> &'static str {
        match self {
            Self::None => ALONE_LANE,
            Self::ForceDeletePods => RUNBOOK_LANE,
            Self::DeleteNodeAndAttachments => NODE_RUNBOOK_LANE,
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Self::None => "baseline",
            Self::ForceDeletePods => "baseline + force-delete",
            Self::DeleteNodeAndAttachments => "baseline + Node and VolumeAttachments deleted",
        }
    }

    /// Applies it to the seed's node 2.
    async fn apply(self, admin: &kube::Client, seed: &Seed) -> anyhow::Result<()> {
        let node2 = seed.node2().name.as_str();
        match self {
            Self::None => {}
            Self::ForceDeletePods => {
                let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
                    kube::Api::namespaced(admin.clone(), &seed.namespace);
                for a in ["db", "app"] {
                    for p in pods(admin, &seed.namespace, a).await? {
                        if p.node.as_deref() == Some(node2) {
                            api.delete(
                                &p.name,
                                &kube::api::DeleteParams::default().grace_period(0),
                            )
                            .await?;
                        }
                    }
                }
            }
            Self::DeleteNodeAndAttachments => {
                let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
                    kube::Api::all(admin.clone());
                nodes
                    .delete(node2, &kube::api::DeleteParams::default())
                    .await?;
                let vas: kube::Api<k8s_openapi::api::storage::v1::VolumeAttachment> =
                    kube::Api::all(admin.clone());
                for va in vas.list(&kube::api::ListParams::default()).await? {
                    if va.spec.node_name == node2
                        && let Some(name) = va.metadata.name
                    {
                        vas.delete(&name, &kube::api::DeleteParams::default())
                            .await?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The seed scenario without node-fencer, watched for `wait`, with the
/// operator's `remedy` once the node is NotReady. Returns one line per
/// workload, and the case's milestones.
async fn baseline(
    stack: &'static Stack,
    driver: Driver,
    remedy: Remedy,
    wait: Duration,
    clock: &Clock,
) -> anyhow::Result<(Vec<String>, Milestones)> {
    let admin = stack.admin().await?;
    let seed = seed_with(stack, driver).await?;
    let mut milestones = Milestones::default();
    let (lane, tag) = (remedy.lane(), remedy.tag());
    let stopped = Instant::now();
    let not_ready =
        kill_node2_until_not_ready(stack, &seed, false, Duration::from_secs(60)).await?;
    milestones.add(lane, Phase::NotReady, not_ready);
    if remedy != Remedy::None {
        // Let Kubernetes evict first (tolerationSeconds), as an operator finds it.
        tokio::time::sleep(Duration::from_secs(
            u64::try_from(TOLERATION_SECONDS).unwrap_or(5) + 2,
        ))
        .await;
        remedy.apply(&admin, &seed).await?;
        clock.say(&format!(
            "  {tag}: done {:.0}s after the stop",
            secs(stopped.elapsed())
        ));
        milestones.add(lane, Phase::Event, stopped.elapsed());
        milestones.add(lane, Phase::PodsDeleted, stopped.elapsed());
    }
    let watch = Watch {
        tag,
        since: "the stop",
        from: stopped,
        wait,
    };
    let back = watch_stuck(stack, &seed, &watch, clock).await?;
    let out = watch.lines(back);
    match back {
        [Some(db), Some(app)] => milestones.add(lane, Phase::Running, db.max(app)),
        _ => milestones.unrecovered(lane, stopped.elapsed()),
    }
    teardown_seed(&admin, &seed).await;
    Ok((out, milestones))
}

/// A case watched without fencing: its name in the lines, what its times
/// count from, and for how long.
struct Watch<'a> {
    tag: &'a str,
    /// What `from` was, for the lines ("the stop").
    since: &'a str,
    from: Instant,
    wait: Duration,
}

impl Watch<'_> {
    /// One line per workload: when it recovered, or that it did not.
    fn lines(&self, back: [Option<Duration>; 2]) -> Vec<String> {
        let (tag, since) = (self.tag, self.since);
        let line = |what: &str, t: Option<Duration>| match t {
            Some(t) => format!(
                "{tag}: {what} Running elsewhere with its volume {:.0} s after {since}",
                secs(t)
            ),
            None => format!(
                "{tag}: {what} not recovered after {:.0} s",
                secs(self.from.elapsed())
            ),
        };
        vec![
            line("db (StatefulSet)", back[0]),
            line("app (Deployment)", back[1]),
        ]
    }
}

/// Watches the seed until both workloads ran elsewhere with their volumes
/// or `wait` is over, saying every 30 s where they are; returns when each
/// recovered, counted from `from`.
async fn watch_stuck(
    stack: &Stack,
    seed: &Seed,
    w: &Watch<'_>,
    clock: &Clock,
) -> anyhow::Result<[Option<Duration>; 2]> {
    let (tag, from) = (w.tag, w.from);
    let mut back = [None, None];
    let mut next_report = Duration::from_secs(30);
    while from.elapsed() < w.wait && back.iter().any(Option::is_none) {
        for name in note_recoveries(stack, seed, from, &mut back).await? {
            clock.say(&format!(
                "  {tag}: {name} recovered after {:.0}s",
                secs(from.elapsed())
            ));
        }
        if from.elapsed() >= next_report {
            let st = stuck(stack, seed).await?;
            clock.say(&format!(
                "  {tag}: {:.0}s after {}: {}",
                secs(from.elapsed()),
                w.since,
                stuck_words(&st, back)
            ));
            next_report += Duration::from_secs(30);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(back)
}

/// Where db and app are, in words: recovered, or how they are stuck.
fn stuck_words(st: &Stuck, [db, app]: [Option<Duration>; 2]) -> String {
    format!(
        "db {}, app {}, {} Multi-Attach event(s)",
        if db.is_some() {
            "recovered"
        } else if st.db_terminating {
            "Terminating on node 2"
        } else {
            "not running with its volume"
        },
        if app.is_some() {
            "recovered"
        } else if st.app_replacement_without_volume {
            "replacement without its volume"
        } else {
            "not running with its volume"
        },
        st.multi_attach.len()
    )
}

/// How often the hung case sends the `KubeNodeNotReady` alert from NotReady
/// on, as a monitoring repeats a firing alert.
const ALERT_EVERY: Duration = Duration::from_secs(5);
/// How often the hung case with active fencing off sends it.
const ALERT_EVERY_OFF: Duration = Duration::from_secs(30);
/// `POWER_OFF_AFTER_SECONDS` of the hung case: the shortest allowed.
const POWER_OFF_AFTER: &str = "60";

/// Posts a firing `KubeNodeNotReady` alert for `node` to the Function URL
/// (off the runtime's thread); returns the report's entry for the node.
async fn alert(emu: &'static Emulator, node: &str) -> anyhow::Result<Value> {
    let body = kube_node_not_ready(&[node]).to_string();
    let authorization = format!("Bearer {WEBHOOK_TOKEN}");
    let (status, text) =
        tokio::task::spawn_blocking(move || emu.post_function_url(&body, Some(&authorization)))
            .await??;
    if status != 200 {
        bail!("the alert was answered {status}: {text}");
    }
    let report: Value = serde_json::from_str(&text)?;
    report["results"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["node"] == node))
        .cloned()
        .with_context(|| format!("no result for {node}: {report}"))
}

/// Sends the alert every [`ALERT_EVERY`] until it is answered `fenced`
/// (at most until `bound` after `hung`); returns when, since `hung`, the
/// accepted one was sent, and how many were refused as too early before it.
async fn alert_until_fenced(
    emu: &'static Emulator,
    node: &str,
    hung: Instant,
    bound: Duration,
) -> anyhow::Result<(Duration, usize)> {
    let mut refused = 0;
    loop {
        let sent = hung.elapsed();
        let r = alert(emu, node).await?;
        let refusal = &r["power_off"]["refusal"]["reason"];
        match r["outcome"].as_str() {
            Some("fenced") if r["power_off"]["outcome"] == "stopped" => return Ok((sent, refused)),
            Some("skipped") if refusal == "not_ready_too_short" => refused += 1,
            _ => bail!(
                "the alert was answered neither `fenced` after a power-off nor too early: {r}"
            ),
        }
        if hung.elapsed() > bound {
            bail!("no alert accepted {} s after the hang", bound.as_secs());
        }
        tokio::time::sleep((sent + ALERT_EVERY).saturating_sub(hung.elapsed())).await;
    }
}

/// When, since `from`, the cloud first reports node 2's machine off: moto
/// its instance `stopped`, the fake Compute Engine its VM `TERMINATED`
/// (asked every 100 ms until `bound` after `from`).
async fn seen_stopped(
    stack: &Stack,
    seed: &Seed,
    from: Instant,
    bound: Duration,
) -> anyhow::Result<Duration> {
    while from.elapsed() < bound {
        if matches!(
            node2_state(stack, seed).await?.as_str(),
            "stopped" | "TERMINATED"
        ) {
            return Ok(from.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!(
        "the machine was not off {} s after the hang",
        bound.as_secs()
    )
}

/// Node 2's machine's state as its cloud names it: moto's instance state,
/// or the fake Compute Engine's VM status (`gone` once deleted).
async fn node2_state(stack: &Stack, seed: &Seed) -> anyhow::Result<String> {
    let machine = &seed.node2().machine;
    match &machine.vm {
        Some(vm) => Ok(node_fencer_tests::gce::fake_compute()
            .client()
            .status(vm)
            .await?
            .unwrap_or_else(|| "gone".into())),
        None => instance_state(&stack.ec2().await, &machine.instance).await,
    }
}

/// Stops node 2's heartbeats and keeps its instance running (a hung node),
/// then waits until it is NotReady; returns the time from the hang to
/// NotReady, and the hang on both clocks.
async fn hang_node2(b: &Bench<'_>, seed: &Seed) -> anyhow::Result<(Duration, Instant, SystemTime)> {
    let (hung, hung_wall) = (Instant::now(), SystemTime::now());
    let bound = Duration::from_secs(b.grace + 60);
    let not_ready = kill_node2_until_not_ready(b.stack, seed, true, bound).await?;
    Ok((not_ready, hung, hung_wall))
}

/// One hung-node run with active fencing, through the binary: the alert
/// every [`ALERT_EVERY`] from NotReady on until one is accepted. Adds its
/// figures to `table`; returns how many alerts were refused as too early.
async fn hung_run(
    b: &Bench<'_>,
    emu: &'static Emulator,
    table: &mut Table,
) -> anyhow::Result<usize> {
    let admin = b.stack.admin().await?;
    let seed = seed_with(b.stack, b.driver).await?;
    let node2 = seed.node2().name.clone();
    gc_phase_pause().await;
    let (not_ready, hung, hung_wall) = hang_node2(b, &seed).await?;
    let bound = not_ready + Duration::from_secs(180);
    let ((accepted, refused), stopped) = tokio::try_join!(
        alert_until_fenced(emu, &node2, hung, bound),
        seen_stopped(b.stack, &seed, hung, bound),
    )?;
    let answered = hung.elapsed();
    // The binary is not timed inside: the PoweredOff Event and the Node's
    // `fenced-at` tell, on the same machine's clock.
    let since_hang = |t: SystemTime| t.duration_since(hung_wall).ok();
    let powered_off = (event_time(&admin, &node2, "PoweredOff").await?)
        .and_then(since_hang)
        .context("no PoweredOff Event on node 2")?;
    let fenced = (fenced_at(&admin, &node2).await?)
        .and_then(since_hang)
        .context("node 2 not marked fenced")?;
    let (_, [db, app]) = watch_recovery(b.stack, &seed, hung).await?;
    let between = |from: Duration, to: Duration| secs(to.saturating_sub(from));
    let grace = format!("hang → Node NotReady (grace period {} s)", b.grace);
    table.add(&grace, secs(not_ready));
    table.add("NotReady → alert accepted", between(not_ready, accepted));
    table.add(
        "NotReady → power-off sent (`PoweredOff` Event)",
        between(not_ready, powered_off),
    );
    let off = if b.driver.on_gce() {
        "alert accepted → VM `TERMINATED` in the fake Compute Engine"
    } else {
        "alert accepted → instance `stopped` in moto"
    };
    table.add(off, between(accepted, stopped));
    table.add(
        "alert accepted → node fenced (taint applied)",
        between(accepted, fenced),
    );
    table.add(
        "alert accepted → report received (volumes detached)",
        between(accepted, answered),
    );
    table.add(
        "hang → db (StatefulSet) Running elsewhere, volume attached",
        secs(db),
    );
    table.add(
        "hang → app (Deployment) Running elsewhere, volume attached",
        secs(app),
    );
    table.add(
        "**hang → both replacements Running with their volumes**",
        secs(db.max(app)),
    );
    b.clock.say(&format!(
        "  hung: NotReady {:.1}s, {refused} alert(s) refused as too early, power-off {:.1}s after NotReady, \
         fenced {:.2}s after the accepted alert, db {:.1}s, app {:.1}s after the hang",
        secs(not_ready),
        between(not_ready, powered_off),
        between(accepted, fenced),
        secs(db),
        secs(app)
    ));
    teardown(&admin, Some(&seed.namespace), &seed.node_names()).await;
    Ok(refused)
}

/// The hung node with active fencing off: the alert every
/// [`ALERT_EVERY_OFF`] from NotReady on, watched for `wait` since the hang.
/// Returns lines.
async fn hung_left_running(
    b: &Bench<'_>,
    emu: &'static Emulator,
    wait: Duration,
) -> anyhow::Result<Vec<String>> {
    let admin = b.stack.admin().await?;
    let seed = seed_with(b.stack, b.driver).await?;
    let node2 = seed.node2().name.clone();
    let (not_ready, hung, _) = hang_node2(b, &seed).await?;
    let watch = Watch {
        tag: "hung, active fencing off",
        since: "the hang",
        from: hung,
        wait,
    };
    let alerts = async {
        let mut answers: BTreeMap<String, usize> = BTreeMap::new();
        while hung.elapsed() < wait {
            let r = alert(emu, &node2).await?;
            let answer = format!("{} ({})", r["outcome"], r["skip"]["reason"]);
            *answers.entry(answer.replace('"', "`")).or_default() += 1;
            tokio::time::sleep(ALERT_EVERY_OFF.min(wait.saturating_sub(hung.elapsed()))).await;
        }
        anyhow::Ok(answers)
    };
    let (back, answers) = tokio::try_join!(watch_stuck(b.stack, &seed, &watch, b.clock), alerts)?;
    let st = stuck(b.stack, &seed).await?;
    let state = node2_state(b.stack, &seed).await?;
    let answers: Vec<String> = answers
        .iter()
        .map(|(answer, n)| format!("{n} answered {answer}"))
        .collect();
    let mut lines = vec![format!(
        "{}: NotReady {:.1} s after the hang; alerts: {}",
        watch.tag,
        secs(not_ready),
        answers.join(", ")
    )];
    lines.extend(watch.lines(back));
    lines.push(format!(
        "{}: at the end: {}; node 2's instance `{state}`",
        watch.tag,
        stuck_words(&st, back)
    ));
    for l in &lines {
        b.clock.say(&format!("  {l}"));
    }
    teardown(&admin, Some(&seed.namespace), &seed.node_names()).await;
    Ok(lines)
}

/// Starts node-fencer under `cargo lambda watch` with `env` over the
/// defaults, and invokes it once (the emulator builds the function then).
async fn start_function(
    stack: &Stack,
    clock: &Clock,
    what: &str,
    env: &[(&str, &str)],
    gce: bool,
) -> anyhow::Result<&'static Emulator> {
    clock.say(&format!(
        "starting node-fencer under cargo lambda watch{what}"
    ));
    let emu = if gce {
        start_gce_emulator(stack, env)?
    } else {
        start_emulator(stack, env)?
    };
    let emu: &'static Emulator = Box::leak(Box::new(emu));
    let cold = Instant::now();
    let (_, _) = invoke(emu, eventbridge_event("i-0ffffffffffffffff", "stopped")).await?;
    clock.say(&format!(
        "  first invocation (the emulator builds and starts the function): {}",
        fmt_secs(secs(cold.elapsed()))
    ));
    Ok(emu)
}

/// The storm: `stopped` of `nodes` instances stop at once. Returns lines.
async fn storm(
    stack: &Stack,
    mode: &Mode<'_>,
    nodes: usize,
    stopped: usize,
    clock: &Clock,
) -> anyhow::Result<Vec<String>> {
    let admin = stack.admin().await?;
    let ec2 = stack.ec2().await;
    clock.say(&format!(
        "storm ({}): {nodes} nodes, {stopped} with a volume",
        match mode {
            Mode::Lambda(_) => "through the binary",
            Mode::InProcess(_) => "in-process",
        }
    ));
    let fleet = fleet(stack, nodes, |i| i < stopped).await?;
    for w in &fleet.workers[..stopped] {
        stop(&ec2, &w.machine).await?;
        stop_heartbeats(&admin, &w.name).await?;
    }
    let names: Vec<String> = fleet.workers[..stopped]
        .iter()
        .map(|w| w.name.clone())
        .collect();
    wait_not_ready(&admin, &names, Duration::from_secs(90)).await?;
    clock.say(&format!("  {stopped} nodes NotReady; fencing"));
    let start = Instant::now();
    let mut lines = Vec::new();
    match mode {
        Mode::InProcess(warm) => {
            let batch = Batch {
                suspects: fleet.workers[..stopped]
                    .iter()
                    .map(|w| {
                        Ok(Suspect {
                            target: instance_ref(&w.machine.instance)?,
                            intent: Intent::Fence,
                            origin: Origin::Direct,
                        })
                    })
                    .collect::<anyhow::Result<_>>()?,
                ..Batch::default()
            };
            let (report, tl, total) = fence_timed(warm, batch, 1000, ModeSetting::Taint).await?;
            let fenced = report
                .results
                .iter()
                .filter(|r| r.outcome == Outcome::Fenced)
                .count();
            let by_op: Vec<String> = tl
                .by_op()
                .iter()
                .map(|(op, (n, _))| format!("{op} {n}"))
                .collect();
            let calls = tl.calls();
            lines.push(format!(
                "in-process, one batch of {stopped}: {fenced} fenced in {}, {:.1} nodes/s; \
                 {calls} API calls ({}), {:.2} per fenced node",
                fmt_secs(secs(total)),
                fenced as f64 / secs(total).max(1e-9),
                by_op.join(", "),
                calls as f64 / (fenced.max(1)) as f64
            ));
        }
        Mode::Lambda(emu) => {
            let emu: &'static Emulator = emu;
            let mut tasks = Vec::new();
            for w in &fleet.workers[..stopped] {
                let event = eventbridge_event(&w.machine.instance, "stopped");
                tasks.push(tokio::spawn(invoke(emu, event)));
            }
            let mut fenced = 0;
            let mut failed = 0;
            for t in tasks {
                let (err, output) = t.await??;
                if err {
                    failed += 1;
                    continue;
                }
                let report: Value = serde_json::from_str(&output)?;
                fenced += report["results"]
                    .as_array()
                    .map(|r| r.iter().filter(|r| r["outcome"] == "fenced").count())
                    .unwrap_or(0);
            }
            let total = start.elapsed();
            lines.push(format!(
                "through the binary, {stopped} concurrent EventBridge events (one execution \
                 environment, as with reserved concurrency 1): {fenced} fenced, {failed} failed, \
                 in {}, {:.1} nodes/s",
                fmt_secs(secs(total)),
                fenced as f64 / secs(total).max(1e-9)
            ));
        }
    }
    let mut tainted = 0;
    for n in &names {
        if is_fenced(&admin, n).await? {
            tainted += 1;
        }
    }
    lines.push(format!("  tainted afterwards: {tainted} of {stopped}"));
    for l in &lines {
        clock.say(l);
    }
    teardown_fleet(&admin, &fleet).await;
    Ok(lines)
}

async fn run(args: Args) -> anyhow::Result<()> {
    let clock = Clock::start();
    clock.say("starting the controller stack (etcd, kube-apiserver, controllers, kwok, moto, CSI attacher)");
    let stack: &'static Stack = args.plane.stack();
    let admin = stack.admin().await?;
    ensure_storage_class(&admin).await?;
    let grace = grace_seconds(stack)?;
    // Room for the grace period and the node controller's 5-second checks.
    let not_ready_wait = (grace + 30).min(300).to_string();
    let env = vec![
        ("FENCING_MODE", args.fencing.name()),
        ("NOT_READY_WAIT_SECONDS", not_ready_wait.as_str()),
        (
            "FAST_NOT_READY",
            if args.fast_not_ready { "true" } else { "false" },
        ),
    ];
    let emu: Option<&'static Emulator> = if args.lambda || args.storm.is_some() {
        Some(start_function(stack, &clock, "", &env, args.gce).await?)
    } else {
        None
    };

    let warm = Warm::new(
        stack,
        Duration::from_secs(grace + 30),
        (args.fast_not_ready, args.without_release),
    )
    .await?;
    if args.gce {
        clock.say(&format!(
            "Compute Engine: the fake at {}, detach operations DONE after 0.5 s",
            node_fencer_tests::gce::fake_compute().endpoint()
        ));
    }
    let mut whole_lambda =
        Table::new("Whole recovery, node-fencer through the binary (cargo lambda watch)");
    let mut whole_inproc = Table::new("Whole recovery, node-fencer in-process");
    let mut fencer = Table::new("node-fencer's own latency");
    let mut milestones = Milestones::default();
    let bench = Bench {
        stack,
        clock: &clock,
        driver: args.driver,
        fencing: args.fencing,
        grace,
        event_at_stop: args.event_at_stop,
        silent_first: args
            .silent_first
            .then_some(Duration::from_secs(SILENT_FIRST_SECS)),
        graceful_shutdown: args.graceful_shutdown.map(Duration::from_secs),
    };
    clock.say(&format!(
        "volumes of {}, FENCING_MODE={}, FAST_NOT_READY={}{}",
        args.driver.name(),
        args.fencing.name(),
        args.fast_not_ready,
        match (args.silent_first, args.graceful_shutdown) {
            (true, _) => {
                format!(", node 2's heartbeats stop {SILENT_FIRST_SECS} s before its instance")
            }
            (false, Some(g)) => format!(
                ", node 2's kubelet renews {g} s after the stop request, silent \
                 {SILENT_FIRST_SECS} s before the `stopped` event"
            ),
            (false, None) => String::new(),
        }
    ));
    for i in 0..args.runs {
        if let (true, Some(emu)) = (args.lambda, emu) {
            clock.say(&format!(
                "seed run {}/{} through the binary",
                i + 1,
                args.runs
            ));
            let tables = Tables {
                whole: &mut whole_lambda,
                fencer: &mut fencer,
                milestones: &mut milestones,
            };
            seed_run(&bench, &Mode::Lambda(emu), tables).await?;
        }
        if args.in_process {
            clock.say(&format!("seed run {}/{} in-process", i + 1, args.runs));
            let tables = Tables {
                whole: &mut whole_inproc,
                fencer: &mut fencer,
                milestones: &mut milestones,
            };
            seed_run(&bench, &Mode::InProcess(&warm), tables).await?;
        }
    }

    let mut hung = Table::new(
        "Hung node, instance still running: active fencing through the binary (cargo lambda watch)",
    );
    let mut refused = Vec::new();
    let mut hung_off = Vec::new();
    if args.hung {
        let on = [
            env[0],
            env[1],
            ("ACTIVE_FENCING", "on"),
            ("POWER_OFF_AFTER_SECONDS", POWER_OFF_AFTER),
        ];
        let what = format!(", ACTIVE_FENCING=on, POWER_OFF_AFTER_SECONDS={POWER_OFF_AFTER}");
        let emu = start_function(stack, &clock, &what, &on, args.gce).await?;
        for i in 0..args.runs {
            clock.say(&format!(
                "hung run {}/{} through the binary",
                i + 1,
                args.runs
            ));
            refused.push(hung_run(&bench, emu, &mut hung).await?);
        }
        let off = [env[0], env[1], ("ACTIVE_FENCING", "off")];
        let emu = start_function(stack, &clock, ", ACTIVE_FENCING=off", &off, args.gce).await?;
        clock.say(&format!(
            "hung run with active fencing off, watched for {} s",
            args.baseline_wait.as_secs()
        ));
        hung_off = hung_left_running(&bench, emu, args.baseline_wait).await?;
    }

    let mut baseline_lines = Vec::new();
    if args.baseline {
        clock.say(&format!(
            "baseline: the seed scenario without node-fencer, watched for {} s (left alone, with the pods force-deleted, and on an older control plane with the Node and its VolumeAttachments deleted)",
            args.baseline_wait.as_secs()
        ));
        let node_runbook = async {
            if args.plane != Plane::Current {
                let case = Remedy::DeleteNodeAndAttachments;
                Some(baseline(stack, args.driver, case, args.baseline_wait, &clock).await)
            } else {
                None
            }
        };
        let (alone, remedy, node_runbook) = tokio::join!(
            baseline(stack, args.driver, Remedy::None, args.baseline_wait, &clock),
            baseline(
                stack,
                args.driver,
                Remedy::ForceDeletePods,
                args.baseline_wait,
                &clock
            ),
            node_runbook
        );
        for (lines, lanes) in [Some(remedy), node_runbook, Some(alone)]
            .into_iter()
            .flatten()
            .collect::<anyhow::Result<Vec<_>>>()?
        {
            baseline_lines.extend(lines);
            milestones.lanes.extend(lanes.lanes);
        }
    }

    let mut storm_lines = Vec::new();
    if let Some((nodes, stopped)) = args.storm {
        storm_lines.extend(storm(stack, &Mode::InProcess(&warm), nodes, stopped, &clock).await?);
        if let Some(emu) = emu {
            storm_lines.extend(storm(stack, &Mode::Lambda(emu), nodes, stopped, &clock).await?);
        }
    }

    println!("\n## Results\n");
    for t in [&fencer, &whole_lambda, &whole_inproc, &hung] {
        if !t.rows.is_empty() {
            t.print();
        }
    }
    if !refused.is_empty() {
        let refused: Vec<String> = refused.iter().map(ToString::to_string).collect();
        println!(
            "\nAlerts refused as too early (`not_ready_too_short`) before the accepted one, per run: {}",
            refused.join(", ")
        );
    }
    if !hung_off.is_empty() {
        println!("\n### Hung node, active fencing off\n");
        for l in &hung_off {
            println!("- {l}");
        }
    }
    if !baseline_lines.is_empty() {
        println!("\n### Without node-fencer\n");
        for l in &baseline_lines {
            println!("- {l}");
        }
    }
    if !storm_lines.is_empty() {
        println!("\n### Storm\n");
        for l in &storm_lines {
            println!("- {}", l.trim_start());
        }
    }
    let lanes = milestones.lanes();
    if !lanes.is_empty() {
        let title = format!(
            "Seed scenario, {} volumes, FENCING_MODE={}: medians, seconds since the instance stopped",
            args.driver.name(),
            args.fencing.name()
        );
        let path = args.svg_path();
        let missing = missing_docs_lanes(&path, &lanes);
        anyhow::ensure!(
            missing.is_empty(),
            "not writing {}: the docs' picture shows lanes this run did not draw ({}); run with --mode both --baseline, or without --svg-docs",
            path.display(),
            missing.join(", ")
        );
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&path, recovery_timeline::svg(&title, &lanes))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("\n### Timeline (medians; picture in {})\n", path.display());
        println!("```\n{}```", recovery_timeline::text(&lanes));
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let Some(args) = parse_args()? else {
        println!("{USAGE}");
        return Ok(());
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(args))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 49, item 4: a benchmark run leaves the checkout as it found it.
    /// Its pictures go to the build's directory unless asked for the docs,
    /// and the docs' own picture is written only with every lane it shows.
    #[test]
    fn a_run_writes_no_tracked_file_unless_asked() {
        for (driver, fencing, plane) in [
            (Driver::Ebs, ModeSetting::Taint, Plane::Current),
            (Driver::Cstor, ModeSetting::Legacy, Plane::Old),
            (Driver::Cstor, ModeSetting::Legacy, Plane::Oldest),
        ] {
            let name = picture_name(driver, fencing, plane);
            let path = bench_dir().join(&name);
            assert!(
                !path.starts_with(repo_root().join("docs")),
                "{}",
                path.display()
            );
            assert!(
                !path.starts_with(repo_root()) || path.starts_with(repo_root().join("target")),
                "{} is in the checkout and not under its ignored target/",
                path.display()
            );
        }
        let docs = repo_root().join("docs").join("recovery-timeline.svg");
        let one = vec![recovery_timeline::Lane {
            name: "node-fencer, through the binary".into(),
            marks: Vec::new(),
            watched_until: None,
        }];
        let missing = missing_docs_lanes(&docs, &one);
        assert_eq!(
            missing.len(),
            recovery_timeline::DOCS_LANES.len() - 1,
            "{missing:?}"
        );
        assert!(missing_docs_lanes(&bench_dir().join("recovery-timeline.svg"), &one).is_empty());
    }
}
