//! The adversary: from a seed, what goes wrong. Between any two calls the
//! pipeline makes (each call is a step, [`Adversary::act`]) and on the
//! clock while none is made, it may change the world with one [`Move`];
//! it also decides each call's latency and faults ([`Adversary::fault`]),
//! when EventBridge delivers each event and how often, which invocation
//! dies before its end, and the operators' requests. Each run enables only
//! a subset of the moves and faults ("swarm testing": a run with every
//! fault on explores little of each), drawn from the seed with everything
//! else, so a seed replays exactly.
//!
//! Each move drawn is numbered, in the order of drawing; a run may carry
//! out only some of them ([`Moves`]), which is how a failing seed is shrunk
//! ([`crate::shrink`]). A move left out still draws what it would have
//! drawn, so that the moves after it draw the same.
//!
//! A new move: a variant of [`Move`] (and of [`MOVES`]), its arm in
//! [`Adversary::apply`] choosing what it acts on, and the method of
//! [`World`] that changes the truth and tells it (called only when the
//! move is carried out).

use std::collections::BTreeSet;
use std::time::Duration;

use fastrand::Rng;
use node_fencer::core::model::facts::{OUT_OF_SERVICE_EFFECT, OUT_OF_SERVICE_KEY};
use node_fencer::core::model::instance::InstanceId;

use crate::world::{Ms, Power, Process, Replacement, World};

/// What the adversary may change in the world.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    /// A running machine stopped (a graceful shutdown of some seconds).
    Stop,
    /// A machine loses power at once.
    Crash,
    /// A running machine terminated.
    Terminate,
    /// A stopped machine started again.
    Start,
    /// A Node's machine replaced: another machine's kubelet serves the
    /// same Node name, its Node registered again or the old one adopted.
    Replace,
    /// A Node object deleted; its kubelet registers it again (a new uid).
    ReRegister,
    /// A kubelet hangs.
    Hang,
    /// A kubelet's process dies (its machine runs on).
    Die,
    /// A hung or dead kubelet comes back.
    Revive,
    /// A kubelet's clock drifts.
    Skew,
    /// EC2's answers about a machine lag.
    Lag,
    /// The kill switch flips.
    KillSwitch,
    /// An operator taints a Node (another writer's taint, to be kept).
    OperatorTaint,
}

/// Every move, in the order the swarm draws them.
pub const MOVES: [Move; 13] = [
    Move::Stop,
    Move::Crash,
    Move::Terminate,
    Move::Start,
    Move::Replace,
    Move::ReRegister,
    Move::Hang,
    Move::Die,
    Move::Revive,
    Move::Skew,
    Move::Lag,
    Move::KillSwitch,
    Move::OperatorTaint,
];

/// What may go wrong with the calls and the invocations themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// EC2 throttles, fails or answers 5xx.
    CloudErrors,
    /// The apiserver fails calls.
    ApiErrors,
    /// A write lands, and its answer is lost.
    LostAnswers,
    /// Calls now and then take seconds.
    Slow,
    /// EventBridge delivers late.
    LateEvents,
    /// EventBridge delivers twice.
    TwiceEvents,
    /// An invocation dies before its end (a timeout, an OOM kill).
    Killed,
    /// Operators ask to fence Nodes, dead or not.
    DirectFence,
    /// Sweeps at odd times, beside the schedule.
    ExtraSweep,
}

/// Every fault, in the order the swarm draws them.
pub const FAULTS: [Fault; 9] = [
    Fault::CloudErrors,
    Fault::ApiErrors,
    Fault::LostAnswers,
    Fault::Slow,
    Fault::LateEvents,
    Fault::TwiceEvents,
    Fault::Killed,
    Fault::DirectFence,
    Fault::ExtraSweep,
];

/// An invocation the adversary asks for.
#[derive(Clone, Debug)]
pub enum Asked {
    /// An operator's `fence` of a Node by name.
    Fence(String),
    /// A sweep.
    Sweep,
}

/// How a call fails.
#[derive(Clone, Debug)]
pub enum Failure {
    /// Before anything is done.
    Before(&'static str),
    /// Done, and the answer lost.
    Lost(&'static str),
}

/// Which of the moves drawn a run carries out, by their numbers in the
/// order of drawing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Moves {
    /// Every move drawn: a seed's own run.
    #[default]
    All,
    /// Only these (a shrunk run); any other move drawn is left out.
    Only(BTreeSet<usize>),
}

impl Moves {
    /// Whether move `n` is carried out.
    pub fn keeps(&self, n: usize) -> bool {
        match self {
            Self::All => true,
            Self::Only(kept) => kept.contains(&n),
        }
    }

    /// The flag that replays a run with these moves (empty for all).
    pub fn flag(&self) -> String {
        match self {
            Self::All => String::new(),
            Self::Only(kept) => {
                let list: Vec<String> = kept.iter().map(usize::to_string).collect();
                format!(
                    " --moves {}",
                    if list.is_empty() {
                        "none".into()
                    } else {
                        list.join(",")
                    }
                )
            }
        }
    }

    /// Reads the flag's value: numbers separated by commas, or `none`.
    pub fn parse(value: &str) -> Result<Self, String> {
        if value == "none" {
            return Ok(Self::Only(BTreeSet::new()));
        }
        value
            .split(',')
            .map(|n| {
                n.trim().parse::<usize>().map_err(|_| {
                    format!("{n:?} is not a move's number (a list such as 0,4,9, or none)")
                })
            })
            .collect::<Result<BTreeSet<_>, _>>()
            .map(Self::Only)
    }
}

/// The adversary of one run.
pub struct Adversary {
    rng: Rng,
    /// Replacements that leave a stale Node (a kubelet on another machine
    /// adopting a Node object that names the old one) are drawn too.
    stale_nodes: bool,
    moves: Vec<Move>,
    faults: Vec<Fault>,
    /// The chance of a move at each call.
    rate: f64,
    /// Still at work; once healed, it changes nothing more.
    pub active: bool,
    /// The invocations it asked for, for the runner to start.
    pub asked: Vec<Asked>,
    /// The moves it carries out.
    kept: Moves,
    /// The moves drawn so far.
    pub drawn: usize,
}

impl Adversary {
    /// The adversary of `seed`: its swarm of moves and faults, its rate;
    /// `stale_nodes`: replacements may leave a stale Node object; `kept`:
    /// the moves it carries out.
    pub fn new(seed: u64, stale_nodes: bool, kept: Moves) -> Self {
        let mut rng = Rng::with_seed(seed);
        let mut moves: Vec<Move> = MOVES.iter().copied().filter(|_| rng.bool()).collect();
        if moves.is_empty() {
            moves.push(MOVES[rng.usize(..MOVES.len())]);
        }
        let faults = FAULTS
            .iter()
            .copied()
            .filter(|_| rng.u8(..10) < 4)
            .collect();
        let rate = 0.005 + rng.f64() * 0.06;
        Self {
            rng,
            stale_nodes,
            moves,
            faults,
            rate,
            active: true,
            asked: Vec::new(),
            kept,
            drawn: 0,
        }
    }

    /// Numbers the move being drawn, and says whether it is carried out.
    fn carry_out(&mut self) -> bool {
        let n = self.drawn;
        self.drawn += 1;
        self.kept.keeps(n)
    }

    /// The swarm, for the story.
    pub fn describe(&self) -> String {
        format!(
            "moves {:?}; faults {:?}; a move at {:.1}% of the calls",
            self.moves,
            self.faults,
            self.rate * 100.0
        )
    }

    fn has(&self, fault: Fault) -> bool {
        self.active && self.faults.contains(&fault)
    }

    /// The adversary's turn at a call (`tick`: on the clock, no call made,
    /// four times a second, at a quarter of the rate).
    pub fn act(&mut self, world: &mut World, tick: bool) {
        if !self.active {
            return;
        }
        let rate = if tick { self.rate / 4.0 } else { self.rate };
        if self.rng.f64() >= rate {
            return;
        }
        if self.has(Fault::DirectFence) && self.rng.u8(..8) == 0 {
            let node = pick(&mut self.rng, world.nodes.keys().cloned().collect());
            if let Some(node) = node.filter(|_| self.carry_out()) {
                world.story.say(
                    world.t,
                    format!("adversary: an operator asks to fence {node}"),
                );
                self.asked.push(Asked::Fence(node));
            }
            return;
        }
        if self.has(Fault::ExtraSweep) && self.rng.u8(..8) == 0 {
            if !self.carry_out() {
                return;
            }
            world
                .story
                .say(world.t, "adversary: a sweep out of schedule");
            self.asked.push(Asked::Sweep);
            return;
        }
        let choice = self.moves[self.rng.usize(..self.moves.len())];
        self.apply(world, choice);
    }

    /// The opening move, so that most runs have a machine to fence: one
    /// Node's machine goes down (stopped, lost, terminated or replaced).
    pub fn open(&mut self, world: &mut World) {
        let first = [Move::Stop, Move::Crash, Move::Terminate, Move::Replace];
        let choice = first[self.rng.usize(..first.len())];
        self.apply(world, choice);
    }

    /// Carries out `choice` on something in the world it fits, if any; a
    /// move left out draws the same, and changes nothing.
    fn apply(&mut self, world: &mut World, choice: Move) {
        let live = self.carry_out();
        let rng = &mut self.rng;
        match choice {
            Move::Stop | Move::Terminate => {
                if let Some(id) = pick(rng, machines(world, |p| p == Power::Running)) {
                    let shutdown = rng.i64(1_000..30_000);
                    let kubelet_after = rng.i64(0..=shutdown);
                    match (live, choice) {
                        (false, _) => {}
                        (true, Move::Stop) => world.stop(&id, shutdown, kubelet_after),
                        (true, _) => world.terminate(&id, shutdown, kubelet_after),
                    }
                }
            }
            Move::Crash => {
                if let Some(id) = pick(rng, machines(world, Power::is_on)).filter(|_| live) {
                    world.crash(&id);
                }
            }
            Move::Start => {
                if let Some(id) = pick(rng, machines(world, |p| p == Power::Stopped)) {
                    let boot = rng.i64(10_000..40_000);
                    if live {
                        world.start(&id, boot);
                    }
                }
            }
            Move::Replace => {
                if let Some(node) = pick(rng, world.nodes.keys().cloned().collect()) {
                    let how = if self.stale_nodes {
                        [
                            Replacement::Registered,
                            Replacement::Adopted,
                            Replacement::OldRuns,
                        ][rng.usize(..3)]
                    } else {
                        Replacement::Registered
                    };
                    if live {
                        world.replace(&node, how);
                    }
                }
            }
            Move::ReRegister => {
                let alive = kubelets(world, |w, k| {
                    k.process == Process::Alive
                        && w.machine(&k.machine)
                            .is_some_and(|m| m.power == Power::Running)
                        && w.nodes.contains_key(&k.node)
                });
                if let Some(k) = pick(rng, alive).filter(|_| live) {
                    let node = world.kubelets[k].node.clone();
                    world.delete_node(&node);
                }
            }
            Move::Hang | Move::Die => {
                if let Some(k) = pick(rng, kubelets(world, |_, k| k.process == Process::Alive)) {
                    let to = if choice == Move::Hang {
                        Process::Hung
                    } else {
                        Process::Dead
                    };
                    if live {
                        world.set_process(k, to);
                    }
                }
            }
            Move::Revive => {
                let down = kubelets(world, |w, k| {
                    k.process != Process::Alive
                        && !k.retired
                        && w.machine(&k.machine)
                            .is_some_and(|m| m.power == Power::Running)
                });
                if let Some(k) = pick(rng, down).filter(|_| live) {
                    world.set_process(k, Process::Alive);
                }
            }
            Move::Skew => {
                if let Some(k) = pick(rng, (0..world.kubelets.len()).collect()) {
                    let skew = rng.i64(-90_000..=90_000);
                    if live {
                        world.set_skew(k, skew);
                    }
                }
            }
            Move::Lag => {
                if let Some(id) = pick(rng, world.machines.keys().cloned().collect()) {
                    let lag = rng.i64(0..=20_000);
                    if live {
                        world.set_lag(&id, lag);
                    }
                }
            }
            Move::KillSwitch => {
                let on = !world.kill_switch;
                if live {
                    world.set_kill_switch(on);
                }
            }
            Move::OperatorTaint => {
                if let Some(node) = pick(rng, world.nodes.keys().cloned().collect()) {
                    let off = world
                        .named_machine(&node)
                        .and_then(|id| world.machine(&id).map(|m| !m.power.is_on()))
                        .unwrap_or(false);
                    // The out-of-service taint only on a Node that is dead:
                    // on a live one it would be the operator's own split
                    // brain.
                    let by_hand = off && world.live_machines_of(&node).is_empty() && rng.bool();
                    match (live, by_hand) {
                        (false, _) => {}
                        (true, true) => world.operator_taint(
                            &node,
                            OUT_OF_SERVICE_KEY,
                            Some("by-hand"),
                            OUT_OF_SERVICE_EFFECT,
                        ),
                        (true, false) => world.operator_taint(
                            &node,
                            "example.com/maintenance",
                            None,
                            "NoSchedule",
                        ),
                    }
                }
            }
        }
    }

    /// How long a call takes.
    pub fn latency(&mut self) -> Duration {
        let ms = if self.has(Fault::Slow) && self.rng.u8(..10) == 0 {
            self.rng.u64(500..3_000)
        } else {
            self.rng.u64(1..25)
        };
        Duration::from_millis(ms)
    }

    /// Whether a call fails, and how: a cloud call (`cloud`) or the
    /// apiserver's, a write (`write`, whose answer may be lost) or a read.
    pub fn fault(&mut self, cloud: bool, write: bool) -> Option<Failure> {
        let errors = if cloud {
            Fault::CloudErrors
        } else {
            Fault::ApiErrors
        };
        // What the pipeline sees once the clients' own retries gave up:
        // rarer than one request failing.
        let percent = if cloud { 4 } else { 2 };
        if self.has(errors) && self.rng.u8(..100) < percent {
            let code = if cloud {
                ["RequestLimitExceeded", "InternalError", "Unavailable"][self.rng.usize(..3)]
            } else {
                [
                    "the server is currently unable to handle the request",
                    "etcdserver: request timed out",
                ][self.rng.usize(..2)]
            };
            return Some(Failure::Before(code));
        }
        if write && self.has(Fault::LostAnswers) && self.rng.u8(..100) < 10 {
            return Some(Failure::Lost("the connection was reset before the answer"));
        }
        None
    }

    /// After how long, from the change, EventBridge delivers one event,
    /// once or more.
    pub fn deliveries(&mut self) -> Vec<Ms> {
        let late = self.has(Fault::LateEvents) && self.rng.bool();
        let first = if late {
            self.rng.i64(20_000..120_000)
        } else {
            self.rng.i64(300..3_000)
        };
        let mut out = vec![first];
        if self.has(Fault::TwiceEvents) && self.rng.bool() {
            out.push(first + self.rng.i64(0..60_000));
        }
        out
    }

    /// When an invocation starting now dies, if it does.
    pub fn kills_after(&mut self) -> Option<Ms> {
        (self.has(Fault::Killed) && self.rng.u8(..10) < 3).then(|| self.rng.i64(0..30_000))
    }

    /// The adversary stops: the kill switch off, EC2 answering on time,
    /// no more faults or moves. What it broke stays broken.
    pub fn heal(&mut self, world: &mut World) {
        self.active = false;
        world.set_kill_switch(false);
        let ids: Vec<InstanceId> = world
            .machines
            .iter()
            .filter(|(_, m)| m.lag > 0)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            world.set_lag(&id, 0);
        }
        world
            .story
            .say(world.t, "the adversary stops; the world runs on");
    }
}

fn pick<T>(rng: &mut Rng, mut from: Vec<T>) -> Option<T> {
    if from.is_empty() {
        return None;
    }
    let i = rng.usize(..from.len());
    Some(from.swap_remove(i))
}

fn machines(world: &World, power: impl Fn(Power) -> bool) -> Vec<InstanceId> {
    world
        .machines
        .iter()
        .filter(|(_, m)| power(m.power))
        .map(|(id, _)| id.clone())
        .collect()
}

fn kubelets(world: &World, fits: impl Fn(&World, &crate::world::Kubelet) -> bool) -> Vec<usize> {
    (0..world.kubelets.len())
        .filter(|k| fits(world, &world.kubelets[*k]))
        .collect()
}
