//! The shells the real pipeline runs against: [`SimCloud`] answers as EC2
//! does and [`SimCluster`] as the apiserver does, both over one [`World`].
//! Every call is a step ([`call`]): it takes its time, the world is brought
//! up to now, the adversary has its turn, and then the answer is read from
//! the world (or the write applied to it, checked first against the truth
//! by [`crate::invariants`]). Each write is guarded as the Kubernetes shell
//! guards it (the resourceVersion read, the uid judged), so a writer in
//! between meets a conflict, as it would.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use node_fencer::core::model::facts::{
    AttachmentFacts, InstanceFacts, MachineIdentity, NodeFacts, PvFacts, SeenOff, StatusChecks,
    VolumeAttachmentState, VolumeFacts,
};
use node_fencer::core::model::instance::{
    AttachmentState, InstanceId, InstanceState, Provider, VolumeId, VolumeState,
};
use node_fencer::core::model::kube_read;
use node_fencer::core::model::system::System;
use node_fencer::core::outbound::events::NodeEvent;
use node_fencer::core::outbound::kube_patch::{
    self, ConfirmOutcome, ConfirmPatch, Ending, PowerStamp, Stamp, TaintOutcome, TaintPatch,
    UntaintOutcome, UntaintPatch,
};
use node_fencer::core::rules::control::{self, KillSwitch};
use node_fencer::core::rules::in_use::{self, ReleaseOutcome, ReleasePatch};
use node_fencer::core::rules::mode::ServerVersion;
use node_fencer::core::rules::silence::{self, KubeletLease, LeaseRead, MarkPatch};
use node_fencer::core::rules::view::Census;
use node_fencer::core::settings::policy::Policy;
use node_fencer::pipeline::ctx::Clock;
use node_fencer::shell::cloud::{Cloud, CloudCall, CloudError, Detach, PowerOff, PowerOffAnswer};
use node_fencer::shell::cluster::{
    ClusterError, ClusterReads, Coordination, FencingWrites, JudgedNode, LeaseTaken, MarkOutcome,
    PodRef,
};
use serde_json::Value;

use crate::adversary::{Adversary, Failure};
use crate::invariants::{self, Heard, Write};
use crate::world::{Attach, Machine, Ms, Power, Seen, World, merge, timestamp, unix_secs};

/// The world, the adversary and what each invocation has read, shared by
/// every shell of a run.
pub struct Shared {
    /// The world.
    pub world: World,
    /// The adversary.
    pub adversary: Adversary,
    /// The policy every invocation runs under.
    pub policy: Policy,
    /// What each invocation has read, by its number.
    pub heard: BTreeMap<usize, Heard>,
    /// Calls made so far.
    pub calls: u64,
    start: tokio::time::Instant,
}

impl Shared {
    /// A run's shared state, its clock starting now.
    pub fn new(world: World, adversary: Adversary, policy: Policy) -> Self {
        Self {
            world,
            adversary,
            policy,
            heard: BTreeMap::new(),
            calls: 0,
            start: tokio::time::Instant::now(),
        }
    }

    /// Now, in simulated milliseconds.
    pub fn now(&self) -> Ms {
        Ms::try_from(self.start.elapsed().as_millis()).unwrap_or(Ms::MAX)
    }

    /// The world brought up to now, then the adversary's turn.
    pub fn step(&mut self, tick: bool) {
        let now = self.now();
        self.world.advance_to(now);
        self.adversary.act(&mut self.world, tick);
    }

    /// Checks `write` by invocation `inv` against the truth, recording
    /// what it breaks.
    fn check(&mut self, inv: usize, write: &Write<'_>) {
        let heard = self.heard.get(&inv).cloned().unwrap_or_default();
        for broken in invariants::at_write(&self.world, &self.policy, &heard, write) {
            self.world.violate(broken);
        }
    }

    fn who(&self, inv: usize) -> String {
        self.heard
            .get(&inv)
            .map_or_else(|| format!("inv {inv}"), |h| h.name.clone())
    }
}

/// A run's shared state, behind one lock.
pub type Handle = Arc<Mutex<Shared>>;

/// Locks the shared state (a panic elsewhere does not poison a run's end).
pub fn lock(h: &Handle) -> MutexGuard<'_, Shared> {
    h.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The wall clock of a run, as node-fencer reads it: the true time.
pub struct SimClock {
    start: tokio::time::Instant,
}

impl SimClock {
    /// The clock of a run that starts now.
    pub fn new() -> Self {
        Self {
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for SimClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SimClock {
    fn now(&self) -> Timestamp {
        let ms = Ms::try_from(self.start.elapsed().as_millis()).unwrap_or(Ms::MAX);
        timestamp(ms)
    }
}

/// Which service a call goes to, and whether it writes.
#[derive(Clone, Copy)]
enum To {
    CloudRead,
    CloudWrite,
    ApiRead,
    ApiWrite,
}

/// One call of invocation `inv`: its latency, the world up to now, the
/// adversary's turn (and its fault), then `answer` on the world as it is,
/// which returns the value and a note for the story.
async fn call<T>(
    h: &Handle,
    inv: usize,
    what: String,
    to: To,
    answer: impl FnOnce(&mut Shared) -> (T, String),
) -> Result<T, &'static str> {
    let pause = lock(h).adversary.latency();
    tokio::time::sleep(pause).await;
    let mut s = lock(h);
    s.step(false);
    s.calls += 1;
    let (cloud, write) = match to {
        To::CloudRead => (true, false),
        To::CloudWrite => (true, true),
        To::ApiRead => (false, false),
        To::ApiWrite => (false, true),
    };
    let fault = s.adversary.fault(cloud, write);
    let (t, who) = (s.world.t, s.who(inv));
    if let Some(Failure::Before(e)) = fault {
        s.world.story.say(t, format!("{who}: {what} fails: {e}"));
        return Err(e);
    }
    let (value, note) = answer(&mut s);
    let t = s.world.t;
    let line = if note.is_empty() {
        format!("{who}: {what}")
    } else {
        format!("{who}: {what} -> {note}")
    };
    s.world.story.say(t, line);
    if let Some(Failure::Lost(e)) = fault {
        s.world
            .story
            .say(t, format!("{who}: the answer is lost: {e}"));
        return Err(e);
    }
    Ok(value)
}

fn api_error(e: &str) -> kube::Error {
    kube::Error::Service(e.to_owned().into())
}

fn cloud_error(call: CloudCall, code: &str) -> CloudError {
    CloudError::new(Provider::Aws, call, format!("{code} (simulated)")).with_code(Some(code))
}

/// A machine as DescribeInstances answers: what EC2 had recorded.
fn instance_facts(m: &Machine, seen: Seen) -> InstanceFacts {
    // Plain facts have no public constructor: the Redfish System reader,
    // given no document, makes one with nothing known.
    let mut facts = System::read(m.id.clone(), &Value::Null).facts;
    facts.identity = MachineIdentity::default();
    facts.state = seen.power.state();
    facts.private_dns_name = Some(m.host.clone());
    facts.private_ips = m.ip.parse().into_iter().collect();
    facts.vpc_id = Some("vpc-0sim".into());
    facts.root_device_name = Some("/dev/xvda".into());
    facts.stopped_at = seen.stop_asked_at.and_then(|at| {
        let when = timestamp(at).strftime("%Y-%m-%d %H:%M:%S");
        silence::ec2_stop_time(&format!("User initiated ({when} GMT)"))
    });
    facts.started_at = Some(unix_secs(seen.started_at));
    facts
}

/// The machines described, each with its state, for the story.
fn states(found: &[InstanceFacts]) -> String {
    found
        .iter()
        .map(|f| format!("{} {}", f.id, f.state.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// EC2, over the world.
pub struct SimCloud {
    h: Handle,
    inv: usize,
}

impl SimCloud {
    /// Invocation `inv`'s EC2.
    pub fn new(h: Handle, inv: usize) -> Self {
        Self { h, inv }
    }

    /// A `DescribeInstances` by filter, `what` in the story: the machines
    /// `selected` picks that may run, as the cloud describes them now. One
    /// VPC: every machine of the world is in it.
    async fn may_run_where(
        &self,
        what: String,
        selected: impl Fn(&Machine) -> bool + Send,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        call(&self.h, self.inv, what, To::CloudRead, |s| {
            let t = s.world.t;
            let found: Vec<InstanceFacts> = s
                .world
                .machines
                .values()
                .filter(|m| selected(m))
                .map(|m| instance_facts(m, m.seen_at(t)))
                .filter(|f| !matches!(f.state, InstanceState::Stopped | InstanceState::Terminated))
                .collect();
            let note = states(&found);
            (found, note)
        })
        .await
        .map_err(|e| cloud_error(CloudCall::DescribeMachines, e))
    }
}

#[async_trait]
impl Cloud for SimCloud {
    async fn describe_instances(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        let what = format!("DescribeInstances {}", names(ids));
        call(&self.h, self.inv, what, To::CloudRead, |s| {
            let t = s.world.t;
            let found: Vec<InstanceFacts> = ids
                .iter()
                .filter_map(|id| s.world.machine(id))
                .map(|m| instance_facts(m, m.seen_at(t)))
                .collect();
            let note = states(&found);
            (found, note)
        })
        .await
        .map_err(|e| cloud_error(CloudCall::DescribeMachines, e))
    }

    async fn machines_named(
        &self,
        name: &str,
        _vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        self.may_run_where(format!("DescribeInstances named {name}"), |m| {
            m.host == name
        })
        .await
    }

    async fn machines_holding(
        &self,
        addresses: &[IpAddr],
        _vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        let listed: Vec<String> = addresses.iter().map(ToString::to_string).collect();
        let what = format!("DescribeInstances holding {}", listed.join(","));
        self.may_run_where(what, |m| listed.contains(&m.ip)).await
    }

    async fn describe_volumes(&self, ids: &[VolumeId]) -> Result<Vec<VolumeFacts>, CloudError> {
        let what = format!("DescribeVolumes {}", names(ids));
        call(&self.h, self.inv, what, To::CloudRead, |s| {
            let found: Vec<VolumeFacts> = ids
                .iter()
                .filter_map(|id| s.world.disks.get(id))
                .map(|d| VolumeFacts {
                    id: d.id.clone(),
                    state: if d.attachment.is_some() {
                        VolumeState::InUse
                    } else {
                        VolumeState::Available
                    },
                    attachments: d
                        .attachment
                        .iter()
                        .map(|(m, phase)| VolumeAttachmentState {
                            instance: m.clone(),
                            device: Some("/dev/xvdba".into()),
                            state: match phase {
                                Attach::Attaching => AttachmentState::Attaching,
                                Attach::Attached => AttachmentState::Attached,
                                Attach::Detaching => AttachmentState::Detaching,
                            },
                        })
                        .collect(),
                })
                .collect();
            let note = found
                .iter()
                .map(|v| format!("{} {}", v.id, v.state.name()))
                .collect::<Vec<_>>()
                .join(", ");
            (found, note)
        })
        .await
        .map_err(|e| cloud_error(CloudCall::DescribeVolumes, e))
    }

    async fn detach_volume(&self, volume: &VolumeId, order: &Detach<'_>) -> Result<(), CloudError> {
        let machine = &order.machine.id;
        let what = format!("DetachVolume {volume} from {machine} (force)");
        let inv = self.inv;
        let answer = call(&self.h, inv, what, To::CloudWrite, |s| {
            let attached = s.world.disks.get(volume).map(|d| d.attachment.clone());
            match attached {
                None => (Err("InvalidVolume.NotFound"), "not found".into()),
                Some(Some((on, Attach::Attached | Attach::Attaching))) if &on == machine => {
                    s.check(inv, &Write::Detach { volume, machine });
                    s.world.start_detach(volume);
                    (Ok(()), "detaching".into())
                }
                Some(_) => (Err("IncorrectState"), "not attached there".into()),
            }
        })
        .await
        .map_err(|e| cloud_error(CloudCall::Detach(volume.to_string()), e))?;
        answer.map_err(|code| cloud_error(CloudCall::Detach(volume.to_string()), code))
    }

    async fn status_checks(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<(InstanceId, StatusChecks)>, CloudError> {
        let what = format!("DescribeInstanceStatus {}", names(ids));
        call(&self.h, self.inv, what, To::CloudRead, |s| {
            let found = ids
                .iter()
                .filter(|id| {
                    s.world
                        .machine(id)
                        .is_some_and(|m| m.power == Power::Running)
                })
                .map(|id| {
                    let checks = StatusChecks {
                        instance: "ok".into(),
                        system: "ok".into(),
                    };
                    (id.clone(), checks)
                })
                .collect();
            (found, String::new())
        })
        .await
        .map_err(|e| cloud_error(CloudCall::StatusChecks, e))
    }

    async fn power_off(&self, order: &PowerOff<'_>) -> Result<PowerOffAnswer, CloudError> {
        let machine = &order.machine.id;
        let what = format!("StopInstances {machine} (force)");
        let inv = self.inv;
        call(&self.h, inv, what, To::CloudWrite, |s| {
            let power = s.world.machine(machine).map(|m| m.power);
            match power {
                Some(Power::Stopped | Power::Terminated) | None => {
                    (PowerOffAnswer::FoundOff, "found off".into())
                }
                Some(_) => {
                    s.check(inv, &Write::PowerOff(machine));
                    s.world.stop(machine, 2_000, 0);
                    (PowerOffAnswer::Sent, "stopping".into())
                }
            }
        })
        .await
        .map_err(|e| cloud_error(CloudCall::PowerOff(machine.to_string()), e))
    }
}

fn names<T: std::fmt::Display>(ids: &[T]) -> String {
    ids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The apiserver, over the world.
pub struct SimCluster {
    h: Handle,
    inv: usize,
}

impl SimCluster {
    /// Invocation `inv`'s apiserver.
    pub fn new(h: Handle, inv: usize) -> Self {
        Self { h, inv }
    }

    async fn read<T>(
        &self,
        what: String,
        answer: impl FnOnce(&mut Shared) -> (T, String),
    ) -> Result<T, kube::Error> {
        call(&self.h, self.inv, what, To::ApiRead, answer)
            .await
            .map_err(api_error)
    }

    async fn write<T>(
        &self,
        what: String,
        answer: impl FnOnce(&mut Shared) -> (T, String),
    ) -> Result<T, kube::Error> {
        call(&self.h, self.inv, what, To::ApiWrite, answer)
            .await
            .map_err(api_error)
    }

    /// Reads the Node, lets `plan` decide, and sends the patch guarded by
    /// the resourceVersion read; on a conflict reads and decides again, as
    /// the Kubernetes shell does. `plan` also gets what the patch sent last
    /// would have answered.
    async fn guarded<T: Copy + Send>(
        &self,
        node: &str,
        gone: T,
        write: Write<'_>,
        plan: impl Fn(&Node, Option<T>, i64) -> Planned<T>,
    ) -> Result<T, ClusterError> {
        let inv = self.inv;
        let mut sent = None;
        for attempt in 0..node_fencer::shell::cluster::CONFLICT_RETRIES {
            let current = self
                .read(format!("GetNode {node}"), |s| {
                    let n = s.world.nodes.get(node).cloned();
                    let note = n.as_ref().map_or("gone".into(), describe_node);
                    (n, note)
                })
                .await
                .map_err(|source| ClusterError::GetNode {
                    node: node.into(),
                    source,
                })?;
            let Some(current) = current else {
                return Ok(gone);
            };
            let now = unix_secs(lock(&self.h).now());
            let (patch, done) = match plan(&current, sent, now) {
                Planned::Patch(patch, done) => (patch, done),
                Planned::Answer(answer) => return Ok(answer),
                Planned::Refuse => return Err(ClusterError::UnsafeWrite { node: node.into() }),
            };
            let applied = self
                .write(format!("PatchNode {node} ({})", write_name(&write)), |s| {
                    let applied = apply_patch(s, inv, node, &patch, &write);
                    let note = match applied {
                        Applied::Done => "patched",
                        Applied::Conflict => "409 conflict",
                        Applied::Gone => "404",
                    };
                    (applied, note.into())
                })
                .await
                .map_err(|source| ClusterError::PatchNode {
                    node: node.into(),
                    source,
                })?;
            match applied {
                Applied::Done => return Ok(done),
                Applied::Gone => return Ok(gone),
                Applied::Conflict => {
                    sent = Some(done);
                    tokio::time::sleep(Duration::from_millis(20 << attempt)).await;
                }
            }
        }
        Err(ClusterError::PatchConflict { node: node.into() })
    }
}

/// What a guarded write does with the Node as read.
enum Planned<T> {
    Patch(Value, T),
    Answer(T),
    Refuse,
}

#[derive(Clone, Copy)]
enum Applied {
    Done,
    Conflict,
    Gone,
}

fn write_name(write: &Write<'_>) -> &'static str {
    match write {
        Write::Taint(_) => "taint",
        Write::Mark(_) => "mark",
        Write::ReleaseInUse(_) => "release volumesInUse",
        Write::Other(what, _) => what,
        _ => "write",
    }
}

fn describe_node(n: &Node) -> String {
    let facts = kube_read::node_facts(n);
    let taints: Vec<String> = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .map(|t| t.key.rsplit('/').next().unwrap_or(&t.key).to_owned())
        .collect();
    format!(
        "Ready={} uid={} on {}{}",
        crate::world::ready_status(n).unwrap_or("?"),
        n.metadata.uid.as_deref().unwrap_or("?"),
        facts
            .and_then(|f| f.instance)
            .map_or("?".into(), |i| i.to_string()),
        if taints.is_empty() {
            String::new()
        } else {
            format!(" tainted {}", taints.join(","))
        }
    )
}

/// Applies a merge patch to the Node `name` as the apiserver does (its
/// resourceVersion and uid, when the patch carries them, must be the
/// Node's), checked first against the truth.
fn apply_patch(
    s: &mut Shared,
    inv: usize,
    name: &str,
    patch: &Value,
    write: &Write<'_>,
) -> Applied {
    let Some(node) = s.world.nodes.get(name).cloned() else {
        return Applied::Gone;
    };
    let field = |key: &str| {
        patch
            .pointer(&format!("/metadata/{key}"))
            .and_then(Value::as_str)
    };
    let rv_ok = field("resourceVersion")
        .is_none_or(|rv| node.metadata.resource_version.as_deref() == Some(rv));
    let uid_ok = field("uid").is_none_or(|uid| node.metadata.uid.as_deref() == Some(uid));
    if !rv_ok || !uid_ok {
        return Applied::Conflict;
    }
    s.check(inv, write);
    let Ok(mut value) = serde_json::to_value(&node) else {
        return Applied::Conflict;
    };
    merge(&mut value, patch);
    value["metadata"]["resourceVersion"] = Value::String(s.world.next_rv());
    let Ok(after) = serde_json::from_value::<Node>(value) else {
        return Applied::Conflict;
    };
    let who = s.who(inv);
    if let Some(broken) = invariants::taints_kept(&who, &node, &after) {
        s.world.violate(broken);
    }
    s.world.nodes.insert(name.to_owned(), after);
    if matches!(write, Write::Taint(_))
        && let Some(broken) = invariants::cap_kept(&s.world, &s.policy, &who)
    {
        s.world.violate(broken);
    }
    Applied::Done
}

/// Applies the `nodes/status` mark as the apiserver's strategic merge does:
/// the `Ready` condition's fields given replace its own.
fn apply_mark(s: &mut Shared, inv: usize, name: &str, patch: &Value) -> MarkOutcome {
    let Some(node) = s.world.nodes.get(name) else {
        return MarkOutcome::NodeGone;
    };
    let rv = patch
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    if rv.is_some_and(|rv| node.metadata.resource_version.as_deref() != Some(rv)) {
        return MarkOutcome::Conflict;
    }
    s.check(inv, &Write::Mark(name));
    let new_rv = s.world.next_rv();
    let given = &patch["status"]["conditions"][0];
    let text = |key: &str| given[key].as_str().map(str::to_owned);
    let Some(node) = s.world.nodes.get_mut(name) else {
        return MarkOutcome::NodeGone;
    };
    if let Some(c) = node
        .status
        .as_mut()
        .and_then(|st| st.conditions.as_mut())
        .and_then(|c| c.iter_mut().find(|c| c.type_ == "Ready"))
    {
        c.status = text("status").unwrap_or_default();
        c.reason = text("reason");
        c.message = text("message");
        c.last_transition_time = text("lastTransitionTime")
            .and_then(|t| t.parse().ok())
            .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time);
    }
    node.metadata.resource_version = Some(new_rv);
    MarkOutcome::Marked
}

fn node_facts(world: &World, name: &str) -> Option<NodeFacts> {
    world.nodes.get(name).and_then(kube_read::node_facts)
}

#[async_trait]
impl ClusterReads for SimCluster {
    async fn list_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError> {
        self.read("ListNodes".into(), |s| {
            let nodes: Vec<NodeFacts> = s
                .world
                .nodes
                .values()
                .filter_map(kube_read::node_facts)
                .collect();
            let note = s
                .world
                .nodes
                .iter()
                .map(|(name, n)| format!("{name} {}", crate::world::ready_status(n).unwrap_or("?")))
                .collect::<Vec<_>>()
                .join(", ");
            (nodes, note)
        })
        .await
        .map_err(ClusterError::ListNodes)
    }

    async fn get_node(&self, name: &str) -> Result<Option<NodeFacts>, ClusterError> {
        self.read(format!("GetNode {name}"), |s| {
            let note = s.world.nodes.get(name).map_or("gone".into(), describe_node);
            (node_facts(&s.world, name), note)
        })
        .await
        .map_err(|source| ClusterError::GetNode {
            node: name.into(),
            source,
        })
    }

    async fn list_fenced_nodes(&self) -> Result<Vec<NodeFacts>, ClusterError> {
        self.read("ListNodes (fenced)".into(), |s| {
            let nodes = s
                .world
                .nodes
                .values()
                .filter(|n| {
                    n.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(kube_read::LABEL_FENCED))
                        .is_some_and(|v| v == "true")
                })
                .filter_map(kube_read::node_facts)
                .collect();
            (nodes, String::new())
        })
        .await
        .map_err(ClusterError::ListNodes)
    }

    async fn count_nodes(&self) -> Result<usize, ClusterError> {
        self.read("CountNodes".into(), |s| {
            (s.world.nodes.len(), String::new())
        })
        .await
        .map_err(ClusterError::ListNodes)
    }

    async fn list_volume_attachments(&self) -> Result<Vec<AttachmentFacts>, ClusterError> {
        self.read("ListVolumeAttachments".into(), |s| {
            let vas = s
                .world
                .vas
                .values()
                .filter_map(kube_read::attachment_facts)
                .collect();
            (vas, String::new())
        })
        .await
        .map_err(ClusterError::ListVolumeAttachments)
    }

    async fn list_persistent_volumes(&self) -> Result<Vec<PvFacts>, ClusterError> {
        self.read("ListPersistentVolumes".into(), |s| {
            let pvs = s.world.pvs.iter().filter_map(kube_read::pv_facts).collect();
            (pvs, String::new())
        })
        .await
        .map_err(ClusterError::ListPersistentVolumes)
    }

    async fn get_volume_attachment(
        &self,
        name: &str,
    ) -> Result<Option<AttachmentFacts>, ClusterError> {
        self.read(format!("GetVolumeAttachment {name}"), |s| {
            let va = s.world.vas.get(name).and_then(kube_read::attachment_facts);
            let note = if va.is_some() { "found" } else { "none" };
            (va, note.into())
        })
        .await
        .map_err(|source| ClusterError::GetVolume {
            kind: "volumeattachment",
            name: name.into(),
            source,
        })
    }

    async fn get_persistent_volume(&self, name: &str) -> Result<Option<PvFacts>, ClusterError> {
        self.read(format!("GetPersistentVolume {name}"), |s| {
            let pv = s
                .world
                .pvs
                .iter()
                .find(|pv| pv.metadata.name.as_deref() == Some(name))
                .and_then(kube_read::pv_facts);
            (pv, String::new())
        })
        .await
        .map_err(|source| ClusterError::GetVolume {
            kind: "persistentvolume",
            name: name.into(),
            source,
        })
    }

    async fn server_version(&self) -> Result<ServerVersion, ClusterError> {
        ServerVersion::parse("1", "36").ok_or_else(|| ClusterError::Version("unreadable".into()))
    }

    async fn node_lease(&self, node: &str, uid: Option<&str>) -> Result<LeaseRead, ClusterError> {
        self.read(format!("GetNodeLease {node}"), |s| {
            let now = unix_secs(s.world.t);
            let read = silence::lease::read(s.world.leases.get(node), uid, Some(now));
            let at = |secs: i64| crate::world::secs((secs - unix_secs(0)) * 1000);
            let lease = match read.lease {
                KubeletLease::RenewedAt(r) => {
                    format!("renewed at {} by its kubelet's clock", at(r))
                }
                other => format!("{other:?}"),
            };
            let note = format!(
                "{lease}, written at {} by the apiserver's, version {}",
                read.written_at.map_or("?".into(), at),
                read.version.as_deref().unwrap_or("-")
            );
            (read, note)
        })
        .await
        .map_err(|source| ClusterError::GetNodeLease {
            node: node.into(),
            source,
        })
    }

    async fn pods_on_node(
        &self,
        node: &str,
        out_of_service: &[String],
    ) -> Result<Vec<PodRef>, ClusterError> {
        self.read(format!("ListPods on {node}"), |s| {
            let pods: Vec<PodRef> = s
                .world
                .pods
                .values()
                .filter(|p| p.spec.as_ref().and_then(|sp| sp.node_name.as_deref()) == Some(node))
                .filter_map(|p| kube_read::pod_ref(p, out_of_service))
                .collect();
            let note = pods
                .iter()
                .map(|p| p.name.clone())
                .collect::<Vec<_>>()
                .join(", ");
            (pods, note)
        })
        .await
        .map_err(|source| ClusterError::Pods {
            what: format!("listing the pods of node {node}"),
            source,
        })
    }
}

#[async_trait]
impl FencingWrites for SimCluster {
    async fn taint_node(&self, node: &str, stamp: &Stamp) -> Result<TaintOutcome, ClusterError> {
        let judged = JudgedNode {
            name: node,
            uid: stamp.node_uid.as_deref(),
            machine: &stamp.instance,
            version: None,
        };
        self.guarded(
            node,
            TaintOutcome::NodeGone,
            Write::Taint(node),
            |current, _, _| match kube_patch::taint_patch(current, stamp) {
                _ if !judged.is_same_object(kube_read::node_facts(current).as_ref()) => {
                    Planned::Answer(TaintOutcome::AnotherNode)
                }
                TaintPatch::AnotherNode => Planned::Answer(TaintOutcome::AnotherNode),
                TaintPatch::Apply(patch) => Planned::Patch(patch, TaintOutcome::Applied),
                TaintPatch::AlreadyPresent => Planned::Answer(TaintOutcome::AlreadyPresent),
                TaintPatch::AppliedByThisRun => Planned::Answer(TaintOutcome::Applied),
                TaintPatch::NodeReady => Planned::Answer(TaintOutcome::NodeReady),
                TaintPatch::NoResourceVersion | TaintPatch::Unrepresentable => Planned::Refuse,
            },
        )
        .await
    }

    async fn node_event(
        &self,
        node: &str,
        event: &NodeEvent,
        name: &str,
    ) -> Result<(), ClusterError> {
        let inv = self.inv;
        self.write(
            format!("CreateEvent {} on {node}", event.reason.as_str()),
            |s| {
                s.check(inv, &Write::Bookkeeping("an Event"));
                s.world.events.insert(name.to_owned());
                ((), String::new())
            },
        )
        .await
        .map_err(|source| ClusterError::CreateEvent {
            node: node.into(),
            source,
        })
    }

    async fn untaint_node(
        &self,
        node: &str,
        ending: &Ending<'_>,
    ) -> Result<UntaintOutcome, ClusterError> {
        let write = Write::Other("the end of a fencing", node);
        self.guarded(
            node,
            UntaintOutcome::NodeGone,
            write,
            |current, sent, now| match kube_patch::untaint_patch(current, ending, now) {
                UntaintPatch::Apply {
                    patch,
                    removes_taint,
                } => Planned::Patch(
                    patch,
                    UntaintOutcome::Ended {
                        taint_removed: removes_taint,
                    },
                ),
                UntaintPatch::NotOurs => Planned::Answer(sent.unwrap_or(UntaintOutcome::NotOurs)),
                UntaintPatch::NodeNotReady => Planned::Answer(UntaintOutcome::NodeNotReady),
                UntaintPatch::NotSettled { remaining_secs } => {
                    Planned::Answer(UntaintOutcome::NotSettled { remaining_secs })
                }
                UntaintPatch::NotConfirmed => Planned::Answer(UntaintOutcome::NotConfirmed),
                UntaintPatch::NoResourceVersion | UntaintPatch::Unrepresentable => Planned::Refuse,
            },
        )
        .await
    }

    async fn confirm_recovery(
        &self,
        node: &str,
        fenced_at: Option<&str>,
    ) -> Result<ConfirmOutcome, ClusterError> {
        let write = Write::Other("a recovery confirmed", node);
        self.guarded(node, ConfirmOutcome::NodeGone, write, |current, _, _| {
            match kube_patch::confirm_patch(current, fenced_at) {
                ConfirmPatch::Apply(patch) => Planned::Patch(patch, ConfirmOutcome::Confirmed),
                ConfirmPatch::Already => Planned::Answer(ConfirmOutcome::Confirmed),
                ConfirmPatch::NotFenced => Planned::Answer(ConfirmOutcome::NotFenced),
                ConfirmPatch::AnotherFencing => Planned::Answer(ConfirmOutcome::AnotherFencing),
                ConfirmPatch::NoResourceVersion => Planned::Refuse,
            }
        })
        .await
    }

    async fn mark_not_ready(
        &self,
        judged: &JudgedNode<'_>,
        message: &str,
    ) -> Result<MarkOutcome, ClusterError> {
        let node = judged.name;
        let inv = self.inv;
        let current = self
            .read(format!("GetNode {node}"), |s| {
                let n = s.world.nodes.get(node).cloned();
                let note = n.as_ref().map_or("gone".into(), describe_node);
                (n, note)
            })
            .await
            .map_err(|source| ClusterError::GetNode {
                node: node.into(),
                source,
            })?;
        let Some(current) = current else {
            return Ok(MarkOutcome::NodeGone);
        };
        let facts = kube_read::node_facts(&current);
        if !judged.is(facts.as_ref()) {
            return Ok(MarkOutcome::AnotherNode);
        }
        if !judged.unchanged(facts.as_ref()) {
            return Ok(MarkOutcome::Conflict);
        }
        let now = unix_secs(lock(&self.h).now());
        let patch = match silence::mark_patch(&current, message, now) {
            MarkPatch::Apply(patch) => patch,
            MarkPatch::NotReady => return Ok(MarkOutcome::AlreadyNotReady),
            MarkPatch::NoResourceVersion => {
                return Err(ClusterError::UnsafeWrite { node: node.into() });
            }
        };
        self.write(format!("PatchNodeStatus {node} Ready=Unknown"), |s| {
            let outcome = apply_mark(s, inv, node, &patch);
            (outcome, format!("{outcome:?}"))
        })
        .await
        .map_err(|source| ClusterError::PatchNodeStatus {
            node: node.into(),
            source,
        })
    }

    async fn note_machine_off(
        &self,
        judged: &JudgedNode<'_>,
        note: &SeenOff,
    ) -> Result<bool, ClusterError> {
        let (inv, node) = (self.inv, judged.name);
        let patch = kube_patch::seen_off_patch(judged.uid, note);
        let write = Write::Other("a note of the machine seen off", node);
        self.write(format!("PatchNode {node} (machine seen off)"), |s| {
            let applied = apply_patch(s, inv, node, &patch, &write);
            (matches!(applied, Applied::Done), String::new())
        })
        .await
        .map_err(|source| ClusterError::PatchNode {
            node: node.into(),
            source,
        })
    }

    async fn mark_powered_off(&self, node: &str, stamp: &PowerStamp) -> Result<bool, ClusterError> {
        let inv = self.inv;
        let patch = kube_patch::power_mark_patch(stamp);
        let write = Write::Other("a power-off mark", node);
        self.write(format!("PatchNode {node} (power-off mark)"), |s| {
            let applied = apply_patch(s, inv, node, &patch, &write);
            (!matches!(applied, Applied::Gone), String::new())
        })
        .await
        .map_err(|source| ClusterError::PatchNode {
            node: node.into(),
            source,
        })
    }

    async fn clear_power_mark(&self, node: &str) -> Result<(), ClusterError> {
        let write = Write::Other("a power-off mark taken back", node);
        self.guarded(node, (), write, |current, _, _| {
            Planned::Patch(kube_patch::power_unmark_patch(current), ())
        })
        .await
    }

    async fn force_delete_pod(&self, pod: &PodRef) -> Result<(), ClusterError> {
        let inv = self.inv;
        self.write(
            format!("DeletePod {} (grace 0, uid {})", pod.name, pod.uid),
            |s| {
                let found = s.world.pods.get(&pod.name).cloned();
                match found {
                    Some(p) if p.metadata.uid.as_deref() == Some(pod.uid.as_str()) => {
                        let node = p
                            .spec
                            .as_ref()
                            .and_then(|sp| sp.node_name.clone())
                            .unwrap_or_default();
                        s.check(
                            inv,
                            &Write::DeletePod {
                                node: &node,
                                pod: &pod.name,
                                uid: &pod.uid,
                            },
                        );
                        s.world.pods.remove(&pod.name);
                        ((), "deleted".into())
                    }
                    Some(_) => ((), "another pod of that name: 409, fine".into()),
                    None => ((), "gone".into()),
                }
            },
        )
        .await
        .map_err(|source| ClusterError::Pods {
            what: format!("force-deleting pod {}/{}", pod.namespace, pod.name),
            source,
        })
    }

    async fn delete_volume_attachment(&self, name: &str, uid: &str) -> Result<(), ClusterError> {
        let inv = self.inv;
        self.write(format!("DeleteVolumeAttachment {name}"), |s| {
            let found = s.world.vas.get(name).cloned();
            match found {
                Some(va) if va.metadata.uid.as_deref() == Some(uid) => {
                    let node = va.spec.node_name.clone();
                    s.check(inv, &Write::DeleteAttachment(&node));
                    s.world.remove_attachment(name);
                    ((), "deleted".into())
                }
                _ => ((), "gone or another".into()),
            }
        })
        .await
        .map_err(|source| ClusterError::DeleteVolumeAttachment {
            name: name.into(),
            source,
        })
    }

    async fn release_volumes_in_use(
        &self,
        node: &str,
        uid: Option<&str>,
        names: &[String],
    ) -> Result<ReleaseOutcome, ClusterError> {
        let write = Write::ReleaseInUse(node);
        self.guarded(node, ReleaseOutcome::NodeGone, write, |current, sent, _| {
            if uid.is_some_and(|uid| current.metadata.uid.as_deref() != Some(uid)) {
                return Planned::Answer(ReleaseOutcome::NodeGone);
            }
            match in_use::release_patch(current, names) {
                ReleasePatch::Apply(patch, n) => Planned::Patch(patch, ReleaseOutcome::Released(n)),
                ReleasePatch::NoneListed => {
                    Planned::Answer(sent.unwrap_or(ReleaseOutcome::NoneListed))
                }
                ReleasePatch::NoResourceVersion => Planned::Refuse,
            }
        })
        .await
    }
}

#[async_trait]
impl Coordination for SimCluster {
    async fn read_census(&self, namespace: &str) -> Result<Option<Census>, ClusterError> {
        self.read("GetLease node-fencer-census".into(), |s| {
            (s.world.census.clone(), String::new())
        })
        .await
        .map_err(|source| ClusterError::Lease {
            namespace: namespace.into(),
            source,
        })
    }

    async fn write_census(
        &self,
        namespace: &str,
        census: &Census,
        _holder: &str,
    ) -> Result<(), ClusterError> {
        let inv = self.inv;
        self.write("UpdateLease node-fencer-census".into(), |s| {
            s.check(inv, &Write::Bookkeeping("the census"));
            s.world.census = Some(census.clone());
            ((), format!("{} others out of service", census.others))
        })
        .await
        .map_err(|source| ClusterError::Lease {
            namespace: namespace.into(),
            source,
        })
    }

    async fn kill_switch(&self, namespace: &str) -> Result<KillSwitch, ClusterError> {
        let inv = self.inv;
        let read = self
            .read("GetConfigMap node-fencer (kill switch)".into(), |s| {
                let on = s.world.kill_switch;
                if on {
                    s.heard.entry(inv).or_default().switch_on = true;
                }
                let switch = if on { KillSwitch::On } else { KillSwitch::Off };
                (switch, if on { "on" } else { "off" }.into())
            })
            .await;
        if read.is_err() {
            // Unreadable counts as on: the pipeline must act so.
            lock(&self.h).heard.entry(inv).or_default().switch_on = true;
        }
        read.map_err(|source| ClusterError::KillSwitch {
            namespace: namespace.into(),
            source,
        })
    }

    async fn acquire_lease(
        &self,
        namespace: &str,
        holder: &str,
        until: Option<std::time::Instant>,
    ) -> Result<LeaseTaken, ClusterError> {
        // The caller's bound is on the std clock, the time left the same on
        // the simulated one: read before any wait.
        let left = until.map(|u| u.saturating_duration_since(std::time::Instant::now()));
        let own = tokio::time::Instant::now() + control::LEASE_WAIT;
        let deadline = left.map_or(own, |left| own.min(tokio::time::Instant::now() + left));
        let failed = |source| ClusterError::Lease {
            namespace: namespace.into(),
            source,
        };
        let inv = self.inv;
        let mut waited = false;
        loop {
            let (seen, pause) = self
                .read("GetLease node-fencer".into(), |s| {
                    let l = &s.world.fencing_lease;
                    let expired = s.world.t >= l.renewed + i64::from(control::LEASE_SECONDS) * 1000;
                    let free = l.holder.as_deref().is_none_or(|h| h == holder) || expired;
                    let note = format!("held by {}", l.holder.as_deref().unwrap_or("nobody"));
                    let left =
                        (l.renewed + i64::from(control::LEASE_SECONDS) * 1000 - s.world.t).max(1);
                    let pause = (!free).then(|| {
                        Duration::from_millis(u64::try_from(left.min(250)).unwrap_or(250))
                    });
                    (((l.version, l.holder.clone()), pause), note)
                })
                .await
                .map_err(failed)?;
            if let Some(pause) = pause {
                if tokio::time::Instant::now() + pause > deadline {
                    return Err(ClusterError::LeaseBusy {
                        holder: seen.1.unwrap_or_default(),
                    });
                }
                waited = true;
                tokio::time::sleep(pause).await;
                continue;
            }
            let taken = self
                .write(format!("UpdateLease node-fencer (holder {holder})"), |s| {
                    if s.world.fencing_lease.version != seen.0 {
                        return (false, "409 conflict".into());
                    }
                    s.check(inv, &Write::Bookkeeping("the fencing Lease"));
                    let t = s.world.t;
                    let l = &mut s.world.fencing_lease;
                    l.holder = Some(holder.to_owned());
                    l.renewed = t;
                    l.version += 1;
                    (true, "taken".into())
                })
                .await
                .map_err(failed)?;
            if taken {
                return Ok(LeaseTaken {
                    waited,
                    stamped: tokio::time::Instant::now().into_std(),
                });
            }
            waited = true;
        }
    }

    async fn release_lease(&self, namespace: &str, holder: &str) -> Result<(), ClusterError> {
        let inv = self.inv;
        self.write("UpdateLease node-fencer (release)".into(), |s| {
            let l = &mut s.world.fencing_lease;
            if l.holder.as_deref() != Some(holder) {
                return ((), "not ours".into());
            }
            l.holder = None;
            l.version += 1;
            s.check(inv, &Write::Bookkeeping("the fencing Lease"));
            ((), "released".into())
        })
        .await
        .map_err(|source| ClusterError::Lease {
            namespace: namespace.into(),
            source,
        })
    }

    async fn renew_lease(&self, namespace: &str, holder: &str) -> Result<bool, ClusterError> {
        let inv = self.inv;
        self.write("UpdateLease node-fencer (renew)".into(), |s| {
            let t = s.world.t;
            let l = &mut s.world.fencing_lease;
            if l.holder.as_deref() != Some(holder) {
                return (false, "taken over".into());
            }
            l.renewed = t;
            l.version += 1;
            s.check(inv, &Write::Bookkeeping("the fencing Lease"));
            (true, "renewed".into())
        })
        .await
        .map_err(|source| ClusterError::Lease {
            namespace: namespace.into(),
            source,
        })
    }
}
