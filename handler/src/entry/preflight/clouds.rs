//! The cloud half of preflight: which clouds the cluster's nodes run on,
//! and whether this deployment's identity may make each call there (EC2
//! dry runs; Compute Engine's `testIamPermissions` on a node's VM and its
//! boot disk).

use super::{Check, Status, failed, row};
use crate::core::model::facts::{NodeFacts, Readiness};
use crate::core::model::gce::GceInstance;
use crate::core::model::instance::{InstanceId, Provider};
use crate::core::settings::access::ClusterAccess;
use crate::core::settings::config::Config;
use crate::shell::cloud::aws;
use crate::shell::connect::Clients;

/// Which clouds to check, from the nodes' provider ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Clouds {
    /// Probe EC2.
    pub ec2: bool,
    /// Check Compute Engine, on this node's VM when one is known.
    pub gce: Option<Option<GceInstance>>,
}

/// The clouds the nodes name. Without a node to go by (the API server did
/// not answer, or the cluster is empty), the access tells: a GKE cluster
/// is on Compute Engine, any other on EC2.
pub(super) fn clouds(access: &ClusterAccess, nodes: Option<&[NodeFacts]>) -> Clouds {
    let gke = matches!(access, ClusterAccess::Gke { .. });
    let providers: Vec<Provider> = nodes
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.instance.as_ref().map(|i| i.provider()))
        .collect();
    if providers.is_empty() {
        return Clouds {
            ec2: !gke,
            gce: gke.then_some(None),
        };
    }
    // A Ready node's VM surely exists; a dead node's may be deleted.
    let vm_of = |n: &NodeFacts| n.instance.as_ref().and_then(InstanceId::as_gce);
    let nodes = nodes.unwrap_or_default();
    let first_vm = nodes
        .iter()
        .filter(|n| n.readiness == Readiness::Ready)
        .find_map(vm_of)
        .or_else(|| nodes.iter().find_map(vm_of));
    Clouds {
        ec2: providers.contains(&Provider::Aws),
        gce: (gke || first_vm.is_some()).then_some(first_vm),
    }
}

/// The checks of every cloud the nodes run on.
pub(super) async fn check(
    clients: &Clients,
    config: &Config,
    nodes: Option<&[NodeFacts]>,
    checks: &mut Vec<Check>,
) {
    let clouds = clouds(&config.cluster, nodes);
    if clouds.ec2 {
        ec2(&clients.ec2, config, checks).await;
    } else {
        checks.push(row("ec2", Status::Info, "not probed: no node runs on EC2"));
    }
    if let Some(vm) = clouds.gce {
        let power_off = config.policy.active_fencing.is_some();
        gce(clients, vm.as_ref(), power_off, checks).await;
    }
}

/// What an EC2 dry run said.
pub(super) fn dry_run_check<E>(action: &str, result: Result<E, String>) -> Check {
    let check = format!("ec2:{action}");
    match result {
        // Only the reads are sent without DryRun support somewhere (some
        // EC2 stand-ins ignore it): a read that answered is allowed.
        Ok(_) => row(check, Status::Pass, "allowed"),
        Err(code) if code == "DryRunOperation" => row(check, Status::Pass, "allowed (dry run)"),
        Err(code) if code == "UnauthorizedOperation" || code == "AccessDenied" => failed(
            check,
            "denied",
            format!("grant ec2:{action} to the function's role (infra/modules/node-fencer)"),
        ),
        Err(other) => failed(
            check,
            format!("could not check: {other}"),
            "check the region, the endpoint and the credentials",
        ),
    }
}

async fn ec2(ec2: &aws_sdk_ec2::Client, config: &Config, checks: &mut Vec<Check>) {
    for (action, answer) in aws::dry_run_probes(ec2).await {
        checks.push(dry_run_check(action, answer));
    }
    if config.policy.active_fencing.is_some() {
        let (action, answer) = aws::status_probe(ec2).await;
        checks.push(dry_run_check(action, answer));
        // A dry run of a stop needs a real instance carrying the tag the
        // grant is limited to: there is none to name here.
        checks.push(row(
            "ec2:StopInstances",
            Status::Info,
            "not probed: granted only on the cluster's tagged instances (infra/docs/aws-active-fencing.md)",
        ));
    }
}

/// Compute Engine's checks, in the build that has its client.
#[cfg(feature = "google-cloud")]
mod compute {
    use super::{Check, Clients, GceInstance, Status, failed, row};
    use crate::core::settings::permissions::{
        GcpProbe, gcp_permissions_on, gcp_power_off_permissions,
    };

    /// Where a denied Google Cloud permission is granted: the writes by a
    /// role of its own, held to the cluster's node VMs by a condition on
    /// their names (the stop only with active fencing); the reads by the
    /// module's main role.
    fn gcp_fix(permission: &str) -> &'static str {
        if permission == "compute.instances.detachDisk" {
            "grant the service account the <name>_node_vms custom role of infra/modules/node-fencer-gcp; its condition holds it to VMs whose name starts with instance_name_prefix (gke-<cluster>-): check the VM's name matches"
        } else if gcp_power_off_permissions().contains(&permission) {
            "set active_fencing = \"stuck\" (or \"on\") in infra/modules/node-fencer-gcp: the <name>_node_vms custom role then grants it, on VMs whose name starts with instance_name_prefix (gke-<cluster>-): check the VM's name matches"
        } else {
            "grant the service account the custom role of infra/modules/node-fencer-gcp (the manifest's gcp_permissions)"
        }
    }

    /// The rows of one `testIamPermissions` answer: each wanted permission
    /// granted or denied on `on`.
    pub(super) fn granted_rows(
        wanted: &[&str],
        on: &str,
        answer: Result<Vec<String>, String>,
    ) -> Vec<Check> {
        wanted
            .iter()
            .map(|permission| {
                let check = format!("{permission} on {on}");
                match &answer {
                    Ok(granted) if granted.iter().any(|g| g == permission) => {
                        row(check, Status::Pass, "allowed")
                    }
                    Ok(_) => failed(check, "denied", gcp_fix(permission)),
                    Err(e) => failed(
                        check,
                        format!("could not check: {e}"),
                        "check COMPUTE_ENDPOINT, the service's identity and the network path to Compute Engine",
                    ),
                }
            })
            .collect()
    }

    /// The permissions Compute Engine cannot test, for the record.
    fn untestable_rows() -> Vec<Check> {
        gcp_permissions_on(GcpProbe::NotTestable)
            .into_iter()
            .map(|permission| {
                row(
                    permission,
                    Status::Info,
                    "not probed: no resource of Compute Engine holds it; the custom role grants it",
                )
            })
            .collect()
    }

    /// Compute Engine's checks on `vm`: the stop too when `power_off`
    /// (active fencing on).
    pub(super) async fn gce(
        clients: &Clients,
        vm: Option<&GceInstance>,
        power_off: bool,
        checks: &mut Vec<Check>,
    ) {
        let Some(vm) = vm else {
            checks.push(row(
                "compute engine",
                Status::Warn,
                "not probed: no node with a gce:// provider id to test permissions on",
            ));
            checks.extend(untestable_rows());
            return;
        };
        let Some(compute) = clients.gce().await else {
            checks.push(failed(
                "compute engine",
                "no client could be built (see the log)",
                "check COMPUTE_ENDPOINT and the Application Default Credentials",
            ));
            return;
        };
        let mut on_vm = gcp_permissions_on(GcpProbe::Instance);
        if power_off {
            on_vm.extend_from_slice(gcp_power_off_permissions());
        }
        let answer = compute.granted_on_vm(vm, &on_vm).await;
        checks.extend(granted_rows(&on_vm, &vm.provider_id(), answer));
        let on_disk = gcp_permissions_on(GcpProbe::Disk);
        match compute.boot_disk(vm).await {
            Ok(Some(disk)) => {
                let answer = compute.granted_on_disk(&disk, &on_disk).await;
                let name = format!("boot disk {}", disk.name);
                checks.extend(granted_rows(&on_disk, &name, answer));
            }
            Ok(None) => checks.extend(on_disk.iter().map(|p| {
                row(
                    *p,
                    Status::Warn,
                    format!(
                        "not probed: {} has no boot disk to test on",
                        vm.provider_id()
                    ),
                )
            })),
            Err(e) => checks.extend(on_disk.iter().map(|p| {
                row(
                    *p,
                    Status::Warn,
                    format!("not probed: {} could not be read: {e}", vm.provider_id()),
                )
            })),
        }
        checks.extend(untestable_rows());
    }
}

#[cfg(feature = "google-cloud")]
use compute::gce;

/// A build without the Compute Engine client cannot fence a VM.
#[cfg(not(feature = "google-cloud"))]
async fn gce(_: &Clients, _: Option<&GceInstance>, _: bool, checks: &mut Vec<Check>) {
    checks.push(failed(
        "compute engine",
        "this build has no Compute Engine client",
        "deploy the Cloud Run image (handler/Dockerfile, built with --features serve,google-cloud)",
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(provider_id: Option<&str>) -> NodeFacts {
        NodeFacts {
            instance: provider_id.and_then(InstanceId::parse),
            ..NodeFacts::bare("n", Readiness::Unknown)
        }
    }

    fn ready(provider_id: &str) -> NodeFacts {
        NodeFacts {
            readiness: Readiness::Ready,
            ..node(Some(provider_id))
        }
    }

    fn gke() -> ClusterAccess {
        ClusterAccess::Gke {
            cluster: "projects/p/locations/l/clusters/c".into(),
            endpoint: "https://10.0.0.1".into(),
            ca: "Q0E=".into(),
        }
    }

    #[test]
    fn the_nodes_name_the_clouds_to_check() {
        let vm = "gce://proj-fencer/us-central1-a/vm-1";
        let mixed = [
            node(Some("i-0123456789abcdef0")),
            node(Some(vm)),
            node(None),
        ];
        let both = clouds(&ClusterAccess::Ambient, Some(&mixed));
        assert!(both.ec2);
        assert_eq!(
            both.gce,
            Some(GceInstance::from_provider_id(vm)),
            "tested on the first VM"
        );
        let on_gce = clouds(&ClusterAccess::Ambient, Some(&mixed[1..]));
        assert!(!on_gce.ec2, "no EC2 probe for a cluster on Compute Engine");
        let alive = "gce://proj-fencer/us-central1-a/vm-2";
        let prefers_ready = clouds(
            &ClusterAccess::Ambient,
            Some(&[node(Some(vm)), ready(alive)]),
        );
        assert_eq!(
            prefers_ready.gce,
            Some(GceInstance::from_provider_id(alive)),
            "a dead node's VM may be deleted: a Ready node's is asked"
        );
        let on_ec2 = clouds(&gke(), Some(&mixed[..1]));
        assert!(on_ec2.ec2);
        assert_eq!(on_ec2.gce, Some(None), "GKE: Compute Engine, no VM to name");
    }

    #[test]
    fn without_nodes_the_access_tells() {
        assert_eq!(
            clouds(&ClusterAccess::Ambient, None),
            Clouds {
                ec2: true,
                gce: None
            }
        );
        assert_eq!(
            clouds(&gke(), Some(&[node(None)])),
            Clouds {
                ec2: false,
                gce: Some(None)
            }
        );
    }

    #[test]
    #[cfg(feature = "google-cloud")]
    fn a_permission_missing_from_the_answer_is_denied() {
        use super::compute::granted_rows;
        let wanted = ["compute.instances.detachDisk", "compute.instances.get"];
        let rows = granted_rows(&wanted, "vm", Ok(vec!["compute.instances.get".into()]));
        assert_eq!(rows[0].status, Status::Fail);
        assert_eq!(rows[0].check, "compute.instances.detachDisk on vm");
        assert!(
            rows[0]
                .fix
                .as_deref()
                .is_some_and(|f| f.contains("_node_vms") && f.contains("instance_name_prefix")),
            "the detach is granted by the node VMs' role: {rows:?}"
        );
        assert_eq!(rows[1].status, Status::Pass);
        let reads = granted_rows(&["compute.instances.get"], "vm", Ok(vec![]));
        assert!(
            reads[0]
                .fix
                .as_deref()
                .is_some_and(|f| f.contains("gcp_permissions") && !f.contains("_node_vms")),
            "{reads:?}"
        );
        // Active fencing's stop is granted by the node VMs' role too, and
        // only with active_fencing.
        let stop = granted_rows(&["compute.instances.stop"], "vm", Ok(vec![]));
        assert!(
            stop[0].fix.as_deref().is_some_and(
                |f| f.contains("_node_vms") && f.contains("active_fencing = \"stuck\"")
            ),
            "{stop:?}"
        );
        let unknown = granted_rows(&wanted, "vm", Err("503".into()));
        assert!(unknown.iter().all(|r| r.status == Status::Fail));
        assert!(unknown[0].detail.contains("could not check: 503"));
    }

    #[test]
    fn dry_run_answers() {
        assert_eq!(
            dry_run_check::<()>("DetachVolume", Err("DryRunOperation".into())).status,
            Status::Pass
        );
        let denied = dry_run_check::<()>("DetachVolume", Err("UnauthorizedOperation".into()));
        assert_eq!(denied.status, Status::Fail);
        assert!(denied.fix.unwrap().contains("ec2:DetachVolume"));
        assert_eq!(
            dry_run_check::<()>("X", Err("timeout".into())).status,
            Status::Fail
        );
    }
}
