//! The EC2 shell against moto: confirmation, batching, volume discovery.

use anyhow::Context;
use node_fencer::core::model::instance::{InstanceId, InstanceState, VolumeId};
use node_fencer::shell::cloud::aws::Ec2;
use node_fencer::shell::cloud::{Cloud, Detach};
use node_fencer_tests::fixtures::{attach_new_volume, launch, stop, volume};
use node_fencer_tests::stack;

#[tokio::test]
async fn describe_instances_reports_each_state_in_one_call() -> anyhow::Result<()> {
    let ec2 = stack().ec2().await;
    let running = launch(&ec2).await?;
    let stopped = launch(&ec2).await?;
    let terminated = launch(&ec2).await?;
    stop(&ec2, &stopped).await?;
    ec2.terminate_instances()
        .instance_ids(&terminated.instance)
        .send()
        .await?;
    let unknown = "i-0fffffffffffffff0";
    let ids: Vec<InstanceId> = [&running.instance, &stopped.instance, &terminated.instance]
        .into_iter()
        .map(|s| s.as_str())
        .chain([unknown])
        .filter_map(InstanceId::parse)
        .collect();
    let facts = Ec2::new(ec2).describe_instances(&ids).await?;
    let state = |id: &str| {
        facts
            .iter()
            .find(|f| f.id.as_str() == id)
            .map(|f| f.state.clone())
    };
    assert_eq!(state(&running.instance), Some(InstanceState::Running));
    assert_eq!(state(&stopped.instance), Some(InstanceState::Stopped));
    assert_eq!(state(&terminated.instance), Some(InstanceState::Terminated));
    assert_eq!(
        state(unknown),
        None,
        "an unknown id is absent, not an error for the batch"
    );
    let f = facts
        .iter()
        .find(|f| f.id.as_str() == running.instance)
        .expect("described");
    assert_eq!(
        f.root_device_name.as_deref(),
        Some(running.root_device.as_str())
    );
    assert!(f.private_dns_name.as_deref().is_some_and(|d| !d.is_empty()));
    Ok(())
}

/// Issue 39: a stopped instance carries the time EC2 recorded in its
/// `StateTransitionReason` (`User initiated (… GMT)`; moto writes `UTC`);
/// a running one that never stopped has none.
#[tokio::test]
async fn a_stopped_instance_carries_its_recorded_stop_time() -> anyhow::Result<()> {
    let ec2 = stack().ec2().await;
    let running = launch(&ec2).await?;
    let stopped = launch(&ec2).await?;
    let before = now() - 1;
    stop(&ec2, &stopped).await?;
    let after = now() + 1;
    let ids: Vec<InstanceId> = [&running.instance, &stopped.instance]
        .into_iter()
        .filter_map(|s| InstanceId::parse(s))
        .collect();
    let facts = Ec2::new(ec2).describe_instances(&ids).await?;
    let stopped_at = |id: &str| {
        facts
            .iter()
            .find(|f| f.id.as_str() == id)
            .map(|f| f.stopped_at)
    };
    assert_eq!(stopped_at(&running.instance), Some(None));
    let at = stopped_at(&stopped.instance)
        .flatten()
        .expect("a recorded stop time");
    assert!(
        (before..=after).contains(&at),
        "{before} <= {at} <= {after}"
    );
    Ok(())
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[tokio::test]
async fn describe_volumes_and_force_detach() -> anyhow::Result<()> {
    let ec2 = stack().ec2().await;
    let m = launch(&ec2).await?;
    let data = attach_new_volume(&ec2, &m, "/dev/xvdba").await?;
    stop(&ec2, &m).await?;
    let cloud = Ec2::new(ec2.clone());
    let ids: Vec<VolumeId> = [&data, &m.root_volume]
        .iter()
        .filter_map(|v| VolumeId::parse(v))
        .collect();
    let described = cloud.describe_volumes(&ids).await?;
    assert_eq!(described.len(), 2);
    let d = described
        .iter()
        .find(|v| v.id.as_str() == data)
        .expect("data volume");
    assert_eq!(d.attachments[0].instance.as_str(), m.instance);
    assert_eq!(d.attachments[0].device.as_deref(), Some("/dev/xvdba"));

    let vol = VolumeId::parse(&data).expect("volume id");
    let inst = InstanceId::parse(&m.instance).expect("instance id");
    let described = cloud
        .describe_instances(std::slice::from_ref(&inst))
        .await?;
    let order = Detach {
        machine: &described[0],
        fencing: "2026-11-26T10:00:00Z",
    };
    cloud.detach_volume(&vol, &order).await?;
    assert_eq!(volume(&ec2, &data).await?, ("available".into(), vec![]));
    // Detaching again is an error EC2 names, which the pipeline treats as done.
    let again = cloud
        .detach_volume(&vol, &order)
        .await
        .expect_err("second detach must fail");
    assert!(again.is_already_detached(), "{again}");
    // The root volume was never touched.
    assert_eq!(
        volume(&ec2, &m.root_volume).await?.1,
        vec![m.instance.clone()]
    );
    Ok(())
}

/// Issue 59: the machines that carry a Node's name, as EC2's filters find
/// them: by private DNS name, in the VPC named or in every VPC, only those
/// that may run. (moto keeps a terminated instance's address, so a second
/// machine under the same name cannot be made here; the core's rule tells
/// the Node's own machine from another, `namesake::tests`.)
#[tokio::test]
async fn the_machines_named_are_those_that_may_run_under_the_name() -> anyhow::Result<()> {
    let ec2 = stack().ec2().await;
    let cloud = Ec2::new(ec2.clone());
    let m = launch(&ec2).await?;
    let facts = cloud
        .describe_instances(&[InstanceId::parse(&m.instance).context("an id")?])
        .await?;
    let vpc = facts
        .first()
        .and_then(|f| f.vpc_id.clone())
        .context("a VPC")?;
    let name = m.private_dns.clone();
    assert!(!name.is_empty(), "moto names the instance");
    let ids = |found: &[node_fencer::core::model::facts::InstanceFacts]| -> Vec<String> {
        found.iter().map(|f| f.id.as_str().to_owned()).collect()
    };
    let found = cloud.machines_named(&name, Some(&vpc)).await?;
    assert_eq!(ids(&found), [m.instance.as_str()]);
    assert_eq!(found[0].state, InstanceState::Running);
    assert_eq!(found[0].private_dns_name.as_deref(), Some(name.as_str()));
    assert_eq!(
        ids(&cloud.machines_named(&name, None).await?),
        [m.instance.as_str()]
    );
    assert!(
        cloud
            .machines_named(&name, Some("vpc-0000000000000000f"))
            .await?
            .is_empty(),
        "another VPC's machines are not asked for"
    );
    assert!(
        cloud
            .machines_named("ip-192-0-2-1.ec2.internal", None)
            .await?
            .is_empty()
    );
    stop(&ec2, &m).await?;
    assert!(
        cloud.machines_named(&name, None).await?.is_empty(),
        "a stopped machine runs nothing"
    );
    ec2.terminate_instances()
        .instance_ids(&m.instance)
        .send()
        .await?;
    assert!(
        cloud.machines_named(&name, None).await?.is_empty(),
        "nor does a terminated one"
    );
    Ok(())
}
