//! One run of the simulator: a seed makes a world (a few Nodes, their
//! machines, pods and disks), a policy, an adversary, and a schedule of
//! invocations of the real pipeline (`pipeline::run_until`): EventBridge's
//! events for each machine that stops, terminates or starts (late, or
//! twice, if the adversary says), the sweep on its schedule, operators'
//! requests, and Lambda's two retries of every invocation that failed,
//! left work or died. Several may run at once. For its first minutes the
//! adversary is at work; then it stops, and sweeps keep coming for six
//! minutes more, after which liveness is judged. All of it on tokio's
//! paused clock, on one thread: the same seed, the same run.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fastrand::Rng;
use futures::StreamExt;
use futures::future::LocalBoxFuture;
use futures::stream::FuturesUnordered;
use node_fencer::core::inbound::suspect::Batch;
use node_fencer::core::inbound::trigger::{direct, eventbridge};
use node_fencer::core::outbound::metrics::Meter;
use node_fencer::core::outbound::report::Report;
use node_fencer::core::rules::power::{ActiveFencing, Scope};
use node_fencer::core::settings::policy::Policy;
use node_fencer::pipeline::{self, Ctx};
use serde_json::json;

use crate::adversary::{Adversary, Asked, Moves};
use crate::invariants::{self, Heard};
use crate::shells::{Handle, Shared, SimClock, SimCloud, SimCluster, lock};
use crate::world::{Emitted, Ms, Violation, World, secs, timestamp};

/// How often the runner looks at the clock: starts what is due, lets the
/// adversary act while no call is made.
const TICK: Ms = 250;
/// A Lambda invocation's timeout (the module's default is about this).
const TIMEOUT: Ms = 300_000;
/// How long liveness waits once the adversary stops, and the sweeps in it.
const SETTLE: Ms = 360_000;
/// The sweeps' spacing once the adversary stops.
const SETTLE_SWEEPS: Ms = 60_000;

/// What one run found.
#[derive(Clone, Debug)]
pub struct Run {
    /// Its seed.
    pub seed: u64,
    /// What it drew beyond the default world.
    pub options: Options,
    /// The adversary's moves it carried out.
    pub moves: Moves,
    /// How many moves the adversary drew (carried out or not).
    pub drawn: usize,
    /// The invariants it broke.
    pub violations: Vec<Violation>,
    /// What happened, one line a line.
    pub story: String,
    /// The world, policy and swarm the seed drew.
    pub setup: String,
    /// How many invocations ran.
    pub invocations: usize,
    /// How many calls they made.
    pub calls: u64,
    /// How long the run lasted, in simulated time.
    pub simulated: Ms,
}

/// What a run may draw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Replacements that leave a stale Node: a kubelet on another machine
    /// adopts the Node object of its name, which still names the old
    /// machine. Drawn by default since the findings they showed were
    /// mended (docs/simulator-findings.md); without them, a seed
    /// draws as it did before.
    pub stale_nodes: bool,
    /// Active fencing, in half the runs ([`active_fencing`]): hung Nodes
    /// powered off. Drawn apart from the rest, so that without it a seed
    /// draws as it did before.
    pub active_fencing: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            stale_nodes: true,
            active_fencing: true,
        }
    }
}

impl Options {
    /// The flags that replay a run with these options.
    pub fn flags(&self) -> String {
        let mut flags = String::new();
        if !self.stale_nodes {
            flags.push_str(" --no-stale-nodes");
        }
        if !self.active_fencing {
            flags.push_str(" --no-active-fencing");
        }
        flags
    }
}

/// Runs `seed` on a paused clock.
pub fn run(seed: u64, options: Options) -> Run {
    replay(seed, options, Moves::All)
}

/// Runs `seed` on a paused clock, carrying out only the adversary's
/// `moves`.
pub fn replay(seed: u64, options: Options, moves: Moves) -> Run {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap_or_else(|e| panic!("a current-thread runtime: {e}"));
    runtime.block_on(simulate(seed, options, moves))
}

/// One invocation to start.
#[derive(Clone, Debug)]
struct Planned {
    /// Its correlation id (a Lambda retry keeps it).
    name: String,
    /// What it is, for the story.
    what: String,
    batch: Batch,
    attempt: u8,
}

/// How one invocation ended.
struct Finished {
    n: usize,
    plan: Planned,
    ended: Ended,
}

enum Ended {
    Report(Box<Report>),
    Failed(String),
    Killed,
}

/// The policy of a run: the defaults (`FAST_NOT_READY` on, a cap of 3),
/// now and then a dry run, a delay before the second look, the fast path
/// off, a cap of 1 or 2.
fn policy(rng: &mut Rng) -> Policy {
    let dry_run = rng.u8(..20) == 0;
    let fast_not_ready = rng.u8(..5) != 0;
    let delay = rng.u8(..4) == 0;
    let cap = [3, 3, 2, 1][rng.usize(..4)];
    Policy {
        dry_run,
        fast_not_ready,
        max_out_of_service: cap,
        confirm_again_after: Duration::from_secs(if delay { rng.u64(1..10) } else { 0 }),
        ..Policy::default()
    }
}

/// Active fencing for `seed`, from a generator of its own, so that the
/// seed's other draws are the same with it as without: off in half the
/// runs, else `stuck` or `on`, after one to three minutes of silence.
fn active_fencing(seed: u64) -> Option<ActiveFencing> {
    let mut rng = Rng::with_seed(seed ^ 0xAC71_FE00_0000_0000);
    if rng.bool() {
        return None;
    }
    Some(ActiveFencing {
        after: Duration::from_secs(rng.u64(60..=180)),
        wait: Duration::from_secs(30),
        scope: if rng.bool() {
            Scope::Stuck
        } else {
            Scope::AnyHung
        },
        ..ActiveFencing::default()
    })
}

/// The active fencing of a run, as its setup line tells it.
fn fencing_words(active: Option<&ActiveFencing>) -> String {
    match active {
        None => "off".into(),
        Some(a) => format!(
            "{} after {} s",
            match a.scope {
                Scope::Stuck => "stuck",
                Scope::AnyHung => "on",
            },
            a.after.as_secs()
        ),
    }
}

struct Schedule {
    plans: BTreeMap<(Ms, u64), Planned>,
    seq: u64,
}

impl Schedule {
    fn add(&mut self, at: Ms, plan: Planned) {
        self.seq += 1;
        self.plans.insert((at, self.seq), plan);
    }

    fn due(&mut self, now: Ms) -> Vec<Planned> {
        let mut out = Vec::new();
        while let Some(entry) = self.plans.first_entry() {
            if entry.key().0 > now {
                break;
            }
            out.push(entry.remove());
        }
        out
    }
}

async fn simulate(seed: u64, options: Options, moves: Moves) -> Run {
    let mut rng = Rng::with_seed(seed);
    let nodes = rng.usize(2..=4);
    let pods: Vec<usize> = (0..nodes).map(|_| rng.usize(0..=2)).collect();
    let staying = rng.u8(..8) == 0;
    let mut policy = policy(&mut rng);
    if options.active_fencing {
        policy.active_fencing = active_fencing(seed);
    }
    let world = World::new(rng.u64(..), &pods, staying);
    let adversary = Adversary::new(rng.u64(..), options.stale_nodes, moves.clone());
    let opening = rng.i64(5_000..40_000);
    let until = rng.i64(120_000..=300_000);
    let sweep_every = rng.i64(60_000..=300_000);
    let setup = format!(
        "{nodes} Nodes with {pods:?} pods{}; policy: cap {}, dry run {}, FAST_NOT_READY {}, second look after {:?}, ACTIVE_FENCING {}; adversary until {}: {}; sweeps every {}",
        if staying {
            " (one tolerating the taint)"
        } else {
            ""
        },
        policy.max_out_of_service,
        policy.dry_run,
        policy.fast_not_ready,
        policy.confirm_again_after,
        fencing_words(policy.active_fencing.as_ref()),
        secs(until),
        adversary.describe(),
        secs(sweep_every),
    );
    let h: Handle = Arc::new(Mutex::new(Shared::new(world, adversary, policy.clone())));
    lock(&h).world.story.say(0, format!("seed {seed}: {setup}"));
    let clock = Arc::new(SimClock::new());
    let policy = Arc::new(policy);
    let mut schedule = Schedule {
        plans: BTreeMap::new(),
        seq: 0,
    };
    let mut counts = Counts::default();
    let mut t = 0;
    while t < until {
        t += sweep_every;
        schedule.add(t.min(until), counts.sweep("the scheduled sweep"));
    }
    for k in 1..=SETTLE / SETTLE_SWEEPS {
        schedule.add(
            until + k * SETTLE_SWEEPS,
            counts.sweep("a sweep after the adversary"),
        );
    }
    let end = until + SETTLE;
    let mut running: FuturesUnordered<LocalBoxFuture<'static, Finished>> = FuturesUnordered::new();
    let start = tokio::time::Instant::now();
    let mut next = start;
    let (mut opened, mut healed, mut started) = (false, false, 0);
    loop {
        tokio::select! {
            biased;
            Some(done) = running.next(), if !running.is_empty() => {
                finished(&h, &mut schedule, done);
            }
            () = tokio::time::sleep_until(next) => {
                next += Duration::from_millis(TICK as u64);
                let now = lock(&h).now();
                {
                    let mut s = lock(&h);
                    s.step(true);
                    if !opened && now >= opening {
                        opened = true;
                        let Shared { world, adversary, .. } = &mut *s;
                        adversary.open(world);
                    }
                    if !healed && now >= until {
                        healed = true;
                        let Shared { world, adversary, .. } = &mut *s;
                        adversary.heal(world);
                    }
                }
                plan_events(&h, &mut schedule, &mut counts);
                for plan in schedule.due(now) {
                    started += 1;
                    running.push(invocation(&h, &policy, &clock, started, plan));
                }
                if now >= end && running.is_empty() {
                    break;
                }
                if now >= end + TIMEOUT {
                    lock(&h).world.violate("invocations still running long after their timeout".into());
                    break;
                }
            }
        }
    }
    let mut s = lock(&h);
    let now = s.now();
    s.world.advance_to(now);
    for broken in invariants::liveness(&s.world, &policy) {
        s.world.violate(broken);
    }
    Run {
        seed,
        options,
        moves,
        drawn: s.adversary.drawn,
        violations: s.world.violations.clone(),
        story: s.world.story.render(),
        setup,
        invocations: started,
        calls: s.calls,
        simulated: now,
    }
}

#[derive(Default)]
struct Counts {
    events: u32,
    sweeps: u32,
    directs: u32,
}

impl Counts {
    fn sweep(&mut self, what: &str) -> Planned {
        self.sweeps += 1;
        Planned {
            name: format!("sweep-{}", self.sweeps),
            what: what.to_owned(),
            batch: direct::sweep(),
            attempt: 0,
        }
    }
}

/// EventBridge's deliveries of what the world emitted, and the
/// adversary's own requests.
fn plan_events(h: &Handle, schedule: &mut Schedule, counts: &mut Counts) {
    let mut s = lock(h);
    let emitted: Vec<Emitted> = std::mem::take(&mut s.world.emitted);
    for e in emitted {
        counts.events += 1;
        let id = format!("ev-{}", counts.events);
        let event = json!({
            "version": "0",
            "id": id,
            "detail-type": "EC2 Instance State-change Notification",
            "source": "aws.ec2",
            "account": "123456789012",
            "time": timestamp(e.t - e.t.rem_euclid(1000)).to_string(),
            "region": "us-east-1",
            "resources": [],
            "detail": {"instance-id": e.instance.as_str(), "state": e.state},
        });
        let Ok(batch) = eventbridge::parse(event) else {
            s.world.violate(format!(
                "the event of {} {} does not parse",
                e.instance, e.state
            ));
            continue;
        };
        for delay in s.adversary.deliveries() {
            let plan = Planned {
                name: id.clone(),
                what: format!("EventBridge: {} {} at {}", e.instance, e.state, secs(e.t)),
                batch: batch.clone(),
                attempt: 0,
            };
            schedule.add(e.t + delay, plan);
        }
    }
    let t = s.world.t;
    for asked in std::mem::take(&mut s.adversary.asked) {
        let plan = match asked {
            Asked::Sweep => counts.sweep("a sweep out of schedule"),
            Asked::Fence(node) => {
                counts.directs += 1;
                let Ok(batch) = direct::parse_batch(json!({"action": "fence", "node": node}))
                else {
                    continue;
                };
                Planned {
                    name: format!("direct-{}", counts.directs),
                    what: format!("an operator's fence of {node}"),
                    batch,
                    attempt: 0,
                }
            }
        };
        schedule.add(t, plan);
    }
}

/// Invocation `n` of `plan`: the real pipeline over this run's shells, within
/// Lambda's timeout, killed earlier if the adversary says so.
fn invocation(
    h: &Handle,
    policy: &Arc<Policy>,
    clock: &Arc<SimClock>,
    n: usize,
    plan: Planned,
) -> LocalBoxFuture<'static, Finished> {
    let (h, policy, clock) = (h.clone(), policy.clone(), clock.clone());
    Box::pin(async move {
        let kill = {
            let mut s = lock(&h);
            let kill = s.adversary.kills_after();
            let t = s.now();
            s.world.advance_to(t);
            s.heard.insert(
                n,
                Heard {
                    name: format!("inv {n} ({})", plan.name),
                    switch_on: false,
                },
            );
            let retry = if plan.attempt > 0 {
                format!(", retry {}", plan.attempt)
            } else {
                String::new()
            };
            s.world.story.say(
                t,
                format!("inv {n} ({}) starts: {}{retry}", plan.name, plan.what),
            );
            kill
        };
        let cloud = SimCloud::new(h.clone(), n);
        let cluster = SimCluster::new(h.clone(), n);
        let meter = Meter::default();
        let ctx = Ctx::new(&cloud, &cluster, &meter, plan.name.clone()).with_clock(&*clock);
        let began = tokio::time::Instant::now();
        let deadline = began + Duration::from_millis(TIMEOUT as u64);
        let killed_at = kill.map_or(deadline, |after| {
            began + Duration::from_millis(after as u64)
        });
        let run = pipeline::run_until(&ctx, &policy, plan.batch.clone(), Some(deadline));
        let ended = match tokio::time::timeout_at(killed_at, run).await {
            Err(_) => Ended::Killed,
            Ok(Err(e)) => Ended::Failed(e.to_string()),
            Ok(Ok(report)) => Ended::Report(Box::new(report)),
        };
        Finished { n, plan, ended }
    })
}

/// Tells how an invocation ended, and plans Lambda's retry of one that
/// failed, left work or died (two at most, a minute and two minutes on).
fn finished(h: &Handle, schedule: &mut Schedule, done: Finished) {
    let mut s = lock(h);
    let t = s.now();
    s.world.advance_to(t);
    let Finished { n, plan, ended } = done;
    let (words, retry) = match &ended {
        Ended::Killed => ("dies (killed)".to_owned(), true),
        Ended::Failed(e) => (format!("fails: {e}"), true),
        Ended::Report(report) => (summary(report), report.incomplete()),
    };
    s.world
        .story
        .say(t, format!("inv {n} ({}) ends: {words}", plan.name));
    if retry && plan.attempt < 2 {
        let after = 60_000 * (Ms::from(plan.attempt) + 1);
        let again = Planned {
            attempt: plan.attempt + 1,
            ..plan
        };
        schedule.add(t + after, again);
    }
}

fn summary(report: &Report) -> String {
    let mut parts: Vec<String> = report
        .results
        .iter()
        .map(|r| {
            let who = r.node.as_deref().unwrap_or(&r.target);
            match &r.skip {
                Some(skip) => format!("{who} {} ({})", r.outcome.code(), skip.code()),
                None => format!("{who} {}", r.outcome.code()),
            }
        })
        .collect();
    parts.extend(
        report
            .recoveries
            .iter()
            .map(|r| format!("{} recovery {}", r.node, r.outcome.code())),
    );
    parts.extend(report.errors.iter().map(|e| format!("error: {e}")));
    if report.dry_run {
        parts.push("(a dry run)".into());
    }
    if parts.is_empty() {
        "nothing to do".into()
    } else {
        parts.join("; ")
    }
}
