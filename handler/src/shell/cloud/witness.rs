//! What a witness round sees of the clouds' machines: each described as a
//! fencing describes it, and the permissions a fencing needs probed once a
//! round, on one machine of each cloud (EC2's dry runs; Compute Engine's
//! `testIamPermissions` on a VM). A permission denied there fails every
//! machine of that cloud: the role that lost it would fail every fencing.
//! Nothing is changed: the describes are reads, the probes dry runs.

use std::collections::HashMap;

use tracing::warn;

use super::{Cloud, CloudCall, CloudError};
use crate::core::model::facts::InstanceFacts;
use crate::core::model::instance::{InstanceId, InstanceState, Provider};
use crate::core::rules::witness::Look;

/// How many machines one describe asks about. The round's describes go one
/// after the other, so that a large fleet is not asked about all at once
/// (Compute Engine answers one VM per call).
const ROUND_CHUNK: usize = 100;

/// What a round saw of one machine.
#[derive(Debug)]
pub enum CloudLook {
    /// Described; with active fencing, whether a forced power-off could be
    /// sent (`None`: not asked, or no machine to ask on).
    Answered(InstanceFacts, Option<Result<(), String>>),
    /// The cloud answered, and does not know the machine.
    Unknown,
    /// The look failed, or a permission a fencing needs is denied.
    Failed(CloudError),
}

impl CloudLook {
    /// The look, as the judgement reads it.
    pub fn as_look(&self) -> Look<'_> {
        match self {
            Self::Answered(facts, force_off) => Look::Answered {
                facts,
                force_off: force_off.clone(),
            },
            Self::Unknown => Look::Unknown,
            Self::Failed(e) => Look::Failed {
                code: e.code.as_deref(),
                message: &e.message,
            },
        }
    }
}

/// Each of `ids` described by `cloud`, in chunks of [`ROUND_CHUNK`].
pub async fn describe(cloud: &dyn Cloud, ids: &[InstanceId]) -> HashMap<InstanceId, CloudLook> {
    let mut looks = HashMap::with_capacity(ids.len());
    for chunk in ids.chunks(ROUND_CHUNK) {
        let described = cloud.describe_each(chunk).await;
        for (failed, e) in described.failed {
            for id in failed {
                looks.insert(id, CloudLook::Failed(e.clone()));
            }
        }
        for facts in described.found {
            looks.insert(facts.id.clone(), CloudLook::Answered(facts, None));
        }
        for id in chunk {
            looks.entry(id.clone()).or_insert(CloudLook::Unknown);
        }
    }
    looks
}

/// A permission the probe found denied: every described machine's look
/// fails with it (a machine whose look failed already keeps its failure).
fn deny_all(looks: &mut HashMap<InstanceId, CloudLook>, denied: &CloudError) {
    for look in looks.values_mut() {
        if matches!(look, CloudLook::Answered(..)) {
            *look = CloudLook::Failed(denied.clone());
        }
    }
}

/// Whether a forced power-off could be sent, for every described machine.
fn set_force_off(looks: &mut HashMap<InstanceId, CloudLook>, answer: &Result<(), String>) {
    for look in looks.values_mut() {
        if let CloudLook::Answered(_, force_off) = look {
            *force_off = Some(answer.clone());
        }
    }
}

/// The machine the round's probes are made on: the first running one by
/// id, so that successive rounds probe the same machine while it lives.
fn probe_target(looks: &HashMap<InstanceId, CloudLook>) -> Option<&InstanceFacts> {
    looks
        .values()
        .filter_map(|look| match look {
            CloudLook::Answered(facts, _) if facts.state == InstanceState::Running => Some(facts),
            _ => None,
        })
        .min_by(|a, b| a.id.cmp(&b.id))
}

/// The EC2 instances `ids`, described, with the calls a fencing makes
/// dry-run: `DescribeInstances`, `DescribeVolumes` and `DetachVolume`
/// always, `StopInstances` on one running instance when `power_off`
/// (active fencing; the grant is held to the cluster's tag, which every
/// instance of the cluster carries, so one answers for all).
pub async fn look_ec2(
    client: &aws_sdk_ec2::Client,
    ids: &[InstanceId],
    power_off: bool,
) -> HashMap<InstanceId, CloudLook> {
    let ec2 = super::aws::Ec2::new(client.clone());
    let mut looks = describe(&ec2, ids).await;
    for (action, answer) in super::aws::dry_run_probes(client).await {
        if let Some(denied) = ec2_denial(action, &answer, None) {
            deny_all(&mut looks, &denied);
        }
    }
    if power_off && let Some(target) = probe_target(&looks).map(|f| f.id.clone()) {
        let answer = super::aws::stop_probe(client, &target).await;
        match ec2_denial("StopInstances", &answer, Some(&target)) {
            Some(denied) => set_force_off(&mut looks, &Err(denied.message)),
            None if answer_allowed(&answer) => set_force_off(&mut looks, &Ok(())),
            None => {}
        }
    }
    looks
}

/// Whether a dry run's answer says the call is allowed.
fn answer_allowed(answer: &Result<(), String>) -> bool {
    match answer {
        Ok(()) => true,
        Err(code) => code == "DryRunOperation",
    }
}

/// A dry run's denial, as the error every machine's look fails with;
/// `None` when allowed, or when the probe itself failed (the describes
/// tell whether EC2 answers at all).
fn ec2_denial(
    action: &str,
    answer: &Result<(), String>,
    on: Option<&InstanceId>,
) -> Option<CloudError> {
    let code = answer.as_ref().err()?;
    if code != "UnauthorizedOperation" && code != "AccessDenied" {
        if code != "DryRunOperation" {
            warn!(action, answer = %code, "the witness's dry run could not tell");
        }
        return None;
    }
    let on = on.map(|id| format!(" on {id}")).unwrap_or_default();
    Some(
        CloudError::new(
            Provider::Aws,
            CloudCall::Permission(format!("ec2:{action}")),
            format!("ec2:{action} is denied{on} (dry run): a fencing would fail there"),
        )
        .with_code(Some(code)),
    )
}

/// The Compute Engine VMs `ids`, described, with the permissions a fencing
/// needs on a VM tested on one running VM (`testIamPermissions`): the stop
/// too when `power_off` (active fencing). The module's role is held to the
/// cluster's VM name prefix, which every VM of the cluster carries, so one
/// answers for all.
#[cfg(feature = "google-cloud")]
pub async fn look_gce(
    compute: &super::gce::Gce,
    ids: &[InstanceId],
    power_off: bool,
) -> HashMap<InstanceId, CloudLook> {
    use crate::core::settings::permissions::{
        GcpProbe, gcp_permissions_on, gcp_power_off_permissions,
    };
    let mut looks = describe(compute, ids).await;
    let Some((target, vm)) =
        probe_target(&looks).and_then(|f| Some((f.id.clone(), f.id.as_gce()?)))
    else {
        return looks;
    };
    let on_vm = gcp_permissions_on(GcpProbe::Instance);
    let stop = if power_off {
        gcp_power_off_permissions()
    } else {
        &[]
    };
    let wanted: Vec<&str> = on_vm.iter().chain(stop).copied().collect();
    let granted = match compute.granted_on_vm(&vm, &wanted).await {
        Ok(granted) => granted,
        Err(e) => {
            warn!(vm = %target, error = %e, "the witness could not test the permissions");
            return looks;
        }
    };
    let denied = |among: &[&str]| -> Vec<String> {
        among
            .iter()
            .filter(|p| !granted.iter().any(|g| g.as_str() == **p))
            .map(|p| (*p).to_owned())
            .collect()
    };
    let missing = denied(&on_vm[..]);
    if !missing.is_empty() {
        let error = CloudError::new(
            Provider::Gce,
            CloudCall::Permission(missing.join(", ")),
            format!(
                "{} denied on {target} (testIamPermissions): a fencing would fail there",
                missing.join(", ")
            ),
        )
        .with_code(Some("403"));
        deny_all(&mut looks, &error);
    }
    if power_off {
        let missing = denied(stop);
        let answer = if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} denied on {target} (testIamPermissions)",
                missing.join(", ")
            ))
        };
        set_force_off(&mut looks, &answer);
    }
    looks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> InstanceId {
        InstanceId::parse(&format!("i-{n:017x}")).expect("an instance id")
    }

    fn looks() -> HashMap<InstanceId, CloudLook> {
        let mut looks = HashMap::new();
        let running = InstanceFacts::bare(id(2), InstanceState::Running);
        let stopped = InstanceFacts::bare(id(1), InstanceState::Stopped);
        let later = InstanceFacts::bare(id(3), InstanceState::Running);
        looks.insert(id(1), CloudLook::Answered(stopped, None));
        looks.insert(id(2), CloudLook::Answered(running, None));
        looks.insert(id(3), CloudLook::Answered(later, None));
        looks.insert(id(4), CloudLook::Unknown);
        looks
    }

    #[test]
    fn the_probes_go_to_the_first_running_machine() {
        assert_eq!(probe_target(&looks()).map(|f| f.id.clone()), Some(id(2)));
        assert!(probe_target(&HashMap::new()).is_none());
    }

    #[test]
    fn a_denied_dry_run_fails_every_described_machine() {
        assert!(ec2_denial("DetachVolume", &Err("DryRunOperation".into()), None).is_none());
        assert!(ec2_denial("DetachVolume", &Err("RequestLimitExceeded".into()), None).is_none());
        assert!(ec2_denial("DetachVolume", &Ok(()), None).is_none());
        let denied =
            ec2_denial("DetachVolume", &Err("UnauthorizedOperation".into()), None).expect("denied");
        assert_eq!(denied.code.as_deref(), Some("UnauthorizedOperation"));
        assert!(denied.message.contains("ec2:DetachVolume"), "{denied}");
        let mut looks = looks();
        deny_all(&mut looks, &denied);
        for n in 1..=3 {
            assert!(matches!(looks[&id(n)], CloudLook::Failed(_)), "{n}");
        }
        assert!(
            matches!(looks[&id(4)], CloudLook::Unknown),
            "unknown stays unknown"
        );
    }

    #[test]
    fn the_stop_probe_answers_for_every_described_machine() {
        let mut looks = looks();
        set_force_off(&mut looks, &Err("denied".into()));
        for n in 1..=3 {
            let CloudLook::Answered(_, force_off) = &looks[&id(n)] else {
                panic!("{n} described");
            };
            assert_eq!(force_off, &Some(Err("denied".to_owned())));
        }
    }
}
