//! node-fencer against dependencies that misbehave: a fault proxy sits
//! between it and each of moto and the kube-apiserver and answers chosen
//! requests with throttling, 5xx, timeouts, dropped connections, lost
//! answers and outages. What must hold whatever fails: bounded retries, no
//! taint or detach for an instance not confirmed off, success only when the
//! end state holds, and a retried event converging without duplicates.

use std::time::Duration;

use tokio::sync::MutexGuard;

use http::Method;
use node_fencer::core::inbound::suspect::Intent;
use node_fencer::core::model::facts::OUT_OF_SERVICE_KEY;
use node_fencer::core::outbound::report::{Outcome, RecoveryOutcome, Report, VolumeOutcome};
use node_fencer::core::rules::decide::Skip;
use node_fencer::core::rules::retry::KUBERNETES;
use node_fencer::core::settings::policy::Policy;
use node_fencer::shell::cloud::aws::Ec2;
use node_fencer::shell::cluster::{ClusterReads, Kube};
use node_fencer::shell::connect::Timeouts;
use node_fencer_tests::faults::{Fault, FaultProxy, Match};
use node_fencer_tests::fixtures::*;
use node_fencer_tests::timing::{Span, Timeline};
use node_fencer_tests::{Stack, private_stack, serial, stack};

use crate::{by_instance, one};

/// Short timeouts, so a held request counts as a timeout within the test.
pub(crate) const FAST: Timeouts = Timeouts {
    connect: Duration::from_secs(1),
    attempt: Duration::from_secs(2),
    call: Duration::from_secs(30),
};
/// Past [`FAST`]'s attempt timeout.
pub(crate) const HANG: Duration = Duration::from_secs(4);
const DETACH_WAIT: Duration = Duration::from_secs(5);

/// node-fencer's clients, each behind its own fault proxy.
pub(crate) struct Faulty {
    /// The stack behind the proxies, for checking the end state.
    pub(crate) stack: &'static Stack,
    pub(crate) ec2: FaultProxy,
    pub(crate) kube: FaultProxy,
    pub(crate) cloud: Ec2,
    pub(crate) cluster: Kube,
}

pub(crate) async fn faulty() -> anyhow::Result<Faulty> {
    faulty_on(stack()).await
}

async fn faulty_on(s: &'static Stack) -> anyhow::Result<Faulty> {
    let ec2 = FaultProxy::to_http(s.var("AWS_ENDPOINT_URL")).await?;
    let kube = FaultProxy::to_apiserver(s.var("KUBECONFIG")).await?;
    let cloud = Ec2::new(aws_sdk_ec2::Client::new(
        &s.sdk_config_via(&ec2.url, FAST).await,
    ));
    let cluster = Kube::new(s.fencer_via(&kube.url, FAST).await?, "fault-tests");
    Ok(Faulty {
        stack: s,
        ec2,
        kube,
        cloud,
        cluster,
    })
}

type Scene = Target;

/// The serial lock (taints count against the cap), the proxied clients and a scene.
async fn setup(running: bool) -> anyhow::Result<(MutexGuard<'static, ()>, Faulty, Scene)> {
    let guard = serial().await;
    Ok((guard, faulty().await?, target(stack(), running).await?))
}

/// How many node patches reached the apiserver proxy.
fn patches(f: &Faulty) -> usize {
    f.kube
        .seen()
        .iter()
        .filter(|s| s.method == Method::PATCH)
        .count()
}

async fn fence(f: &Faulty, sc: &Scene) -> anyhow::Result<Report> {
    let batch = one(by_instance(&sc.m.instance), Intent::Fence);
    Ok(
        fence_within(&f.cloud, &f.cluster, batch, settings(), DETACH_WAIT)
            .await?
            .0,
    )
}

/// How many out-of-service taints the Node carries.
async fn oos_taints(f: &Faulty, sc: &Scene) -> anyhow::Result<usize> {
    let node = get_node(&f.stack.admin().await?, &sc.node).await?;
    Ok(node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .filter(|t| t.key == OUT_OF_SERVICE_KEY)
        .count())
}

/// How many Events of `reason` the Node carries.
async fn events(f: &Faulty, sc: &Scene, reason: &str) -> anyhow::Result<usize> {
    Ok(node_events(&f.stack.admin().await?, &sc.node)
        .await?
        .iter()
        .filter(|(r, _)| r == reason)
        .count())
}

async fn attached_to(f: &Faulty, volume_id: &str) -> anyhow::Result<Vec<String>> {
    Ok(volume(&f.stack.ec2().await, volume_id).await?.1)
}

/// The whole end state, once: tainted once, one taint Event, the volume free.
async fn assert_fenced_once(f: &Faulty, report: &Report, sc: &Scene) -> anyhow::Result<()> {
    assert!(!report.incomplete(), "{report:#?}");
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(r.volumes[0].outcome, VolumeOutcome::Detached, "{report:#?}");
    assert_eq!(oos_taints(f, sc).await?, 1);
    assert_eq!(events(f, sc, "OutOfServiceTaintApplied").await?, 1);
    assert!(attached_to(f, &sc.volume).await?.is_empty());
    Ok(())
}

/// Nothing changed for a node whose instance is not confirmed off, and no
/// write was even attempted.
async fn assert_untouched(f: &Faulty, sc: &Scene) -> anyhow::Result<()> {
    assert_eq!(oos_taints(f, sc).await?, 0);
    assert_eq!(
        attached_to(f, &sc.volume).await?,
        vec![sc.m.instance.clone()]
    );
    assert_eq!(f.ec2.ec2_calls("DetachVolume"), 0);
    assert_eq!(patches(f), 0);
    Ok(())
}

fn nodes() -> Match {
    Match::any().path("/api/v1/nodes")
}

#[tokio::test]
async fn kubernetes_throttling_and_server_errors_are_retried() -> anyhow::Result<()> {
    let (_g, f, sc) = setup(false).await?;
    f.kube.inject(
        nodes().method(Method::GET),
        Fault::kube_status(429, "TooManyRequests"),
        2,
    );
    f.kube.inject(
        nodes().method(Method::PATCH),
        Fault::kube_status(503, "ServiceUnavailable"),
        1,
    );
    f.kube.inject(
        Match::any().path("/volumeattachments"),
        Fault::kube_status(500, "InternalError"),
        1,
    );
    f.kube.inject(
        Match::any().path("/events"),
        Fault::kube_status(504, "Timeout"),
        1,
    );
    let report = fence(&f, &sc).await?;
    assert_eq!(f.kube.faults_served(), 5);
    assert_fenced_once(&f, &report, &sc).await
}

#[tokio::test]
async fn kubernetes_timeouts_and_dropped_connections_are_retried() -> anyhow::Result<()> {
    let (_g, f, sc) = setup(false).await?;
    f.kube
        .inject(nodes().method(Method::GET), Fault::Delay(HANG), 1);
    f.kube
        .inject(Match::any().path("/persistentvolumes"), Fault::Drop, 1);
    f.kube.inject(nodes().method(Method::PATCH), Fault::Drop, 1);
    let report = fence(&f, &sc).await?;
    assert_eq!(f.kube.faults_served(), 3);
    assert_fenced_once(&f, &report, &sc).await
}

#[tokio::test]
async fn a_taint_whose_answer_was_lost_is_not_applied_twice() -> anyhow::Result<()> {
    let (_g, f, sc) = setup(false).await?;
    // The patch lands, the answer does not: the retry meets 409 (the
    // resourceVersion moved), re-reads, and finds its own stamp.
    f.kube
        .inject(nodes().method(Method::PATCH), Fault::ForwardThenDrop, 1);
    f.kube
        .inject(Match::any().path("/events"), Fault::ForwardThenDrop, 1);
    let report = fence(&f, &sc).await?;
    assert!(report.results[0].taint_applied, "{report:#?}");
    assert_fenced_once(&f, &report, &sc).await?;
    assert_eq!(events(&f, &sc, "VolumesForceDetached").await?, 1);
    Ok(())
}

/// Issue 12, item 12: a Lambda retry keeps the request id. The first
/// attempt taints but cannot record its Event; the retries under the same id
/// record it, once.
#[tokio::test]
async fn a_retried_invocation_records_its_taint_event_once() -> anyhow::Result<()> {
    let (_g, f, sc) = setup(false).await?;
    let request = unique("request");
    let batch = || one(by_instance(&sc.m.instance), Intent::Fence);
    f.kube.inject(
        Match::any().path("/events"),
        Fault::kube_status(403, "Forbidden"),
        usize::MAX,
    );
    let (first, _) = run_as(&f.cloud, &f.cluster, batch(), &settings(), &request).await?;
    assert!(first.results[0].taint_applied, "{first:#?}");
    assert_eq!(events(&f, &sc, "OutOfServiceTaintApplied").await?, 0);
    f.kube.heal();
    for _ in 0..2 {
        let (again, _) = run_as(&f.cloud, &f.cluster, batch(), &settings(), &request).await?;
        assert!(!again.incomplete(), "{again:#?}");
        assert_eq!(events(&f, &sc, "OutOfServiceTaintApplied").await?, 1);
    }
    assert_eq!(oos_taints(&f, &sc).await?, 1);
    Ok(())
}

/// Issue 12, item 12: the patch that ends a fencing lands and its answer is
/// lost. The repeat meets 409 and finds the mark gone: that is this
/// recovery's own write, reported and recorded as the end of the fencing.
#[tokio::test]
async fn a_recovery_whose_answer_was_lost_is_recorded() -> anyhow::Result<()> {
    let (_g, f, sc) = setup(false).await?;
    assert_fenced_once(&f, &fence(&f, &sc).await?, &sc).await?;
    let admin = f.stack.admin().await?;
    start_instance(&f.stack.ec2().await, &sc.m).await?;
    set_ready(&admin, &sc.node, "True").await?;
    delete_vas_of(&admin, &sc.node).await?;
    f.kube.inject(
        Match::any()
            .path(&format!("/api/v1/nodes/{}", sc.node))
            .method(Method::PATCH),
        Fault::ForwardThenDrop,
        1,
    );
    let batch = one(by_instance(&sc.m.instance), Intent::Recover);
    let (report, _) = run_as(&f.cloud, &f.cluster, batch, &settings(), &unique("t")).await?;
    let r = &report.recoveries[0];
    assert_eq!(r.outcome, RecoveryOutcome::Recovered, "{report:#?}");
    assert!(r.taint_removed, "{report:#?}");
    assert_eq!(f.kube.faults_served(), 1, "the answer was lost once");
    assert_eq!(oos_taints(&f, &sc).await?, 0);
    assert_eq!(events(&f, &sc, "OutOfServiceTaintRemoved").await?, 1);
    Ok(())
}

#[tokio::test]
async fn an_apiserver_outage_mid_run_is_ridden_out() -> anyhow::Result<()> {
    let (_g, f, sc) = setup(false).await?;
    // From the taint patch on, every connection is dropped for 4 s, as while
    // the apiserver restarts; the pauses of the Kubernetes policy outlast it.
    f.kube.inject(
        nodes().method(Method::PATCH),
        Fault::Outage(Duration::from_secs(4)),
        1,
    );
    let report = fence(&f, &sc).await?;
    assert!(f.kube.faults_served() >= 2, "{:?}", f.kube.seen());
    assert_fenced_once(&f, &report, &sc).await
}

#[tokio::test]
async fn a_kubernetes_failure_that_outlasts_the_retries_fails_before_any_detach()
-> anyhow::Result<()> {
    let (_g, f, sc) = setup(false).await?;
    f.kube.inject(
        nodes().method(Method::PATCH),
        Fault::kube_status(503, "ServiceUnavailable"),
        usize::MAX,
    );
    let report = fence(&f, &sc).await?;
    assert!(report.incomplete(), "{report:#?}");
    assert_eq!(report.results[0].outcome, Outcome::Failed);
    assert_eq!(
        patches(&f),
        KUBERNETES.max_attempts as usize,
        "bounded retries"
    );
    // No taint, so no detach: the volume stays where it was.
    assert_eq!(oos_taints(&f, &sc).await?, 0);
    assert_eq!(f.ec2.ec2_calls("DetachVolume"), 0);
    assert_eq!(
        attached_to(&f, &sc.volume).await?,
        vec![sc.m.instance.clone()]
    );
    Ok(())
}

/// Issue 12, item 7: the Lease write used to retry every 100 ms until the
/// function timed out.
#[tokio::test]
async fn a_lease_write_that_keeps_failing_is_bounded_like_every_call() -> anyhow::Result<()> {
    let (_g, f, sc) = setup(false).await?;
    for method in [Method::POST, Method::PUT] {
        f.kube.inject(
            Match::any().method(method).path("/leases"),
            Fault::kube_status(503, "ServiceUnavailable"),
            usize::MAX,
        );
    }
    let started = std::time::Instant::now();
    let result = fence(&f, &sc).await;
    assert!(result.is_err(), "the Lease could not be taken: {result:?}");
    let writes = f
        .kube
        .seen()
        .iter()
        .filter(|s| s.path.contains("/leases") && matches!(s.method, Method::POST | Method::PUT))
        .count();
    assert_eq!(writes, KUBERNETES.max_attempts as usize, "bounded retries");
    // At most a wait for another holder's Lease to expire, then one bounded call.
    let bound = node_fencer::core::rules::control::LEASE_WAIT + KUBERNETES.budget;
    assert!(
        started.elapsed() < bound,
        "gave up after {:?}",
        started.elapsed()
    );
    assert_eq!(oos_taints(&f, &sc).await?, 0);
    assert_eq!(f.ec2.ec2_calls("DetachVolume"), 0);
    Ok(())
}

#[tokio::test]
async fn ec2_throttling_server_errors_and_timeouts_are_retried() -> anyhow::Result<()> {
    let (_g, f, sc) = setup(false).await?;
    f.ec2
        .inject(Match::ec2("DescribeInstances"), Fault::ec2_throttled(), 2);
    f.ec2
        .inject(Match::ec2("DescribeVolumes"), Fault::Delay(HANG), 1);
    f.ec2.inject(
        Match::ec2("DetachVolume"),
        Fault::ec2_error(500, "InternalError", "An internal error has occurred."),
        1,
    );
    let report = fence(&f, &sc).await?;
    assert_eq!(f.ec2.faults_served(), 4);
    assert_fenced_once(&f, &report, &sc).await
}

#[tokio::test]
async fn a_detach_whose_answer_was_lost_is_verified_not_repeated_blindly() -> anyhow::Result<()> {
    let (_g, f, sc) = setup(false).await?;
    // The detach lands and its answer is lost; the SDK's retry meets
    // "not attached", which the pipeline checks against DescribeVolumes.
    f.ec2
        .inject(Match::ec2("DetachVolume"), Fault::ForwardThenDrop, 1);
    let report = fence(&f, &sc).await?;
    assert_eq!(f.ec2.ec2_calls("DetachVolume"), 2);
    assert_fenced_once(&f, &report, &sc).await
}

#[tokio::test]
async fn a_volume_detached_by_someone_else_in_between_is_done() -> anyhow::Result<()> {
    let (_g, f, sc) = setup(false).await?;
    f.ec2.inject(
        Match::ec2("DetachVolume"),
        Fault::Delay(Duration::from_millis(1500)),
        1,
    );
    let other = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Wait until node-fencer's detach is held at the proxy, then beat it.
        while f.ec2.ec2_calls("DetachVolume") == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        f.stack
            .ec2()
            .await
            .detach_volume()
            .volume_id(&sc.volume)
            .instance_id(&sc.m.instance)
            .force(true)
            .send()
            .await
    };
    let (report, theirs) = tokio::join!(fence(&f, &sc), other);
    theirs?;
    let report = report?;
    assert_fenced_once(&f, &report, &sc).await
}

#[tokio::test]
async fn incorrect_state_on_detach_is_not_taken_for_success() -> anyhow::Result<()> {
    let (_g, f, sc) = setup(false).await?;
    // EC2 says the volume is in the wrong state, but it is still attached:
    // the report must not call it done, and the retried event must finish.
    f.ec2.inject(
        Match::ec2("DetachVolume"),
        Fault::ec2_error(400, "IncorrectState", "Volume is in the 'detaching' state."),
        1,
    );
    let report = fence(&f, &sc).await?;
    assert!(report.incomplete(), "{report:#?}");
    assert_eq!(report.results[0].outcome, Outcome::Failed);
    assert_eq!(report.results[0].volumes[0].outcome, VolumeOutcome::Stuck);
    assert_eq!(
        attached_to(&f, &sc.volume).await?,
        vec![sc.m.instance.clone()]
    );
    let again = fence(&f, &sc).await?;
    assert!(!again.incomplete(), "{again:#?}");
    assert_eq!(again.results[0].outcome, Outcome::AlreadyFenced);
    assert!(attached_to(&f, &sc.volume).await?.is_empty());
    assert_eq!(oos_taints(&f, &sc).await?, 1);
    Ok(())
}

#[tokio::test]
async fn partial_progress_converges_on_the_retried_event_without_duplicates() -> anyhow::Result<()>
{
    let (_g, f, sc) = setup(false).await?;
    // The taint lands; every detach of this volume fails past the SDK's retries.
    f.ec2.inject(
        Match::ec2("DetachVolume").body(&sc.volume),
        Fault::ec2_error(503, "Unavailable", "The service is unavailable."),
        usize::MAX,
    );
    let first = fence(&f, &sc).await?;
    assert!(first.incomplete(), "{first:#?}");
    assert_eq!(first.results[0].outcome, Outcome::Failed);
    assert!(first.results[0].taint_applied);
    assert_eq!(first.results[0].volumes[0].outcome, VolumeOutcome::Failed);
    let attempts = f.ec2.ec2_calls("DetachVolume");
    assert_eq!(
        attempts,
        node_fencer::core::rules::retry::EC2.max_attempts as usize
    );
    // The same event again, as Lambda retries it, once EC2 is healthy.
    f.ec2.heal();
    let second = fence(&f, &sc).await?;
    assert!(!second.incomplete(), "{second:#?}");
    assert_eq!(second.results[0].outcome, Outcome::AlreadyFenced);
    assert_eq!(
        second.results[0].volumes[0].outcome,
        VolumeOutcome::Detached
    );
    assert_eq!(f.ec2.ec2_calls("DetachVolume"), attempts + 1);
    assert_eq!(oos_taints(&f, &sc).await?, 1);
    assert_eq!(events(&f, &sc, "OutOfServiceTaintApplied").await?, 1);
    assert_eq!(events(&f, &sc, "VolumesForceDetached").await?, 1);
    assert!(attached_to(&f, &sc.volume).await?.is_empty());
    // And once more: nothing left to do, nothing sent.
    let third = fence(&f, &sc).await?;
    assert!(!third.incomplete(), "{third:#?}");
    assert_eq!(f.ec2.ec2_calls("DetachVolume"), attempts + 1);
    Ok(())
}

#[tokio::test]
async fn nothing_is_fenced_for_a_running_instance_whatever_fails() -> anyhow::Result<()> {
    let (_g, f, sc) = setup(true).await?;
    f.ec2
        .inject(Match::ec2("DescribeInstances"), Fault::ec2_throttled(), 1);
    f.ec2
        .inject(Match::ec2("DescribeInstances"), Fault::Drop, 1);
    f.kube
        .inject(nodes(), Fault::kube_status(429, "TooManyRequests"), 1);
    let report = fence(&f, &sc).await?;
    assert_eq!(report.results[0].outcome, Outcome::Skipped, "{report:#?}");
    let skip = report.results[0].skip.as_ref().map(|s| s.code());
    assert_eq!(skip, Some("instance_not_off"), "{report:#?}");
    assert_untouched(&f, &sc).await
}

#[tokio::test]
async fn an_unanswerable_confirmation_fences_nothing() -> anyhow::Result<()> {
    let (_g, f, sc) = setup(false).await?;
    // The instance is stopped, but EC2 cannot say so: no confirmation, no fence.
    f.ec2.inject(
        Match::ec2("DescribeInstances"),
        Fault::ec2_throttled(),
        usize::MAX,
    );
    let report = fence(&f, &sc).await?;
    assert!(report.incomplete(), "{report:#?}");
    assert_ne!(report.results[0].outcome, Outcome::Fenced);
    assert_untouched(&f, &sc).await?;
    // An answer that parses but says nothing (an empty 200) is no confirmation either.
    f.ec2.heal();
    f.ec2.inject(
        Match::ec2("DescribeInstances"),
        Fault::Respond {
            status: 200,
            content_type: "text/xml",
            body: "<DescribeInstancesResponse/>".into(),
        },
        1,
    );
    let report = fence(&f, &sc).await?;
    assert_ne!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert_untouched(&f, &sc).await
}

#[tokio::test]
async fn a_real_apiserver_restart_mid_run_is_ridden_out() -> anyhow::Result<()> {
    // A stack of its own: the restart would disturb the other tests.
    let p: &'static Stack = Box::leak(Box::new(
        tokio::task::spawn_blocking(|| private_stack("restart")).await??,
    ));
    let f = faulty_on(p).await?;
    let sc = target(p, false).await?;
    // The taint patch is held for a second at the proxy; meanwhile the
    // apiserver process is stopped and started again.
    f.kube.inject(
        nodes().method(Method::PATCH),
        Fault::Delay(Duration::from_secs(1)),
        1,
    );
    let restart = async {
        while patches(&f) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::task::spawn_blocking(move || p.restart("kube-apiserver")).await?
    };
    let (first, restarted) = tokio::join!(fence(&f, &sc), restart);
    restarted?;
    let mut report = first?;
    // What is left undone fails the invocation, and Lambda sends the event
    // again. A restarted apiserver answers 403 until its RBAC caches are
    // filled; a 403 is not retried within a call (it is final on a healthy
    // apiserver), so here the first invocation fails and the second finishes.
    let mut invocations = 1;
    while report.incomplete() && invocations < 4 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        report = fence(&f, &sc).await?;
        invocations += 1;
    }
    assert!(
        !report.incomplete(),
        "not converged after {invocations} invocations: {report:#?}"
    );
    assert_eq!(oos_taints(&f, &sc).await?, 1);
    let applied = events(&f, &sc, "OutOfServiceTaintApplied").await?;
    assert!(applied <= 1, "{applied} taint Events");
    assert!(attached_to(&f, &sc.volume).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn the_version_is_asked_once_and_the_lease_released_without_a_read() -> anyhow::Result<()> {
    let (_g, f, sc) = setup(false).await?;
    // By the end of the path: the census Lease, read first, is another.
    let requests = |f: &Faulty, method: Method, end: &str| {
        f.kube
            .seen()
            .iter()
            .filter(|s| s.method == method && s.path.split('?').next().unwrap_or("").ends_with(end))
            .count()
    };
    let calls = Timeline::new();
    let (cloud, cluster) = calls.wrap(&f.cloud, &f.cluster);
    let batch = one(by_instance(&sc.m.instance), Intent::Fence);
    let report = fence_within(&cloud, &cluster, batch, settings(), DETACH_WAIT)
        .await?
        .0;
    assert_fenced_once(&f, &report, &sc).await?;
    assert_eq!(requests(&f, Method::GET, "/version"), 1);
    // Taken (a read, a write: create or replace), renewed if the run took
    // long (a write each, from the Lease as last written), released (a
    // write only).
    assert_eq!(requests(&f, Method::GET, "/leases/node-fencer"), 1);
    let writes =
        requests(&f, Method::PUT, "/leases/node-fencer") + requests(&f, Method::POST, "/leases");
    assert_eq!(writes, 2 + calls.count("RenewLease"), "{:?}", f.kube.seen());

    // Another handle sharing the cache, as the next invocation of the same
    // execution environment does: no second question.
    let cache = std::sync::Arc::new(tokio::sync::OnceCell::new());
    let first =
        Kube::new(f.stack.fencer_via(&f.kube.url, FAST).await?, "t").sharing_version(cache.clone());
    let second =
        Kube::new(f.stack.fencer_via(&f.kube.url, FAST).await?, "t").sharing_version(cache);
    let before = requests(&f, Method::GET, "/version");
    assert_eq!(
        first.server_version().await?,
        second.server_version().await?
    );
    assert_eq!(requests(&f, Method::GET, "/version"), before + 1);
    Ok(())
}

/// EC2's answer for one instance stopped by hibernation, as EC2 writes it;
/// the SDK parses it as it parses any answer.
fn hibernated_answer(instance: &str) -> Fault {
    Fault::Respond {
        status: 200,
        content_type: "text/xml;charset=UTF-8",
        body: format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
             <DescribeInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\
             <requestId>fault-proxy</requestId><reservationSet><item>\
             <reservationId>r-0123456789abcdef0</reservationId><ownerId>123456789012</ownerId>\
             <instancesSet><item><instanceId>{instance}</instanceId>\
             <instanceState><code>80</code><name>stopped</name></instanceState>\
             <stateReason><code>Client.UserInitiatedHibernate</code>\
             <message>Client.UserInitiatedHibernate: User initiated hibernate</message></stateReason>\
             <hibernationOptions><configured>true</configured></hibernationOptions>\
             <rootDeviceName>/dev/xvda</rootDeviceName></item></instancesSet>\
             </item></reservationSet></DescribeInstancesResponse>"
        ),
    }
}

/// Issue 12, item 2: a hibernated instance says `stopped`, and resumes from
/// RAM when started; it is not fenced unless FENCE_HIBERNATED says so.
#[tokio::test]
async fn a_hibernated_instance_is_not_fenced_unless_the_setting_says_so() -> anyhow::Result<()> {
    let (_g, f, sc) = setup(false).await?;
    f.ec2.inject(
        Match::ec2("DescribeInstances"),
        hibernated_answer(&sc.m.instance),
        usize::MAX,
    );
    let report = fence(&f, &sc).await?;
    let r = &report.results[0];
    assert_eq!(r.skip, Some(Skip::Hibernated), "{report:#?}");
    assert_eq!(
        r.instance_state.as_ref().map(|s| s.name()),
        Some("hibernated")
    );
    assert!(!report.incomplete(), "nothing a retry could change");
    assert_untouched(&f, &sc).await?;

    let batch = one(by_instance(&sc.m.instance), Intent::Fence);
    let anyway = Policy {
        fence_hibernated: true,
        ..settings()
    };
    let (report, _) = fence_within(&f.cloud, &f.cluster, batch, anyway, DETACH_WAIT).await?;
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(oos_taints(&f, &sc).await?, 1);
    Ok(())
}

/// Patient enough for an EC2 answer held for [`HOLDER_SLOWED`].
const PATIENT: Timeouts = Timeouts {
    connect: Duration::from_secs(1),
    attempt: Duration::from_secs(40),
    call: Duration::from_secs(60),
};
/// How long the holder's confirmation under the Lease is held: past the
/// Lease's duration (20 s), within the other invocation's wait for it (30 s).
const HOLDER_SLOWED: Duration = Duration::from_secs(24);

/// Issue 12, item 6: the invocation holding the fencing Lease is slowed past
/// the Lease's duration (its EC2 confirmation under the Lease is held 24 s),
/// while a second invocation, sure there is room under the cap, waits for
/// the Lease. The holder renews it, so the second one cannot take it over
/// early; when it gets it, the recount finds the holder's taint and
/// refuses. The cap holds: one new taint.
#[tokio::test]
async fn the_cap_holds_when_the_lease_holder_is_slowed_past_the_lease() -> anyhow::Result<()> {
    let _g = serial().await;
    let s = stack();
    let f = faulty().await?;
    let admin = s.admin().await?;
    let a = target(s, false).await?;
    let b = target(s, false).await?;
    let before = room_taken(s).await?;
    let policy = Policy {
        max_out_of_service: before + 1,
        ..settings()
    };
    let go = std::sync::Arc::new(tokio::sync::Notify::new());
    // The second invocation, on its own clients, once the holder holds.
    let second_calls = Timeline::new();
    let (second_cloud, second_cluster) = (
        Ec2::new(s.ec2().await),
        Kube::new(s.fencer().await?, "second"),
    );
    let second = async {
        go.notified().await;
        let (cloud, cluster) = second_calls.wrap(&second_cloud, &second_cluster);
        let batch = one(by_instance(&b.m.instance), Intent::Fence);
        fence_with(&cloud, &cluster, batch, policy.clone()).await
    };
    let holder_cloud = Ec2::new(aws_sdk_ec2::Client::new(
        &s.sdk_config_via(&f.ec2.url, PATIENT).await,
    ));
    let calls = Timeline::new();
    let ec2 = std::sync::Arc::new(f.ec2);
    {
        let (ec2, go) = (ec2.clone(), go.clone());
        calls.after(
            "AcquireLease",
            Box::new(move || {
                // The next confirmation, the one under the Lease, is slow.
                ec2.inject(
                    Match::ec2("DescribeInstances"),
                    Fault::Delay(HOLDER_SLOWED),
                    1,
                );
                go.notify_one();
                Box::pin(async {})
            }),
        );
    }
    let (cloud, cluster) = calls.wrap(&holder_cloud, &f.cluster);
    let batch = one(by_instance(&a.m.instance), Intent::Fence);
    let (first, second) = tokio::join!(fence_with(&cloud, &cluster, batch, policy.clone()), second);
    let (first, second) = (first?, second?);
    let second_calls = second_calls.spans();

    let span = |spans: &[Span], op: &str| spans.iter().find(|x| x.op == op).cloned();
    let spans = calls.spans();
    let (Some(took), Some(released)) = (span(&spans, "AcquireLease"), span(&spans, "ReleaseLease"))
    else {
        anyhow::bail!("the holder never took and released the Lease: {spans:#?}");
    };
    let held = released.start - took.end;
    let renewals = spans
        .iter()
        .filter(|x| x.op == "RenewLease" && x.ok)
        .count();
    let waited = span(&second_calls, "AcquireLease").map(|x| x.end - x.start);
    let after = room_taken(s).await?;
    eprintln!(
        "slow holder: held the Lease {:.1} s (Lease duration {} s), {renewals} renewals; \
         the second invocation waited {:.1} s for it; out of service {before} -> {after}, cap {}",
        held.as_secs_f64(),
        node_fencer::core::rules::control::LEASE_SECONDS,
        waited.unwrap_or_default().as_secs_f64(),
        before + 1
    );
    assert_eq!(first.results[0].outcome, Outcome::Fenced, "{first:#?}");
    assert!(
        held > Duration::from_secs(20),
        "the holder was slowed past the Lease's duration: {held:?}"
    );
    assert!(renewals >= 4, "{renewals} renewals in {held:?}");
    assert!(
        matches!(second.results[0].skip, Some(Skip::CapReached { .. })),
        "{second:#?}"
    );
    assert_eq!(after, before + 1, "the cap holds");
    assert!(!taints(&get_node(&admin, &b.node).await?).contains(&OUT_OF_SERVICE.into()));
    // Released, not left to expire: the last renewal is finished before the
    // release, which would otherwise meet a moved resourceVersion.
    let lease = kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        admin.clone(),
        &policy.control_namespace,
    )
    .get(node_fencer::core::rules::control::OBJECT_NAME)
    .await?;
    let holder = lease.spec.and_then(|s| s.holder_identity);
    assert_eq!(holder, None, "the Lease is free after both invocations");
    assert_eq!(volume(&s.ec2().await, &b.volume).await?.0, "in-use");
    Ok(())
}

/// Issue 15: a power-off EC2 accepts and that never completes (the proxy
/// answers the stop; moto never sees it, as if the instance hung in
/// `stopping`): nothing is tainted or detached and the invocation reports
/// work left. Once the stop completes, late, the retry fences the node
/// without stopping it a second time.
#[tokio::test]
async fn a_power_off_that_never_completes_fails_for_retry_and_never_taints() -> anyhow::Result<()> {
    use node_fencer::core::rules::power::{ActiveFencing, PowerOutcome};
    let (_g, f, sc) = setup(true).await?;
    let accepted = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<StopInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\
         <requestId>fault-proxy</requestId><instancesSet><item><instanceId>{}</instanceId>\
         <currentState><code>64</code><name>stopping</name></currentState>\
         <previousState><code>16</code><name>running</name></previousState></item></instancesSet>\
         </StopInstancesResponse>",
        sc.m.instance
    );
    f.ec2.inject(
        Match::ec2("StopInstances"),
        Fault::Respond {
            status: 200,
            content_type: "text/xml;charset=UTF-8",
            body: accepted,
        },
        1,
    );
    let active = Policy {
        active_fencing: Some(ActiveFencing {
            wait: Duration::from_secs(3),
            // The bare stack's other tests leave NotReady Nodes about.
            partition_percent: 100,
            ..ActiveFencing::default()
        }),
        ..settings()
    };
    let power_off = || {
        let batch = one(by_instance(&sc.m.instance), Intent::PowerOff);
        fence_within(&f.cloud, &f.cluster, batch, active.clone(), DETACH_WAIT)
    };
    let (report, _) = power_off().await?;
    let power = report.results[0]
        .power_off
        .clone()
        .expect("a power-off report");
    assert_eq!(power.outcome, PowerOutcome::StopPending, "{report:#?}");
    assert!(report.incomplete(), "{report:#?}");
    assert_eq!(oos_taints(&f, &sc).await?, 0);
    assert_eq!(
        attached_to(&f, &sc.volume).await?,
        vec![sc.m.instance.clone()]
    );
    assert_eq!(f.ec2.ec2_calls("DetachVolume"), 0);

    // The stop completes late; the retry fences without a second stop.
    stop(&f.stack.ec2().await, &sc.m).await?;
    let (again, _) = power_off().await?;
    assert_eq!(again.results[0].outcome, Outcome::Fenced, "{again:#?}");
    assert!(again.results[0].power_off.is_none(), "{again:#?}");
    assert_eq!(f.ec2.ec2_calls("StopInstances"), 1);
    assert_eq!(oos_taints(&f, &sc).await?, 1);
    Ok(())
}

/// Issue 33, item 9: two power-offs with room for one. The holder's
/// confirmation under the Lease is held past the Lease's duration; a second
/// invocation, sure there is room, waits for the Lease meanwhile. The holder
/// renews the Lease all along and marks its Node before the stop, so the
/// second one, when it gets the Lease, counts that power-off in flight and
/// refuses its own: one machine stopped, the cap held.
#[tokio::test]
async fn two_power_offs_with_room_for_one_stop_one_machine() -> anyhow::Result<()> {
    use node_fencer::core::rules::power::{ActiveFencing, PowerOutcome};
    let _g = serial().await;
    let s = stack();
    let f = faulty().await?;
    let (a, b) = (target(s, true).await?, target(s, true).await?);
    let before = room_taken(s).await?;
    let policy = Policy {
        max_out_of_service: before + 1,
        active_fencing: Some(ActiveFencing {
            wait: Duration::from_secs(20),
            // The bare stack's other tests leave NotReady Nodes about.
            partition_percent: 100,
            ..ActiveFencing::default()
        }),
        ..settings()
    };
    let go = std::sync::Arc::new(tokio::sync::Notify::new());
    let (second_cloud, second_cluster) = (
        Ec2::new(s.ec2().await),
        Kube::new(s.fencer().await?, "second"),
    );
    let second = async {
        go.notified().await;
        let batch = one(by_instance(&b.m.instance), Intent::PowerOff);
        fence_with(&second_cloud, &second_cluster, batch, policy.clone()).await
    };
    let holder_cloud = Ec2::new(aws_sdk_ec2::Client::new(
        &s.sdk_config_via(&f.ec2.url, PATIENT).await,
    ));
    let calls = Timeline::new();
    let ec2 = std::sync::Arc::new(f.ec2);
    {
        let (ec2, go) = (ec2.clone(), go.clone());
        calls.after(
            "AcquireLease",
            Box::new(move || {
                // The look under the Lease, right before the stop, is slow.
                ec2.inject(
                    Match::ec2("DescribeInstances"),
                    Fault::Delay(HOLDER_SLOWED),
                    1,
                );
                go.notify_one();
                Box::pin(async {})
            }),
        );
    }
    let (cloud, cluster) = calls.wrap(&holder_cloud, &f.cluster);
    let batch = one(by_instance(&a.m.instance), Intent::PowerOff);
    let (first, second) = tokio::join!(fence_with(&cloud, &cluster, batch, policy.clone()), second);
    let (first, second) = (first?, second?);
    let spans = calls.spans();
    let renewals = spans
        .iter()
        .filter(|x| x.op == "RenewLease" && x.ok)
        .count();
    let ec2 = s.ec2().await;
    let states = (
        machine_state(&ec2, &a.m).await?,
        machine_state(&ec2, &b.m).await?,
    );
    eprintln!(
        "power-off race: the holder renewed the Lease {renewals} times; machines {states:?}; \
         the second invocation: {:?}",
        second.results[0]
            .power_off
            .as_ref()
            .map(|p| p.reason.clone())
    );
    let power = |r: &Report| r.results[0].power_off.clone().expect("a power-off report");
    assert_eq!(power(&first).outcome, PowerOutcome::Stopped, "{first:#?}");
    assert!(renewals >= 4, "{renewals} renewals");
    assert_eq!(
        power(&second).refusal.as_ref().map(|r| r.code()),
        Some("cap_reached"),
        "{second:#?}"
    );
    assert_eq!(states.1, "running", "the second machine runs on");
    Ok(())
}
