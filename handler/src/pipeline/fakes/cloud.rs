//! The fake cloud: EC2 instances and EBS volumes, in memory.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use crate::core::model::facts::{InstanceFacts, StatusChecks, VolumeAttachmentState, VolumeFacts};
use crate::core::model::instance::{
    AttachmentState, InstanceId, InstanceState, Provider, VolumeId, VolumeState,
};
use crate::shell::cloud::{Cloud, CloudCall, CloudError, Detach, PowerOff, PowerOffAnswer};

use super::Recorder;

/// An in-memory EC2: instances and EBS volumes.
pub struct FakeCloud {
    calls: Recorder,
    state: Mutex<CloudState>,
}

#[derive(Default)]
struct CloudState {
    instances: BTreeMap<InstanceId, InstanceFacts>,
    volumes: BTreeMap<VolumeId, VolumeFacts>,
    /// On the n-th DescribeInstances (1-based), an instance changes state first.
    changes: Vec<(usize, InstanceId, InstanceState)>,
    /// On the n-th DescribeInstances (1-based), another machine of the same
    /// name, with this numeric id, stands in for the instance.
    recreations: Vec<(usize, InstanceId, u64)>,
    describes: usize,
    /// Volumes whose detach is accepted but never completes.
    sticky: Vec<VolumeId>,
    /// Detaches carried out at once and answered this late (the answer
    /// held on its way back, as by a hung connection).
    held_answers: Option<Duration>,
    /// The n-th DescribeInstances (1-based) answers this late.
    slow: Option<(usize, Duration)>,
    /// What DescribeInstanceStatus reports.
    checks: BTreeMap<InstanceId, StatusChecks>,
    /// Instances a stop leaves `stopping` for good.
    stop_hangs: Vec<InstanceId>,
    /// Each power-off taken: the machine and the power-off it names.
    power_offs: Vec<(InstanceId, String)>,
    /// Instances that turn off on their own right before a power-off
    /// reaches them.
    off_before_stop: Vec<InstanceId>,
    /// Instances deleted right before a power-off reaches them.
    deleted_before_stop: Vec<InstanceId>,
}

impl FakeCloud {
    /// An empty cloud logging to `calls`.
    pub fn new(calls: Recorder) -> Self {
        Self {
            calls,
            state: Mutex::default(),
        }
    }

    /// EC2's answer to a `DescribeInstances` by filter, named `call` in
    /// the log: the machines `selected` picks that may run, in `vpc`.
    fn may_run_where(
        &self,
        call: String,
        vpc: Option<&str>,
        selected: impl Fn(&InstanceFacts) -> bool,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        if self.calls.call(call) {
            return Err(CloudError::new(
                Provider::Aws,
                CloudCall::DescribeMachines,
                "injected",
            ));
        }
        let state = self.lock();
        Ok(state
            .instances
            .values()
            .filter(|i| selected(i) && !i.state.is_off())
            .filter(|i| vpc.is_none_or(|v| i.vpc_id.as_deref() == Some(v)))
            .cloned()
            .collect())
    }

    fn lock(&self) -> MutexGuard<'_, CloudState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds an instance with its root volume name `/dev/xvda`.
    pub fn instance(&self, id: &InstanceId, state: InstanceState) {
        self.lock()
            .instances
            .insert(id.clone(), InstanceFacts::bare(id.clone(), state));
    }

    /// Adds a machine in `state` that carries `name` as its private DNS name
    /// (a Node's name, on EC2), in no VPC.
    pub fn namesake(&self, id: &InstanceId, name: &str, state: InstanceState) {
        let facts = InstanceFacts {
            private_dns_name: Some(name.to_owned()),
            ..InstanceFacts::bare(id.clone(), state)
        };
        self.lock().instances.insert(id.clone(), facts);
    }

    /// Adds a volume attached to `instance` at `device`.
    pub fn attached_volume(&self, id: &VolumeId, instance: &InstanceId, device: &str) {
        self.lock().volumes.insert(
            id.clone(),
            VolumeFacts {
                id: id.clone(),
                state: VolumeState::InUse,
                attachments: vec![VolumeAttachmentState {
                    instance: instance.clone(),
                    device: Some(device.into()),
                    state: AttachmentState::Attached,
                }],
            },
        );
    }

    /// Changes what EC2 describes of `id` (its tags, its VPC).
    pub fn describe_as(&self, id: &InstanceId, change: impl FnOnce(&mut InstanceFacts)) {
        if let Some(facts) = self.lock().instances.get_mut(id) {
            change(facts);
        }
    }

    /// Before the `nth` DescribeInstances (1-based), another machine of
    /// the same name, with numeric id `uid`, stands in for `id` (a managed
    /// instance group's recreation on Compute Engine).
    pub fn recreated_on_describe(&self, nth: usize, id: &InstanceId, uid: u64) {
        self.lock().recreations.push((nth, id.clone(), uid));
    }

    /// Before the `nth` DescribeInstances (1-based), `id` turns `state`.
    pub fn on_describe(&self, nth: usize, id: &InstanceId, state: InstanceState) {
        self.lock().changes.push((nth, id.clone(), state));
    }

    /// Every detach is carried out, and answered only after `pause`.
    pub fn detach_answers_held(&self, pause: Duration) {
        self.lock().held_answers = Some(pause);
    }

    /// The `nth` DescribeInstances (1-based) answers after `pause`, as EC2
    /// does under throttling.
    pub fn slow_describe(&self, nth: usize, pause: Duration) {
        self.lock().slow = Some((nth, pause));
    }

    /// The status checks EC2 reports for `id`.
    pub fn checks(&self, id: &InstanceId, instance: &str, system: &str) {
        self.lock().checks.insert(
            id.clone(),
            StatusChecks {
                instance: instance.into(),
                system: system.into(),
            },
        );
    }

    /// `id` turns off on its own right before a power-off reaches it.
    pub fn off_before_stop(&self, id: &InstanceId) {
        self.lock().off_before_stop.push(id.clone());
    }

    /// `id` is deleted right before a power-off reaches it (it reads
    /// terminated from then on, as a deleted machine confirms off).
    pub fn deleted_before_stop(&self, id: &InstanceId) {
        self.lock().deleted_before_stop.push(id.clone());
    }

    /// A stop of `id` is accepted and never completes.
    pub fn stop_hangs(&self, id: &InstanceId) {
        self.lock().stop_hangs.push(id.clone());
    }

    /// Each power-off taken, in order: the machine and the power-off it
    /// names (the time on the Node's mark).
    pub fn power_offs(&self) -> Vec<(InstanceId, String)> {
        self.lock().power_offs.clone()
    }

    /// The instance's state now.
    pub fn instance_state(&self, id: &InstanceId) -> Option<InstanceState> {
        self.lock().instances.get(id).map(|i| i.state.clone())
    }

    /// The volume's detach will be accepted and never complete.
    pub fn stick(&self, id: &VolumeId) {
        self.lock().sticky.push(id.clone());
    }

    /// The volume's state now.
    pub fn volume_state(&self, id: &VolumeId) -> Option<VolumeState> {
        self.lock().volumes.get(id).map(|v| v.state)
    }
}

#[async_trait]
impl Cloud for FakeCloud {
    async fn machines_named(
        &self,
        name: &str,
        vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        self.may_run_where(format!("DescribeInstances named {name}"), vpc, |i| {
            i.private_dns_name.as_deref() == Some(name)
        })
    }

    async fn machines_holding(
        &self,
        addresses: &[std::net::IpAddr],
        vpc: Option<&str>,
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        let listed: Vec<String> = addresses.iter().map(ToString::to_string).collect();
        let call = format!("DescribeInstances holding {}", listed.join(","));
        self.may_run_where(call, vpc, |i| {
            i.private_ips.iter().any(|ip| addresses.contains(ip))
        })
    }

    async fn describe_instances(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<InstanceFacts>, CloudError> {
        let fail = self.calls.call("DescribeInstances".into());
        let pause = {
            let mut state = self.lock();
            state.describes += 1;
            let n = state.describes;
            state.slow.filter(|(at, _)| *at == n).map(|(_, p)| p)
        };
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        let mut state = self.lock();
        let n = state.describes;
        let changes: Vec<_> = state
            .changes
            .iter()
            .filter(|(at, _, _)| *at == n)
            .map(|(_, id, s)| (id.clone(), s.clone()))
            .collect();
        for (id, s) in changes {
            if let Some(i) = state.instances.get_mut(&id) {
                i.state = s;
            }
        }
        let recreations: Vec<_> = state
            .recreations
            .iter()
            .filter(|(at, _, _)| *at == n)
            .map(|(_, id, uid)| (id.clone(), *uid))
            .collect();
        for (id, uid) in recreations {
            if let Some(i) = state.instances.get_mut(&id) {
                i.identity.uid = Some(uid);
            }
        }
        if fail {
            return Err(failed(CloudCall::DescribeMachines, "RequestLimitExceeded"));
        }
        Ok(ids
            .iter()
            .filter_map(|id| state.instances.get(id).cloned())
            .collect())
    }

    async fn describe_volumes(&self, ids: &[VolumeId]) -> Result<Vec<VolumeFacts>, CloudError> {
        if self.calls.call("DescribeVolumes".into()) {
            return Err(failed(CloudCall::DescribeVolumes, "InternalError"));
        }
        let state = self.lock();
        Ok(ids
            .iter()
            .filter_map(|id| state.volumes.get(id).cloned())
            .collect())
    }

    async fn detach_volume(&self, volume: &VolumeId, order: &Detach<'_>) -> Result<(), CloudError> {
        let instance = &order.machine.id;
        let error =
            |code: &str| failed(CloudCall::Detach(volume.to_string()), code).with_code(Some(code));
        if self.calls.call(format!("DetachVolume {volume}")) {
            return Err(error("InternalError"));
        }
        let (answer, held) = {
            let mut state = self.lock();
            let held = state.held_answers;
            let answer = if state.sticky.contains(volume) {
                Ok(())
            } else if let Some(v) = state.volumes.get_mut(volume) {
                let before = v.attachments.len();
                v.attachments.retain(|a| &a.instance != instance);
                if v.attachments.len() == before {
                    Err(error("IncorrectState"))
                } else {
                    if v.attachments.is_empty() {
                        v.state = VolumeState::Available;
                    }
                    Ok(())
                }
            } else {
                Err(error("InvalidVolume.NotFound"))
            };
            (answer, held)
        };
        if let Some(pause) = held {
            tokio::time::sleep(pause).await;
        }
        answer
    }

    async fn status_checks(
        &self,
        ids: &[InstanceId],
    ) -> Result<Vec<(InstanceId, StatusChecks)>, CloudError> {
        if self.calls.call("DescribeInstanceStatus".into()) {
            return Err(failed(CloudCall::StatusChecks, "InternalError"));
        }
        let state = self.lock();
        Ok(ids
            .iter()
            .filter_map(|id| Some((id.clone(), state.checks.get(id)?.clone())))
            .collect())
    }

    async fn power_off(&self, order: &PowerOff<'_>) -> Result<PowerOffAnswer, CloudError> {
        let instance = &order.machine.id;
        let fail = self.calls.call(format!("StopInstances {instance}"));
        if fail {
            return Err(failed(
                CloudCall::PowerOff(instance.to_string()),
                "InternalError",
            ));
        }
        let mut state = self.lock();
        let hangs = state.stop_hangs.contains(instance);
        let turns_off = state.off_before_stop.contains(instance);
        let deleted = state.deleted_before_stop.contains(instance);
        let Some(facts) = state.instances.get_mut(instance) else {
            return Err(failed(
                CloudCall::PowerOff(instance.to_string()),
                "InvalidInstanceID.NotFound",
            ));
        };
        // As the shells do: only the machine judged, by its identity (a
        // machine recreated under the name is another one).
        if !order.machine.identity.may_be_same_as(&facts.identity) {
            return Err(failed(
                CloudCall::PowerOff(instance.to_string()),
                "MachineNotRunning",
            ));
        }
        if deleted {
            facts.state = InstanceState::Terminated;
            return Ok(PowerOffAnswer::Deleted);
        }
        if turns_off {
            facts.state = InstanceState::Stopped;
        }
        if facts.state == InstanceState::Stopped {
            return Ok(PowerOffAnswer::FoundOff);
        }
        facts.state = if hangs {
            InstanceState::Stopping
        } else {
            InstanceState::Stopped
        };
        state
            .power_offs
            .push((instance.clone(), order.fencing.to_owned()));
        Ok(PowerOffAnswer::Sent)
    }
}

/// A failure of the fake, as EC2's would be.
fn failed(call: CloudCall, message: &str) -> CloudError {
    CloudError::new(Provider::Aws, call, message)
}
