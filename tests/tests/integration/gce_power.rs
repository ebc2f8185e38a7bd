//! Active fencing's power-off on Compute Engine (issue 36), against the fake
//! Compute Engine through Google's client: the VM judged, and only that one,
//! is stopped at once (no graceful shutdown, Local SSD data kept) under a
//! request id that names the power-off, its operation followed to the end;
//! a VM recreated under the same name is never stopped.

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
