//! The function under AWS's own Lambda Runtime Interface Emulator, as Lambda
//! runs it: a real deadline, a timeout that kills the process, a process
//! that dies mid-run, and the retry on a fresh process (see
//! `tests/src/rie.rs`). On the controller stack, node 2 of the seed a real
//! kubelet, its EC2 calls through a proxy that counts them (and holds the
//! ones a test picks).

use std::path::Path;
use std::time::{Duration, Instant};

use http::Method;

use node_fencer_tests::Stack;
use node_fencer_tests::cluster::{cluster_serial, cluster_stack};
use node_fencer_tests::faults::{Fault, FaultProxy, Match};
use node_fencer_tests::fixtures::{node_events, stop, volume};
use node_fencer_tests::rie::{Answer, Function, MODULE_DEFAULT_TIMEOUT_SECONDS, Rie};
use node_fencer_tests::scene::*;
use serde_json::{Value, json};

/// Bound on the workloads' move once fenced (the pod garbage collector runs every 20 s).
const RECOVERY: Duration = Duration::from_secs(75);
/// Bound on a node turning NotReady (grace period 10 s, checked every 2 s).
const NOT_READY: Duration = Duration::from_secs(40);
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

/// The emulator of the Lambda build on the controller stack, its EC2 calls
/// through `ec2` and `env` over the harness's function environment.
fn lambda_on(
    s: &Stack,
    timeout: u64,
    ec2: &FaultProxy,
    env: &[(&str, &str)],
) -> anyhow::Result<Rie> {
    bootstrap_on(s, &Function::Lambda.binary()?, timeout, ec2, env)
}

/// [`lambda_on`] with `binary` as the function.
fn bootstrap_on(
    s: &Stack,
    binary: &Path,
    timeout: u64,
    ec2: &FaultProxy,
    env: &[(&str, &str)],
) -> anyhow::Result<Rie> {
    let mut with = vec![
        ("AWS_ENDPOINT_URL", ec2.url.as_str()),
        ("NOT_READY_WAIT_SECONDS", "30"),
    ];
    with.extend_from_slice(env);
    Rie::start_binary(s, binary, timeout, &with)
}

/// The report of an answer that is one: the result for `node`.
fn result_for(answer: &Answer, node: &str) -> anyhow::Result<Value> {
    let report = answer.json()?;
    let found: Vec<&Value> = report["results"]
        .as_array()
        .map(|rs| rs.iter().filter(|r| r["node"] == node).collect())
        .unwrap_or_default();
    anyhow::ensure!(found.len() == 1, "one result for {node}: {report:#}");
    Ok(found[0].clone())
}

/// The out-of-service taints on `node` (one, once fenced).
async fn out_of_service_taints(admin: &kube::Client, node: &str) -> anyhow::Result<usize> {
    Ok(node_taints(admin, node)
        .await?
        .iter()
        .filter(|t| t.starts_with(OUT_OF_SERVICE))
        .count())
}

/// How many Events on `node` carry `reason`.
async fn events_named(admin: &kube::Client, node: &str, reason: &str) -> anyhow::Result<usize> {
    Ok(node_events(admin, node)
        .await?
        .iter()
        .filter(|(r, _)| r == reason)
        .count())
}

/// The instances each of the seed's volumes is attached to.
async fn attached(s: &Stack, seed: &Seed) -> anyhow::Result<Vec<Vec<String>>> {
    let ec2 = s.ec2().await;
    let mut out = Vec::new();
    for w in [&seed.db, &seed.app] {
        out.push(volume(&ec2, &w.volume).await?.1);
    }
    Ok(out)
}

/// Fenced once, both volumes detached once each, the workloads moved.
async fn assert_fenced_once(
    s: &Stack,
    seed: &Seed,
    proxy: &FaultProxy,
    sent: Instant,
) -> anyhow::Result<()> {
    let admin = s.admin().await?;
    let node2 = seed.node2().name.as_str();
    assert_eq!(out_of_service_taints(&admin, node2).await?, 1, "one taint");
    assert_eq!(
        events_named(&admin, node2, "OutOfServiceTaintApplied").await?,
        1,
        "one taint Event"
    );
    let instance = &seed.node2().machine.instance;
    for on in attached(s, seed).await? {
        assert!(!on.contains(instance), "off node 2's instance: {on:?}");
    }
    let rec = wait_recovered(s, seed, RECOVERY).await?;
    assert_ne!(rec.db_node, node2);
    assert_ne!(rec.app_node, node2);
    eprintln!(
        "{}: db on {}, app on {} {:?} after the first event; EC2 DetachVolume calls: {}",
        seed.namespace,
        rec.db_node,
        rec.app_node,
        sent.elapsed(),
        proxy.ec2_calls("DetachVolume")
    );
    Ok(())
}

/// Node 2 as the seed left it: Ready, untainted, its volumes attached to
/// its instance, no detach sent.
async fn assert_nothing_written(s: &Stack, proxy: &FaultProxy, seed: &Seed) -> anyhow::Result<()> {
    let admin = s.admin().await?;
    let node2 = seed.node2().name.as_str();
    assert_eq!(
        ready(&admin, node2).await?.as_deref(),
        Some("True"),
        "still Ready"
    );
    assert_eq!(out_of_service_taints(&admin, node2).await?, 0, "no taint");
    assert_eq!(proxy.ec2_calls("DetachVolume"), 0, "no detach");
    assert_eq!(
        attached(s, seed).await?,
        vec![vec![seed.node2().machine.instance.clone()]; 2],
        "both volumes still on node 2's instance"
    );
    Ok(())
}

/// Node 2's kubelet dies; once its Node is NotReady, the `stopped` event's
/// retry on `retry` (a fresh process) fences it once, with one detach per
/// volume, all of them the retry's; then the seed is taken down.
async fn fenced_by_the_retry_once_the_kubelet_died(
    s: &Stack,
    retry: &Rie,
    proxy: &FaultProxy,
    seed: &Seed,
    sent: Instant,
) -> anyhow::Result<()> {
    let admin = s.admin().await?;
    let node2 = seed.node2().name.clone();
    silence(s, seed.node2()).await?;
    wait_not_ready(&admin, std::slice::from_ref(&node2), NOT_READY).await?;
    let event = eventbridge_event(&seed.node2().machine.instance, "stopped");
    let answer = retry.invoke(&event).await?;
    assert_eq!(answer.error_type(), None, "{}", answer.body);
    assert_eq!(
        result_for(&answer, &node2)?["outcome"],
        "fenced",
        "{}",
        answer.body
    );
    assert_eq!(
        proxy.ec2_calls("DetachVolume"),
        2,
        "one detach per volume, in the retry"
    );
    assert_fenced_once(s, seed, proxy, sent).await?;
    teardown_seed(&admin, seed).await;
    Ok(())
}

/// The seed on the controller stack, and a proxy in front of moto for the
/// function's EC2 calls.
async fn seed_behind_a_proxy(
    s: &Stack,
) -> anyhow::Result<(kube::Client, FaultProxy, Seed, String)> {
    let admin = s.admin().await?;
    let proxy = FaultProxy::to_http(s.var("AWS_ENDPOINT_URL")).await?;
    let seed = seed(s).await?;
    let node2 = seed.node2().name.clone();
    Ok((admin, proxy, seed, node2))
}

/// The seed, the `stopped` event sent at the stop, under the module's
/// default timeout: the function gets the deadline Lambda would give it
/// and fences within it, in one invocation.
#[tokio::test]
async fn under_aws_runtime_the_seed_is_fenced_within_the_modules_default_timeout()
-> anyhow::Result<()> {
    fenced_in_one_invocation(&Function::Lambda.binary()?).await
}

/// The seed fenced under the module's default timeout by `binary`, in one
/// invocation of one process, one detach per volume.
pub(crate) async fn fenced_in_one_invocation(binary: &Path) -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let (admin, proxy, seed, node2) = seed_behind_a_proxy(s).await?;
    let rie = bootstrap_on(s, binary, MODULE_DEFAULT_TIMEOUT_SECONDS, &proxy, &[])?;
    kill_node2(s, &seed, false).await?;
    let sent = Instant::now();
    let answer = rie
        .invoke(&eventbridge_event(
            &seed.node2().machine.instance,
            "stopped",
        ))
        .await?;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(!answer.timed_out(), "{answer:?}");
    assert_eq!(answer.error_type(), None, "no error: {}", answer.body);
    assert_eq!(
        result_for(&answer, &node2)?["outcome"],
        "fenced",
        "{}",
        answer.body
    );
    assert!(answer.took < Duration::from_secs(MODULE_DEFAULT_TIMEOUT_SECONDS));
    // The emulator's own account: one init, the invocation reported done.
    let log = rie.log()?;
    assert_eq!(rie.inits()?, 1, "{log}");
    assert!(log.contains("INVOKE RTDONE(status: success"), "{log}");
    assert_eq!(proxy.ec2_calls("DetachVolume"), 2, "one detach per volume");
    assert_fenced_once(s, &seed, &proxy, sent).await?;
    eprintln!(
        "{}, default timeout {MODULE_DEFAULT_TIMEOUT_SECONDS} s: answered in {:?}",
        binary.display(),
        answer.took
    );
    teardown_seed(&admin, &seed).await;
    Ok(())
}

/// A timeout shorter than the wait for NotReady: node 2's instance stops
/// while its kubelet, not yet silent, keeps the Node Ready. The invocation
/// answers before its deadline, keeping its reserve, that the work is left
/// for the retry, and writes nothing. The retry, on a fresh process once
/// the kubelet has died and Kubernetes has noticed, fences once: one
/// taint, one detach per volume.
#[tokio::test]
async fn a_timeout_shorter_than_the_wait_for_not_ready_leaves_it_all_to_the_retry()
-> anyhow::Result<()> {
    // Enough for the retry's detaches (10 s each and a margin, the reserve
    // of the answer kept), less than the wait below.
    const TIMEOUT: u64 = 40;
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let (_, proxy, seed, _) = seed_behind_a_proxy(s).await?;
    // The module's default wait, longer than the timeout allows. Without
    // the fast path: moto calls the instance stopped at once while the
    // kubelet here runs on (a real stop is `stopping` until the guest is
    // down), and a kubelet heard after node-fencer saw its machine stopped
    // is taken, rightly on a real cloud, for one on another machine, whose
    // Node is refused (docs/fast-path.md, "A kubelet on another machine").
    let wait = [
        ("NOT_READY_WAIT_SECONDS", "60"),
        ("FAST_NOT_READY", "false"),
    ];
    stop(&s.ec2().await, &seed.node2().machine).await?;
    let sent = Instant::now();
    let event = eventbridge_event(&seed.node2().machine.instance, "stopped");
    let first = lambda_on(s, TIMEOUT, &proxy, &wait)?;
    let answer = first.invoke(&event).await?;
    assert!(
        !answer.timed_out(),
        "answered within its time, not killed: {answer:?}"
    );
    assert_eq!(
        answer.error_type().as_deref(),
        Some("NodeFencer.Incomplete"),
        "{}",
        answer.body
    );
    assert!(answer.took < Duration::from_secs(TIMEOUT), "{answer:?}");
    assert_nothing_written(s, &proxy, &seed).await?;
    drop(first);

    // The kubelet dies; EventBridge's retry lands on a new execution environment.
    let retry = lambda_on(s, TIMEOUT, &proxy, &wait)?;
    fenced_by_the_retry_once_the_kubelet_died(s, &retry, &proxy, &seed, sent).await
}

/// The runtime's deadline, for real, with the apiserver hanging: node 2's
/// instance stops while its kubelet keeps the Node Ready, and once the
/// invocation is waiting for NotReady, every request to the apiserver is
/// held (a hung connection). Each Kubernetes read is bounded only by its
/// attempts and retries (10 s each, 20 s in all), which would run past the
/// deadline; the invocation is cut 2 s before it instead and answers
/// `NodeFencer.OutOfTime`, having written nothing. The retry, on a fresh
/// process once the apiserver answers, the kubelet has died and the Node
/// is NotReady, fences once: one taint, one detach per volume.
#[tokio::test]
async fn an_apiserver_hanging_during_the_wait_for_not_ready_is_cut_before_the_runtime_kills()
-> anyhow::Result<()> {
    // Less than the wait below; enough for the retry's detaches.
    const TIMEOUT: u64 = 40;
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let (_, proxy, seed, _) = seed_behind_a_proxy(s).await?;
    let apiserver = FaultProxy::to_apiserver(s.var("KUBECONFIG")).await?;
    let kubeconfig = s
        .fencer_kubeconfig_file_via(&apiserver.url, "hanging")?
        .display()
        .to_string();
    // Without the fast path, as in the test above: moto calls the instance
    // stopped while the kubelet here runs on.
    let env = [
        ("NOT_READY_WAIT_SECONDS", "60"),
        ("FAST_NOT_READY", "false"),
        ("KUBECONFIG", kubeconfig.as_str()),
    ];
    stop(&s.ec2().await, &seed.node2().machine).await?;
    let sent = Instant::now();
    let event = eventbridge_event(&seed.node2().machine.instance, "stopped");
    let first = lambda_on(s, TIMEOUT, &proxy, &env)?;
    let node_reads = Match::any().method(Method::GET).path("/api/v1/nodes");
    let (answer, hung) = tokio::join!(first.invoke(&event), async {
        // The survey's read, then the wait's first look again.
        wait_until(
            "the wait for NotReady under way",
            Duration::from_secs(30),
            || async { Ok((apiserver.calls(&node_reads) >= 2).then_some(())) },
        )
        .await?;
        apiserver.inject(
            Match::any(),
            Fault::Delay(Duration::from_secs(3600)),
            usize::MAX,
        );
        anyhow::Ok(Instant::now())
    });
    let hung = hung?;
    let answer = answer?;
    assert!(
        !answer.timed_out(),
        "answered within its time, not killed: {answer:?}"
    );
    assert_eq!(
        answer.error_type().as_deref(),
        Some("NodeFencer.OutOfTime"),
        "{}",
        answer.body
    );
    assert!(
        answer.body.contains("NotReady"),
        "names the wait it was cut in: {}",
        answer.body
    );
    assert!(answer.took < Duration::from_secs(TIMEOUT), "{answer:?}");
    eprintln!(
        "answered {:?} after the apiserver hung, {:?} after the event",
        hung.elapsed(),
        answer.took
    );
    assert_nothing_written(s, &proxy, &seed).await?;
    drop(first);

    apiserver.heal();
    let retry = lambda_on(s, TIMEOUT, &proxy, &env)?;
    fenced_by_the_retry_once_the_kubelet_died(s, &retry, &proxy, &seed, sent).await
}

/// The runtime's deadline, for real: every detach reaches EC2, which
/// carries it out, but its answer is held past the function's end (a hung
/// connection). The EC2 client's own budget (30 s, its retries included)
/// would run past the deadline the detaches were started within, and the
/// emulator would kill the function mid-call; the detach is cut at the
/// deadline instead, its answer's reserve kept, and the invocation answers
/// that its work is left for the retry. The retry, on a fresh process,
/// finds the volumes detached and finishes the fencing: one taint.
#[tokio::test]
async fn a_detach_answered_past_the_deadline_is_cut_before_the_runtime_kills() -> anyhow::Result<()>
{
    // Enough to start both detaches (10 s each and a margin) after the
    // decision, less than the EC2 client's budget for the first.
    const TIMEOUT: u64 = 40;
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let (admin, proxy, seed, node2) = seed_behind_a_proxy(s).await?;
    let first = lambda_on(s, TIMEOUT, &proxy, &[])?;
    kill_node2(s, &seed, false).await?;
    wait_not_ready(&admin, std::slice::from_ref(&node2), NOT_READY).await?;
    proxy.inject(
        Match::ec2("DetachVolume"),
        Fault::ForwardThenHold(Duration::from_secs(3600)),
        usize::MAX,
    );
    let event = eventbridge_event(&seed.node2().machine.instance, "stopped");
    let sent = Instant::now();
    let answer = first.invoke(&event).await?;
    assert!(
        !answer.timed_out(),
        "answered within its time, not killed: {answer:?}"
    );
    assert_eq!(
        answer.error_type().as_deref(),
        Some("NodeFencer.Incomplete"),
        "{}",
        answer.body
    );
    assert!(answer.took < Duration::from_secs(TIMEOUT), "{answer:?}");
    assert!(
        proxy.ec2_calls("DetachVolume") >= 1,
        "the detaches were started"
    );
    assert_eq!(out_of_service_taints(&admin, &node2).await?, 1, "the taint");
    drop(first);

    proxy.heal();
    let instance = &seed.node2().machine.instance;
    let still_attached = attached(s, &seed)
        .await?
        .iter()
        .filter(|on| on.contains(instance))
        .count();
    let detaches_before = proxy.ec2_calls("DetachVolume");
    let retry = lambda_on(s, TIMEOUT, &proxy, &[])?;
    let answer = retry.invoke(&event).await?;
    assert_eq!(answer.error_type(), None, "{}", answer.body);
    assert_eq!(
        result_for(&answer, &node2)?["taint_applied"],
        false,
        "{}",
        answer.body
    );
    // EC2 carried out the first's detaches (the EC2 client may have sent
    // one again after its attempt timed out); the retry detaches only what
    // was still attached.
    assert_eq!(
        proxy.ec2_calls("DetachVolume") - detaches_before,
        still_attached,
        "the retry detached each volume still attached once, and no other"
    );
    assert_fenced_once(s, &seed, &proxy, sent).await?;
    teardown_seed(&admin, &seed).await;
    Ok(())
}

/// The execution environment lost mid-fencing: the taint on, the pods
/// deleted, the first detach sent but unanswered when the process is
/// killed. The emulator reports the process's exit; the retry, on the
/// fresh process it starts, finds the taint already on and finishes the
/// fencing (the attach/detach controller, which the taint lets detach
/// through the CSI driver, may have freed a volume meanwhile): nothing
/// lost, no second taint, the workloads moved.
#[tokio::test]
async fn an_environment_lost_mid_fencing_is_finished_by_the_retry() -> anyhow::Result<()> {
    let _g = cluster_serial().await;
    let s = cluster_stack();
    let (admin, proxy, seed, node2) = seed_behind_a_proxy(s).await?;
    let rie = lambda_on(s, MODULE_DEFAULT_TIMEOUT_SECONDS, &proxy, &[])?;
    kill_node2(s, &seed, false).await?;
    wait_not_ready(&admin, std::slice::from_ref(&node2), NOT_READY).await?;
    // Held past the test's end: the process dies waiting for it, and the
    // detach never reaches EC2.
    proxy.inject(
        Match::ec2("DetachVolume"),
        Fault::Delay(Duration::from_secs(3600)),
        1,
    );
    let event = eventbridge_event(&seed.node2().machine.instance, "stopped");
    let sent = Instant::now();
    let (answer, killed) = tokio::join!(rie.invoke(&event), async {
        wait_until(
            "the first detach held at the proxy",
            Duration::from_secs(60),
            || async { Ok((proxy.ec2_calls("DetachVolume") >= 1).then_some(())) },
        )
        .await?;
        rie.kill_function()
    });
    killed?;
    let answer = answer?;
    assert_eq!(answer.status, 502, "{answer:?}");
    assert_eq!(
        answer.error_type().as_deref(),
        Some("Runtime.ExitError"),
        "{}",
        answer.body
    );
    assert_eq!(
        out_of_service_taints(&admin, &node2).await?,
        1,
        "tainted before the loss"
    );
    assert_eq!(
        proxy.ec2_calls("DetachVolume"),
        1,
        "lost at its first detach"
    );

    let answer = rie.invoke(&event).await?;
    assert_eq!(answer.error_type(), None, "{}", answer.body);
    let result = result_for(&answer, &node2)?;
    assert_eq!(result["outcome"], "already_fenced", "{}", answer.body);
    assert_eq!(result["taint_applied"], false, "{}", answer.body);
    assert_eq!(rie.inits()?, 2, "the retry ran on a fresh process");
    assert_fenced_once(s, &seed, &proxy, sent).await?;
    teardown_seed(&admin, &seed).await;
    Ok(())
}

/// A panic ends the process in every build, as the release profile's
/// `panic = "abort"` does: the emulator reports the exit, and the next
/// event is served by a fresh process. The trigger exists only in the
/// harness's build (`test-faults`); the Lambda build refuses it as an
/// event it does not know, and serves on.
#[tokio::test]
async fn a_panic_ends_the_process_and_the_next_event_gets_a_fresh_one() -> anyhow::Result<()> {
    let s = node_fencer_tests::stack();
    let panic = json!({"node_fencer_test_fault": "panic"});
    let check = json!({"action": "check", "node": "no-such-node"});

    let harness = Rie::start(s, Function::Harness, 30, &[])?;
    let answer = harness.invoke(&panic).await?;
    assert_eq!(answer.status, 502, "{answer:?}");
    assert_eq!(
        answer.error_type().as_deref(),
        Some("Runtime.ExitError"),
        "{}",
        answer.body
    );
    assert!(
        answer.body.contains("signal: aborted"),
        "aborted, not unwound: {}",
        answer.body
    );
    let log = harness.log()?;
    assert!(
        log.lines()
            .any(|l| l.contains("\"level\":\"ERROR\"") && l.contains("a panic the test asked for")),
        "the panic logged as an error line first: {log}"
    );
    let answer = harness.invoke(&check).await?;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.error_type(), None, "{}", answer.body);
    assert_eq!(harness.inits()?, 2, "served by a fresh process");

    let lambda = Rie::start(s, Function::Lambda, 30, &[])?;
    let answer = lambda.invoke(&panic).await?;
    assert_eq!(
        answer.error_type().as_deref(),
        Some("NodeFencer.InvalidInput"),
        "{}",
        answer.body
    );
    let answer = lambda.invoke(&check).await?;
    assert_eq!(answer.error_type(), None, "{}", answer.body);
    assert_eq!(lambda.inits()?, 1, "the same process served both");
    Ok(())
}
