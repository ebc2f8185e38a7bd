//! The Compute Engine shell's own last look, against the fake Compute Engine
//! through Google's client: a disk is detached only from the VM the fencing
//! judged, and only while it is off; and the request id names the fencing,
//! so the same fencing's detach sent twice is one operation, a later
//! fencing's another.

use node_fencer::core::model::instance::{InstanceId, VolumeId};
use node_fencer::shell::cloud::{Cloud, Detach};
use node_fencer_tests::gce::fake_compute_on;
use node_fencer_tests::{serial, stack};

const ZONE: &str = "us-central1-a";

/// Issue 33, item 4: Compute Engine restarts a VM after a host error on its
/// own, and a managed instance group recreates one under the same name:
/// the look right before `detachDisk` holds the detach back unless the VM is
/// off and is the one judged.
#[tokio::test]
async fn a_disk_is_detached_only_from_the_judged_vm_while_it_is_off() -> anyhow::Result<()> {
    let _g = serial().await;
    let fake = fake_compute_on(stack());
    let compute = fake.client();
    let gce = fake.shell().await?;
    let name = node_fencer_tests::fixtures::unique("vm");
    let vm = compute.create_instance(ZONE, &name).await?;
    let disk = compute
        .create_disk(ZONE, &node_fencer_tests::fixtures::unique("pd"))
        .await?;
    compute.attach_disk(&vm, &disk).await?;
    compute.set_status(&vm, "TERMINATED").await?;
    let id = InstanceId::parse(&vm.provider_id()).expect("a VM");
    let volume = VolumeId::parse(&disk).expect("a PD handle");
    let judged = gce.describe_instances(std::slice::from_ref(&id)).await?;
    let order = Detach {
        machine: &judged[0],
        fencing: "2026-11-26T10:00:00Z",
    };

    // Restarted since the fencing looked.
    compute.set_status(&vm, "RUNNING").await?;
    let held = gce.detach_volume(&volume, &order).await.expect_err("held");
    assert!(held.to_string().contains("not off"), "{held}");
    assert_eq!(compute.detach_operations(&vm).await?, 0);

    // Another VM under the name, off.
    let again = compute.recreate_instance(&vm, "TERMINATED").await?;
    assert_ne!(again.id, vm.id);
    let held = gce.detach_volume(&volume, &order).await.expect_err("held");
    assert!(held.to_string().contains("another one"), "{held}");
    assert_eq!(compute.detach_operations(&again).await?, 0);

    // The judged VM is gone for good: nothing of this fencing's is left to
    // detach from the new one. A fencing that judged the new VM, off, may.
    let judged_again = gce.describe_instances(std::slice::from_ref(&id)).await?;
    let first = Detach {
        machine: &judged_again[0],
        fencing: "2026-11-26T10:00:00Z",
    };
    gce.detach_volume(&volume, &first).await?;
    // The same fencing's detach sent again is the same operation.
    compute.attach_disk(&again, &disk).await?;
    let _ = gce.detach_volume(&volume, &first).await;
    assert_eq!(compute.detach_operations(&again).await?, 1);
    // Issue 33, item 12: a later fencing of the same VM and disk is another.
    let later = Detach {
        machine: &judged_again[0],
        fencing: "2026-11-26T11:00:00Z",
    };
    gce.detach_volume(&volume, &later).await?;
    assert_eq!(compute.detach_operations(&again).await?, 2);
    Ok(())
}

/// Issue 39: a VM stopped in the fake Compute Engine carries the
/// `lastStopTimestamp` Google writes, read through Google's client as the
/// machine's recorded stop; a VM that never stopped has none.
#[tokio::test]
async fn a_stopped_vm_carries_its_recorded_stop_time() -> anyhow::Result<()> {
    let _g = serial().await;
    let fake = fake_compute_on(stack());
    let compute = fake.client();
    let gce = fake.shell().await?;
    let running = compute
        .create_instance(ZONE, &node_fencer_tests::fixtures::unique("vm"))
        .await?;
    let stopped = compute
        .create_instance(ZONE, &node_fencer_tests::fixtures::unique("vm"))
        .await?;
    let now = || k8s_openapi::jiff::Timestamp::now().as_second();
    let before = now() - 1;
    compute.set_status(&stopped, "TERMINATED").await?;
    let after = now() + 1;
    let ids: Vec<InstanceId> = [&running, &stopped]
        .iter()
        .map(|vm| InstanceId::parse(&vm.provider_id()).expect("a VM"))
        .collect();
    let facts = gce.describe_instances(&ids).await?;
    assert_eq!(facts.len(), 2);
    assert_eq!(facts[0].stopped_at, None, "never stopped");
    let at = facts[1].stopped_at.expect("a recorded stop");
    assert!(
        (before..=after).contains(&at),
        "{before} <= {at} <= {after}"
    );
    Ok(())
}
