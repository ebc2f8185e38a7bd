//! node-fencer against a Compute Engine that misbehaves: a fault proxy sits
//! between its Compute Engine client and the fake (`tests/gce/fake_compute.py`)
//! and answers chosen calls with 503 `backendError`, 429
//! `rateLimitExceeded`, 404s that are not Compute Engine's own `notFound`
//! for the resource asked about, held answers, dropped connections and
//! lost answers.
//! The Kubernetes side is the plain stack of [`super::faults`], unproxied;
//! EC2 machines of other tests go to moto directly. What must hold whatever
//! fails: bounded retries, no taint or `detachDisk` for a VM not confirmed
//! off, and a retried event converging with one detach operation per disk.

use std::time::{Duration, Instant};

use http::Method;
use node_fencer::core::inbound::suspect::Intent;
use node_fencer::core::outbound::report::{Outcome, Report, VolumeOutcome};
use node_fencer::core::rules::decide::Skip;
use node_fencer::core::rules::retry::COMPUTE;
use node_fencer::shell::cloud::Clouds;
use node_fencer::shell::cloud::aws::Ec2;
use node_fencer::shell::cloud::gce::{Gce, GceEndpoint};
use node_fencer::shell::cluster::Kube;
use node_fencer::shell::connect::Timeouts;
use node_fencer_tests::faults::{Fault, FaultProxy, Match};
use node_fencer_tests::fixtures::*;
use node_fencer_tests::gce::{Compute, Vm, fake_compute_on};
use node_fencer_tests::scene::wait_until;
use node_fencer_tests::{serial, stack};
use tokio::sync::MutexGuard;

use crate::faults::{FAST, HANG};
use crate::{by_instance, one};

/// The bound on the wait for a detached disk to be free.
const DETACH_WAIT: Duration = Duration::from_secs(5);

/// node-fencer's clouds, Compute Engine behind the proxy.
struct Faulty {
    proxy: FaultProxy,
    fake: Compute,
    ec2: Ec2,
    gce: Gce,
    cluster: Kube,
}

async fn faulty(timeouts: Timeouts) -> anyhow::Result<Faulty> {
    let s = stack();
    let fake = fake_compute_on(s);
    let proxy = FaultProxy::to_http(&fake.endpoint()).await?;
    let endpoint = GceEndpoint {
        url: Some(proxy.url.clone()),
        timeouts,
    };
    Ok(Faulty {
        gce: Gce::new(&endpoint).await.map_err(anyhow::Error::msg)?,
        proxy,
        fake: fake.client(),
        ec2: Ec2::new(s.ec2().await),
        cluster: Kube::new(s.fencer().await?, "gce-fault-tests"),
    })
}

/// The serial lock (taints count against the cap), the proxied clients
/// and a VM with one Persistent Disk, `TERMINATED` unless `running`.
async fn setup(
    running: bool,
    timeouts: Timeouts,
) -> anyhow::Result<(MutexGuard<'static, ()>, Faulty, Target)> {
    let guard = serial().await;
    let f = faulty(timeouts).await?;
    let t = gce_target(stack(), &f.fake, running).await?;
    Ok((guard, f, t))
}

fn vm_of(t: &Target) -> anyhow::Result<&Vm> {
    t.m.vm
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("{} is no VM", t.m.instance))
}

fn get(vm: &Vm) -> Match {
    Match::compute(Method::GET, &vm.path())
}

fn detach(vm: &Vm) -> Match {
    Match::compute(Method::POST, &format!("{}/detachDisk", vm.path()))
}

/// Every look at a zonal operation of the VM's zone.
fn operations(vm: &Vm) -> Match {
    let zone = format!(
        "/compute/v1/projects/{}/zones/{}/operations/",
        vm.project, vm.zone
    );
    Match::any().method(Method::GET).path(&zone)
}

async fn fence(f: &Faulty, t: &Target) -> anyhow::Result<Report> {
    let clouds = Clouds {
        aws: &f.ec2,
        gce: Some(&f.gce),
        redfish: None,
    };
    let batch = one(by_instance(&t.m.instance), Intent::Fence);
    Ok(
        fence_within(&clouds, &f.cluster, batch, settings(), DETACH_WAIT)
            .await?
            .0,
    )
}

/// How many out-of-service taints the Node carries.
async fn out_of_service(t: &Target) -> anyhow::Result<usize> {
    let node = get_node(&stack().admin().await?, &t.node).await?;
    Ok(taints(&node)
        .iter()
        .filter(|x| *x == OUT_OF_SERVICE)
        .count())
}

/// Nothing done for a VM not confirmed off: no taint, no `detachDisk`
/// reached the fake, the disk still on the VM.
async fn assert_untouched(f: &Faulty, t: &Target, step: &str) -> anyhow::Result<()> {
    let vm = vm_of(t)?;
    assert_eq!(out_of_service(t).await?, 0, "{step}: no taint");
    let detaches = f.fake.detach_requests(vm).await?;
    assert!(detaches.is_empty(), "{step}: no detachDisk: {detaches:?}");
    assert_eq!(
        f.fake.disk_users(&t.volume).await?,
        Some(vec![vm.path()]),
        "{step}: the disk stays on its VM"
    );
    Ok(())
}

/// The end state, once: one taint, the disk free, one detach operation.
async fn assert_fenced_once(f: &Faulty, t: &Target) -> anyhow::Result<()> {
    assert_eq!(out_of_service(t).await?, 1);
    assert_eq!(f.fake.disk_users(&t.volume).await?, Some(vec![]));
    assert_eq!(f.fake.detach_operations(vm_of(t)?).await?, 1);
    Ok(())
}

/// Waits for the disk to be free: the detach operation the fake accepted
/// has run, whether or not its answers reached node-fencer.
async fn operation_done(f: &Faulty, t: &Target) -> anyhow::Result<()> {
    wait_until("the detach operation to end", DETACH_WAIT, || async {
        let users = f.fake.disk_users(&t.volume).await?;
        Ok(users.is_some_and(|u| u.is_empty()).then_some(()))
    })
    .await
}

/// The same event again, as Lambda or Pub/Sub sends it, once Compute
/// Engine is healthy: it finishes with `outcome`, the node fenced once,
/// `detach_requests` in all having reached Compute Engine.
async fn retried_after_healing(
    f: &Faulty,
    t: &Target,
    outcome: Outcome,
    detach_requests: usize,
) -> anyhow::Result<()> {
    f.proxy.heal();
    let again = fence(f, t).await?;
    assert!(!again.incomplete(), "{again:#?}");
    assert_eq!(again.results[0].outcome, outcome, "{again:#?}");
    let sent = f.fake.detach_requests(vm_of(t)?).await?.len();
    assert_eq!(sent, detach_requests, "detachDisk requests");
    assert_fenced_once(f, t).await
}

/// Tainted, the detach not known to be done: the run fails for a retry.
fn assert_detach_failed(report: &Report) {
    assert!(
        report.incomplete(),
        "work is left for the retry: {report:#?}"
    );
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Failed, "{report:#?}");
    assert!(r.taint_applied, "{report:#?}");
    assert_eq!(r.volumes[0].outcome, VolumeOutcome::Failed, "{report:#?}");
}

/// The VM could not be looked at: skipped, and the run says so.
fn assert_lookup_failed(report: &Report) {
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Skipped, "{report:#?}");
    assert!(
        matches!(r.skip, Some(Skip::LookupFailed { .. })),
        "{report:#?}"
    );
}

#[tokio::test]
async fn gce_throttling_and_unavailability_are_retried_within_the_bound() -> anyhow::Result<()> {
    let (_g, f, t) = setup(false, FAST).await?;
    let vm = vm_of(&t)?;
    // The first look at the VM takes every attempt the policy allows.
    let first_look = COMPUTE.max_attempts as usize - 1;
    f.proxy.inject(get(vm), Fault::gce_unavailable(), 2);
    f.proxy
        .inject(get(vm), Fault::gce_rate_limited(), first_look - 2);
    f.proxy.inject(detach(vm), Fault::gce_rate_limited(), 1);
    f.proxy.inject(operations(vm), Fault::gce_unavailable(), 1);
    let report = fence(&f, &t).await?;
    assert!(!report.incomplete(), "{report:#?}");
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(r.volumes[0].outcome, VolumeOutcome::Detached, "{report:#?}");
    assert_eq!(f.proxy.faults_served(), first_look + 2);
    assert_eq!(f.fake.detach_requests(vm).await?.len(), 1);
    assert_fenced_once(&f, &t).await
}

#[tokio::test]
async fn gce_an_unanswered_confirmation_fences_nothing_and_the_retry_converges()
-> anyhow::Result<()> {
    let (_g, f, t) = setup(false, FAST).await?;
    let vm = vm_of(&t)?;
    f.proxy
        .inject(get(vm), Fault::gce_unavailable(), usize::MAX);
    let started = Instant::now();
    let report = fence(&f, &t).await?;
    let took = started.elapsed();
    assert!(
        report.incomplete(),
        "work is left for the retry: {report:#?}"
    );
    assert_lookup_failed(&report);
    let asked = f.proxy.calls(&get(vm));
    assert_eq!(asked, COMPUTE.max_attempts as usize, "bounded retries");
    assert!(took < FAST.call, "gave up after {took:?}");
    assert_eq!(f.proxy.calls(&detach(vm)), 0);
    assert_untouched(&f, &t, "unanswered").await?;

    retried_after_healing(&f, &t, Outcome::Fenced, 1).await
}

/// Short attempts, so that holding every one costs the test little.
const IMPATIENT: Timeouts = Timeouts {
    attempt: Duration::from_millis(500),
    ..FAST
};

#[tokio::test]
async fn gce_a_confirmation_held_past_the_attempt_timeout_is_bounded_and_acts_on_nothing()
-> anyhow::Result<()> {
    let (_g, f, t) = setup(false, IMPATIENT).await?;
    let vm = vm_of(&t)?;
    f.proxy.inject(get(vm), Fault::Delay(HANG), usize::MAX);
    let started = Instant::now();
    let report = fence(&f, &t).await?;
    let took = started.elapsed();
    assert!(report.incomplete(), "{report:#?}");
    assert_lookup_failed(&report);
    // Each attempt is cut at its timeout and tried again, within the bound.
    assert_eq!(f.proxy.calls(&get(vm)), COMPUTE.max_attempts as usize);
    let bound = IMPATIENT.attempt * COMPUTE.max_attempts + COMPUTE.cap * 2;
    assert!(took < bound, "gave up after {took:?}, bound {bound:?}");
    assert_untouched(&f, &t, "held").await
}

/// The faults one request of a flaky connection may get.
fn flaky(draw: u32) -> Fault {
    match draw % 5 {
        0 => Fault::gce_unavailable(),
        1 => Fault::gce_rate_limited(),
        2 => Fault::Drop,
        3 => Fault::ForwardThenDrop,
        _ => Fault::gce_error(500, "backendError", "Internal error. Please try again."),
    }
}

/// The worst outcome of all: a running VM fenced, two writers on one disk.
#[tokio::test]
async fn gce_a_running_vm_is_never_fenced_whatever_fails() -> anyhow::Result<()> {
    let (_g, f, t) = setup(true, FAST).await?;
    for seed in [1, 2, 3] {
        f.proxy.heal();
        let mut rng = fastrand::Rng::with_seed(seed);
        for _ in 0..rng.usize(1..=6) {
            f.proxy
                .inject(Match::any(), flaky(rng.u32(..)), rng.usize(1..=3));
        }
        let report = fence(&f, &t).await?;
        let r = &report.results[0];
        assert!(
            matches!(r.outcome, Outcome::Skipped | Outcome::Failed),
            "seed {seed}: {report:#?}"
        );
        assert!(!r.taint_applied, "seed {seed}: {report:#?}");
        assert_untouched(&f, &t, &format!("seed {seed}")).await?;
    }
    // And with Compute Engine healthy, the answer is the VM's own.
    f.proxy.heal();
    let report = fence(&f, &t).await?;
    let skip = report.results[0].skip.as_ref().map(|s| s.code());
    assert_eq!(skip, Some("instance_not_off"), "{report:#?}");
    assert_untouched(&f, &t, "healthy").await
}

#[tokio::test]
async fn gce_a_detach_whose_answer_was_lost_once_is_the_same_operation() -> anyhow::Result<()> {
    let (_g, f, t) = setup(false, FAST).await?;
    let vm = vm_of(&t)?;
    // The detach lands and its answer is lost; the retry carries the same
    // request id, and Compute Engine answers with the same operation.
    f.proxy.inject(detach(vm), Fault::ForwardThenDrop, 1);
    let report = fence(&f, &t).await?;
    assert!(!report.incomplete(), "{report:#?}");
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    let sent = f.fake.detach_requests(vm).await?;
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(
        sent[0].query.get("requestId"),
        sent[1].query.get("requestId")
    );
    assert_fenced_once(&f, &t).await
}

/// The PD CSI driver's own detach of the disk (the attach/detach
/// controller let go of it once the pods went) ends between node-fencer's
/// last read of the VM, which still holds the disk, and its `detachDisk`:
/// Compute Engine then finds no disk of that device name. The disk is free,
/// so the fencing is done, not failed.
#[tokio::test]
async fn gce_a_disk_detached_by_the_driver_right_before_the_detach_is_done() -> anyhow::Result<()> {
    let patient = Timeouts {
        attempt: Duration::from_secs(10),
        ..FAST
    };
    let (_g, f, t) = setup(false, patient).await?;
    let vm = vm_of(&t)?;
    f.proxy
        .inject(detach(vm), Fault::Delay(Duration::from_secs(3)), 1);
    let device = t.volume.rsplit('/').next().unwrap_or_default().to_owned();
    let driver = async {
        wait_until("node-fencer's detachDisk", DETACH_WAIT, || async {
            Ok((f.proxy.calls(&detach(vm)) > 0).then_some(()))
        })
        .await?;
        f.fake.detach_disk(vm, &device).await?;
        operation_done(&f, &t).await
    };
    let (report, driven) = tokio::join!(fence(&f, &t), driver);
    driven?;
    let report = report?;
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(r.volumes[0].outcome, VolumeOutcome::Detached, "{report:#?}");
    assert_eq!(out_of_service(&t).await?, 1);
    assert_eq!(f.fake.disk_users(&t.volume).await?, Some(vec![]));
    Ok(())
}

#[tokio::test]
async fn gce_a_detach_whose_answers_are_all_lost_fails_and_the_retry_converges()
-> anyhow::Result<()> {
    let (_g, f, t) = setup(false, FAST).await?;
    let vm = vm_of(&t)?;
    f.proxy
        .inject(detach(vm), Fault::ForwardThenDrop, usize::MAX);
    let first = fence(&f, &t).await?;
    // Every answer is lost, but the fake carries the detach out: when its
    // operation has ended by the time the VM is read again, the VM no
    // longer holds the disk and the verification finds it free; else the
    // detach failed. Both converge below.
    if first.results[0].outcome != Outcome::Fenced {
        assert_detach_failed(&first);
    }
    let sent = f.fake.detach_requests(vm).await?.len();
    assert_eq!(sent, COMPUTE.max_attempts as usize, "bounded retries");
    // The fake carried the detach out, once, whatever the client saw; its
    // operation ends on Compute Engine's time, which the client's bounded
    // retries may not have waited out.
    operation_done(&f, &t).await?;
    assert_fenced_once(&f, &t).await?;
    retried_after_healing(&f, &t, Outcome::AlreadyFenced, sent).await
}

#[tokio::test]
async fn gce_an_operation_that_cannot_be_followed_fails_and_the_retry_converges()
-> anyhow::Result<()> {
    let (_g, f, t) = setup(false, FAST).await?;
    let vm = vm_of(&t)?;
    f.proxy
        .inject(operations(vm), Fault::gce_unavailable(), usize::MAX);
    let first = fence(&f, &t).await?;
    assert_detach_failed(&first);
    // One look at the operation, retried within the bound, then given up.
    let looks = f.proxy.calls(&operations(vm));
    assert_eq!(looks, COMPUTE.max_attempts as usize, "bounded retries");
    assert_eq!(f.fake.detach_requests(vm).await?.len(), 1);
    retried_after_healing(&f, &t, Outcome::AlreadyFenced, 1).await
}

/// A 404 that is not Compute Engine's: a proxy's bare answer, a load
/// balancer's page.
fn foreign_404(content_type: &'static str, body: &str) -> Fault {
    Fault::Respond {
        status: 404,
        content_type,
        body: body.to_owned(),
    }
}

/// Only Compute Engine's own `notFound` for that very VM means it was
/// deleted. A 404 of any other kind (a proxy's bare answer, a load
/// balancer's HTML page, Google's error naming another resource, as for a
/// wrong project) is a failed lookup: the running VM behind it is never
/// fenced, and the event is left for a retry.
#[tokio::test]
async fn gce_a_404_that_is_not_the_vms_own_not_found_never_fences() -> anyhow::Result<()> {
    let (_g, f, t) = setup(true, FAST).await?;
    let vm = vm_of(&t)?;
    let html = "<!DOCTYPE html><html><head><title>404 Not Found</title></head>\
                <body><h1>Not Found</h1></body></html>";
    for (how, fault) in [
        ("a bare 404", foreign_404("text/plain", "")),
        ("an HTML 404", foreign_404("text/html; charset=UTF-8", html)),
        (
            "another resource's notFound",
            Fault::gce_error(
                404,
                "notFound",
                &format!("The resource 'projects/{}' was not found", vm.project),
            ),
        ),
    ] {
        f.proxy.heal();
        f.proxy.inject(get(vm), fault, usize::MAX);
        let report = fence(&f, &t).await?;
        assert!(report.incomplete(), "{how}: left for a retry: {report:#?}");
        assert_lookup_failed(&report);
        assert!(!report.results[0].taint_applied, "{how}: {report:#?}");
        assert_untouched(&f, &t, how).await?;
    }
    Ok(())
}

/// Compute Engine's own `notFound` for the VM, through the same client and
/// proxy: the VM was deleted, so it is off and its node is fenced.
#[tokio::test]
async fn gce_a_vm_compute_engine_itself_no_longer_has_is_fenced() -> anyhow::Result<()> {
    let (_g, f, t) = setup(true, FAST).await?;
    let vm = vm_of(&t)?;
    f.fake.delete_instance(vm).await?;
    let report = fence(&f, &t).await?;
    assert!(!report.incomplete(), "{report:#?}");
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(out_of_service(&t).await?, 1);
    let looked = f.proxy.seen();
    assert!(
        looked
            .iter()
            .any(|s| s.method == Method::GET && s.path.contains(&vm.path())),
        "the VM was asked about: {looked:?}"
    );
    Ok(())
}

/// The same for a disk: a 404 that is not Compute Engine's own for that
/// disk is a failed lookup, so the fencing is retried rather than the disk
/// taken for gone and left attached; the retry detaches it.
#[tokio::test]
async fn gce_a_disk_lookup_answered_by_a_foreign_404_is_retried() -> anyhow::Result<()> {
    let (_g, f, t) = setup(false, FAST).await?;
    let vm = vm_of(&t)?;
    f.proxy.inject(
        Match::compute(Method::GET, &t.volume),
        foreign_404("text/plain", ""),
        usize::MAX,
    );
    let first = fence(&f, &t).await?;
    assert!(first.incomplete(), "left for a retry: {first:#?}");
    assert!(f.fake.detach_requests(vm).await?.is_empty());
    assert_eq!(
        f.fake.disk_users(&t.volume).await?,
        Some(vec![vm.path()]),
        "the disk stays on its VM until the retry"
    );
    retried_after_healing(&f, &t, Outcome::AlreadyFenced, 1).await
}
