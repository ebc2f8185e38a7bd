//! Active fencing's power-off on Compute Engine (issue 36), against the fake
//! Compute Engine through Google's client: the VM judged, and only that one,
//! is stopped at once (no graceful shutdown, Local SSD data kept) under a
//! request id that names the power-off, its operation followed to the end;
//! a VM recreated under the same name is never stopped, by the shell nor,
//! end to end, by a pipeline that judged the old one.

use std::time::Duration;

use node_fencer::core::model::facts::InstanceFacts;
use node_fencer::core::model::instance::InstanceId;
use node_fencer::shell::cloud::gce::Gce;
use node_fencer::shell::cloud::{Cloud, PowerOff};
use node_fencer_tests::gce::{Compute, Vm, fake_compute_on};
use node_fencer_tests::{serial, stack};

const ZONE: &str = "us-central1-a";
const MARK: &str = "2026-11-26T10:00:00Z";

/// The shell over the fake, and a running VM of a fresh name.
async fn running_vm() -> anyhow::Result<(Gce, Compute, Vm)> {
    let fake = fake_compute_on(stack());
    let compute = fake.client();
    let gce = fake.shell().await?;
    let name = node_fencer_tests::fixtures::unique("vm");
    let vm = compute.create_instance(ZONE, &name).await?;
    Ok((gce, compute, vm))
}

/// The VM as the judgement saw it.
async fn judged(gce: &Gce, vm: &Vm) -> anyhow::Result<InstanceFacts> {
    let id = InstanceId::parse(&vm.provider_id()).expect("a VM");
    let mut found = gce.describe_instances(std::slice::from_ref(&id)).await?;
    found
        .pop()
        .ok_or_else(|| anyhow::anyhow!("{vm:?} not described"))
}

fn order(machine: &InstanceFacts, within: Duration) -> PowerOff<'_> {
    PowerOff {
        machine,
        fencing: MARK,
        until: tokio::time::Instant::now() + within,
    }
}

/// A hung node's VM, RUNNING: one `instances.stop` with noGracefulShutdown
/// (a hung guest would hold a graceful shutdown), discardLocalSsd=false and
/// a request id, followed until the VM is TERMINATED; the same power-off
/// again finds it off and sends nothing.
#[tokio::test]
async fn a_running_vm_is_stopped_at_once_under_one_request_id() -> anyhow::Result<()> {
    let _g = serial().await;
    let (gce, compute, vm) = running_vm().await?;
    let machine = judged(&gce, &vm).await?;
    // A 503 on the first try: the stop is retried as one operation, by its
    // request id.
    compute
        .inject_fault("compute.instances.stop", 503, 1)
        .await?;
    gce.power_off(&order(&machine, Duration::from_secs(30)))
        .await?;
    assert_eq!(compute.status(&vm).await?.as_deref(), Some("TERMINATED"));
    let stops = compute.stop_requests(&vm).await?;
    assert_eq!(stops.len(), 2, "the 503 and its retry: {stops:?}");
    for stop in &stops {
        assert_eq!(
            stop.query.get("noGracefulShutdown").map(String::as_str),
            Some("true")
        );
        assert_eq!(
            stop.query.get("discardLocalSsd").map(String::as_str),
            Some("false")
        );
    }
    let ids: Vec<_> = stops.iter().map(|s| s.query.get("requestId")).collect();
    assert!(ids[0].is_some() && ids[0] == ids[1], "{ids:?}");
    assert_eq!(compute.stop_operations(&vm).await?, 1);

    gce.power_off(&order(&machine, Duration::from_secs(30)))
        .await?;
    assert_eq!(compute.stop_requests(&vm).await?.len(), 2, "already off");
    Ok(())
}

/// A managed instance group recreated the VM under the same name (another
/// id) after the judgement: the new machine is never stopped for the old
/// one's hang.
#[tokio::test]
async fn a_vm_recreated_under_the_same_name_is_never_stopped() -> anyhow::Result<()> {
    let _g = serial().await;
    let (gce, compute, vm) = running_vm().await?;
    let machine = judged(&gce, &vm).await?;
    let again = compute.recreate_instance(&vm, "RUNNING").await?;
    assert_ne!(again.id, vm.id);
    let held = gce
        .power_off(&order(&machine, Duration::from_secs(30)))
        .await
        .expect_err("another VM");
    assert!(held.to_string().contains("another one"), "{held}");
    assert_eq!(held.code.as_deref(), Some("MachineNotRunning"));
    assert!(compute.stop_requests(&again).await?.is_empty());
    assert_eq!(compute.status(&again).await?.as_deref(), Some("RUNNING"));
    Ok(())
}

/// A stop that takes longer than the bound is a stop under way, not a
/// failure: `Ok`, so that the mark stays and the stage waits for
/// TERMINATED (or a later look finds it).
#[tokio::test]
async fn a_stop_slower_than_the_bound_is_left_under_way() -> anyhow::Result<()> {
    let _g = serial().await;
    let (gce, compute, vm) = running_vm().await?;
    let machine = judged(&gce, &vm).await?;
    compute.set_operation_delay(4.0).await?;
    let sent = gce
        .power_off(&order(&machine, Duration::from_secs(1)))
        .await;
    compute.set_operation_delay(0.5).await?;
    sent?;
    assert_eq!(compute.status(&vm).await?.as_deref(), Some("STOPPING"));
    assert_eq!(compute.stop_operations(&vm).await?, 1);
    Ok(())
}

/// Issue 45, item 1, end to end against the apiserver and the fake: a hung
/// node's VM is judged RUNNING; while the invocation waits for the fencing
/// Lease (another holder has it for 3 s), the managed instance group
/// recreates the VM under the same name. The look under the Lease is held
/// to the VM judged: the new VM is neither stopped nor fenced on, the Node
/// is untouched but for the refusal's Warning.
#[tokio::test]
async fn a_vm_recreated_during_the_lease_wait_is_neither_stopped_nor_fenced() -> anyhow::Result<()>
{
    use k8s_openapi::api::coordination::v1::Lease;
    use node_fencer::core::inbound::suspect::{Batch, Intent, NodeRef, Origin, Suspect};
    use node_fencer::core::model::names::NodeName;
    use node_fencer::core::rules::power::ActiveFencing;
    use node_fencer::core::settings::policy::Policy;
    use node_fencer::shell::cluster::Kube;
    use node_fencer_tests::fixtures::{
        Machine, NodeSpec, assert_node_events, create_node, fence_with, get_node, settings, taints,
    };

    let _g = serial().await;
    let s = stack();
    let admin = s.admin().await?;
    let (gce, compute, vm) = running_vm().await?;
    let spec = NodeSpec::for_machine(&Machine::of_vm(vm.clone()));
    create_node(&admin, &spec).await?;
    let _cleanup = s.delete_on_drop(&[&spec.name]);

    // Another invocation holds the fencing Lease for 3 s more.
    let leases: kube::Api<Lease> = kube::Api::namespaced(admin.clone(), "kube-system");
    let _ = leases
        .delete("node-fencer", &kube::api::DeleteParams::default())
        .await;
    let now = k8s_openapi::jiff::Timestamp::now();
    let held: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-fencer", "namespace": "kube-system"},
        "spec": {"holderIdentity": "another-invocation", "leaseDurationSeconds": 3,
                 "acquireTime": now.to_string(), "renewTime": now.to_string()},
    }))?;
    leases
        .create(&kube::api::PostParams::default(), &held)
        .await?;

    let policy = Policy {
        active_fencing: Some(ActiveFencing {
            // The bare stack's other tests leave NotReady Nodes about.
            partition_percent: 100,
            wait: Duration::from_secs(20),
            ..ActiveFencing::default()
        }),
        ..settings()
    };
    let batch = Batch {
        suspects: vec![Suspect {
            target: NodeRef::Name(NodeName::parse(&spec.name).expect("a node name")),
            intent: Intent::PowerOff,
            origin: Origin::Direct,
        }],
        ..Batch::default()
    };
    let cluster = Kube::new(s.fencer().await?, "node-fencer-tests");
    let recreate = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        compute.recreate_instance(&vm, "RUNNING").await
    };
    let (report, again) = tokio::join!(fence_with(&gce, &cluster, batch, policy), recreate);
    let (report, again) = (report?, again?);
    assert_ne!(again.id, vm.id);

    let r = &report.results[0];
    let refusal = r
        .power_off
        .as_ref()
        .and_then(|p| p.refusal.as_ref())
        .map(|r| r.code());
    assert_eq!(refusal, Some("machine_replaced"), "{report:#?}");
    assert!(compute.stop_requests(&again).await?.is_empty());
    assert_eq!(compute.status(&again).await?.as_deref(), Some("RUNNING"));
    let node = get_node(&admin, &spec.name).await?;
    assert!(
        !taints(&node).iter().any(|t| t.contains("out-of-service")),
        "{:?}",
        taints(&node)
    );
    assert_node_events(&admin, &spec.name, &["PowerOffRefused"]).await?;
    Ok(())
}
