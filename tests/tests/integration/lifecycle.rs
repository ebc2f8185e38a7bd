//! The whole node lifecycle through the real binary under `cargo lambda
//! watch`, on a stack of its own (its cap, Lease and kill switch are not
//! shared with the other tests): recovery of what node-fencer fenced, the
//! legacy mode, the kill switch, the cap across concurrent invocations, the
//! second confirmation and the preflight check.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::Context;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use node_fencer::core::model::facts::{OUT_OF_SERVICE_EFFECT, OUT_OF_SERVICE_KEY};
use node_fencer_tests::cluster::{restore_rbac, wait_for_rbac};
use node_fencer_tests::fixtures::*;
use node_fencer_tests::lambda::{Emulator, Invocation, start_emulator};
use node_fencer_tests::scene::eventbridge_event;
use node_fencer_tests::{Stack, private_stack};
use serde_json::{Value, json};
use tokio::sync::MutexGuard;

const SETTLE: &str = "2";

/// The stack of these tests, started on first use.
async fn lifecycle_stack() -> &'static Stack {
    static STACK: tokio::sync::OnceCell<Stack> = tokio::sync::OnceCell::const_new();
    STACK
        .get_or_init(|| async {
            tokio::task::spawn_blocking(|| private_stack("lifecycle"))
                .await
                .expect("the set-up thread")
                .unwrap_or_else(|e| panic!("the lifecycle stack did not start: {e:#}"))
        })
        .await
}

/// These tests share their stack's cap, Lease and kill switch: one at a time.
async fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// An emulator on the lifecycle stack with `overrides`, started once per
/// distinct configuration `key`.
fn emulator(
    s: &'static Stack,
    key: usize,
    overrides: &'static [(&'static str, &'static str)],
) -> &'static Emulator {
    static EMULATORS: [OnceLock<Result<Emulator, String>>; 6] = [const { OnceLock::new() }; 6];
    match EMULATORS[key].get_or_init(|| start_emulator(s, overrides).map_err(|e| format!("{e:#}")))
    {
        Ok(e) => e,
        Err(e) => panic!("cargo lambda watch is not available: {e}"),
    }
}

/// Default mode (auto), a short settle delay.
const PLAIN: (usize, &[(&str, &str)]) = (0, &[("RECOVERY_SETTLE_SECONDS", SETTLE)]);
/// The legacy recipe.
const LEGACY: (usize, &[(&str, &str)]) = (
    1,
    &[
        ("FENCING_MODE", "legacy"),
        ("RECOVERY_SETTLE_SECONDS", SETTLE),
    ],
);
/// A cap of two and a second confirmation three seconds after the first:
/// four functions of their own, as four concurrent Lambda environments.
const CAPPED: [(usize, &[(&str, &str)]); 4] = {
    const ENV: &[(&str, &str)] = &[
        ("MAX_OUT_OF_SERVICE", "2"),
        ("CONFIRM_AGAIN_AFTER_SECONDS", "3"),
    ];
    [(2, ENV), (3, ENV), (4, ENV), (5, ENV)]
};

async fn start(
    s: &'static Stack,
    config: (usize, &'static [(&'static str, &'static str)]),
) -> &'static Emulator {
    tokio::task::spawn_blocking(move || emulator(s, config.0, config.1))
        .await
        .expect("the emulator thread")
}

async fn invoke(emu: &'static Emulator, event: Value) -> anyhow::Result<Invocation> {
    tokio::task::spawn_blocking(move || emu.invoke(&event)).await?
}

/// The report of an invocation, whether it succeeded or asked for a retry.
fn report(out: &Invocation) -> Value {
    let text = out.output.trim();
    // An error's message carries the summary, not the report: keep it readable.
    serde_json::from_str(text).unwrap_or_else(|_| json!({"error": text}))
}

fn annotations(node: &Node) -> Vec<String> {
    node.metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("node-fencer.io/"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

fn recovery<'a>(report: &'a Value, node: &str) -> &'a Value {
    let found: Vec<&Value> = report["recoveries"]
        .as_array()
        .map(|r| r.iter().filter(|r| r["node"] == json!(node)).collect())
        .unwrap_or_default();
    assert_eq!(found.len(), 1, "one recovery entry for {node}: {report:#}");
    found[0]
}

fn running(id: &str) -> Value {
    eventbridge_event(id, "running")
}

fn stopped(id: &str) -> Value {
    eventbridge_event(id, "stopped")
}

/// Fences a stopped target through `emu` and checks the mark.
async fn fenced_target(s: &'static Stack, emu: &'static Emulator) -> anyhow::Result<Target> {
    let t = target(s, false).await?;
    let out = invoke(emu, stopped(&t.m.instance)).await?;
    assert!(!out.error, "{}", out.output);
    let r = report(&out);
    assert_eq!(r["results"][0]["outcome"], "fenced", "{r:#}");
    Ok(t)
}

#[tokio::test]
async fn recovery_ends_only_its_own_fencing_once_running_ready_detached_and_settled()
-> anyhow::Result<()> {
    let s = lifecycle_stack().await;
    let _g = exclusive().await;
    let emu = start(s, PLAIN).await;
    let (admin, ec2) = (s.admin().await?, s.ec2().await);
    let t = fenced_target(s, emu).await?;
    let node = get_node(&admin, &t.node).await?;
    let marks = annotations(&node);
    assert!(
        marks.contains(&"node-fencer.io/mode=taint".to_owned()),
        "{marks:?}"
    );
    assert!(
        marks.contains(&format!("node-fencer.io/volumes={}", t.volume)),
        "{marks:?}"
    );

    // The event says `running`, EC2 says `stopped`: the fencing stays, and
    // nothing is left to retry (the node is still dead).
    let out = invoke(emu, running(&t.m.instance)).await?;
    assert!(!out.error, "{}", out.output);
    let r = report(&out);
    assert_eq!(
        recovery(&r, &t.node)["hold"]["code"],
        "instance_not_running",
        "{r:#}"
    );
    assert!(taints(&get_node(&admin, &t.node).await?).contains(&OUT_OF_SERVICE.into()));

    // Running, but the Node is not Ready yet: wait (a retry is asked for).
    start_instance(&ec2, &t.m).await?;
    let out = invoke(emu, running(&t.m.instance)).await?;
    assert!(
        out.error,
        "a recovery on its way asks for a retry: {}",
        out.output
    );
    assert!(
        out.output.contains("NodeFencer.Incomplete"),
        "{}",
        out.output
    );
    assert!(taints(&get_node(&admin, &t.node).await?).contains(&OUT_OF_SERVICE.into()));

    // Ready, but the VolumeAttachment of the detached volume still points here.
    set_ready(&admin, &t.node, "True").await?;
    let out = invoke(emu, json!({"action": "recover", "node": t.node})).await?;
    assert!(out.error, "{}", out.output);
    assert!(out.output.contains("VolumeAttachment"), "{}", out.output);
    assert!(taints(&get_node(&admin, &t.node).await?).contains(&OUT_OF_SERVICE.into()));

    // The attach/detach controller let go: after the settle delay, it ends.
    assert_eq!(delete_vas_of(&admin, &t.node).await?, 1);
    set_ready(&admin, &t.node, "True").await?;
    let sent = Instant::now();
    let out = invoke(emu, running(&t.m.instance)).await?;
    assert!(!out.error, "{}", out.output);
    assert!(
        sent.elapsed() >= Duration::from_secs(1),
        "the settle delay was waited out"
    );
    let r = report(&out);
    let rec = recovery(&r, &t.node);
    assert_eq!(rec["outcome"], "recovered", "{r:#}");
    assert_eq!(rec["taint_removed"], true, "{r:#}");
    let after = get_node(&admin, &t.node).await?;
    let left = taints(&after);
    assert!(!left.contains(&OUT_OF_SERVICE.into()), "{left:?}");
    assert!(
        left.contains(&"node.kubernetes.io/unreachable:NoExecute".into()),
        "only node-fencer's taint is removed: {left:?}"
    );
    assert!(annotations(&after).is_empty(), "{:?}", annotations(&after));
    assert_node_events(
        &admin,
        &t.node,
        &[
            "OutOfServiceTaintApplied",
            "RecoveryWaiting",
            "OutOfServiceTaintRemoved",
        ],
    )
    .await?;

    // Again: nothing of node-fencer's is left on it; nothing changes.
    let out = invoke(emu, running(&t.m.instance)).await?;
    assert!(!out.error, "{}", out.output);
    assert_eq!(
        recovery(&report(&out), &t.node)["hold"]["code"],
        "not_fenced"
    );
    assert_eq!(get_node(&admin, &t.node).await?.spec, after.spec);
    Ok(())
}

#[tokio::test]
async fn recovery_leaves_others_taints_recreated_nodes_and_terminated_instances_alone()
-> anyhow::Result<()> {
    let s = lifecycle_stack().await;
    let _g = exclusive().await;
    let emu = start(s, PLAIN).await;
    let (admin, ec2) = (s.admin().await?, s.ec2().await);

    // Someone else's out-of-service taint, on a running, Ready node.
    let m = launch(&ec2).await?;
    let mut spec = NodeSpec::for_machine(&m);
    spec.ready = "True";
    spec.taints = vec![
        json!({"key": OUT_OF_SERVICE_KEY, "value": "manual", "effect": OUT_OF_SERVICE_EFFECT}),
    ];
    create_node(&admin, &spec).await?;
    let _spec = s.delete_on_drop(&[&spec.name]);
    let out = invoke(emu, json!({"action": "recover", "node": spec.name})).await?;
    assert!(!out.error, "{}", out.output);
    assert_eq!(
        recovery(&report(&out), &spec.name)["hold"]["code"],
        "not_fenced"
    );
    assert!(taints(&get_node(&admin, &spec.name).await?).contains(&OUT_OF_SERVICE.into()));

    // Fenced, then deleted and created again under the same name (a node
    // that re-registered): the new object carries no fencing of ours.
    let t = fenced_target(s, emu).await?;
    Api::<Node>::all(admin.clone())
        .delete(&t.node, &DeleteParams::default())
        .await?;
    start_instance(&ec2, &t.m).await?;
    let mut again = NodeSpec::for_machine(&t.m);
    again.name = t.node.clone();
    again.ready = "True";
    again.taints = vec![];
    create_node(&admin, &again).await?;
    let before = get_node(&admin, &t.node).await?;
    let out = invoke(emu, running(&t.m.instance)).await?;
    assert!(!out.error, "{}", out.output);
    assert_eq!(
        recovery(&report(&out), &t.node)["hold"]["code"],
        "not_fenced"
    );
    let after = get_node(&admin, &t.node).await?;
    assert_eq!(before.spec, after.spec);
    assert_eq!(before.metadata.annotations, after.metadata.annotations);

    // A terminated instance never comes back: the fencing stays, with the way out.
    let gone = fenced_target(s, emu).await?;
    ec2.terminate_instances()
        .instance_ids(&gone.m.instance)
        .send()
        .await?;
    let out = invoke(emu, json!({"action": "recover", "node": gone.node})).await?;
    assert!(!out.error, "{}", out.output);
    let r = report(&out);
    let rec = recovery(&r, &gone.node);
    assert_eq!(rec["outcome"], "kept", "{r:#}");
    assert!(
        rec["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("terminated"),
        "{r:#}"
    );
    assert!(taints(&get_node(&admin, &gone.node).await?).contains(&OUT_OF_SERVICE.into()));
    Ok(())
}

#[tokio::test]
async fn every_invocation_rechecks_the_nodes_it_fenced() -> anyhow::Result<()> {
    let s = lifecycle_stack().await;
    let _g = exclusive().await;
    let emu = start(s, PLAIN).await;
    let (admin, ec2) = (s.admin().await?, s.ec2().await);
    let t = fenced_target(s, emu).await?;
    start_instance(&ec2, &t.m).await?;
    set_ready(&admin, &t.node, "True").await?;
    delete_vas_of(&admin, &t.node).await?;
    tokio::time::sleep(Duration::from_secs(SETTLE.parse()?)).await;

    // An event about a machine of no node of this cluster.
    let out = invoke(emu, stopped("i-0aaaaaaaaaaaaaaaa")).await?;
    assert!(!out.error, "{}", out.output);
    let r = report(&out);
    assert_eq!(r["results"][0]["skip"]["reason"], "not_in_cluster", "{r:#}");
    let rec = recovery(&r, &t.node);
    assert_eq!(rec["outcome"], "recovered", "{r:#}");
    assert_eq!(rec["requested"], false, "{r:#}");
    assert!(!taints(&get_node(&admin, &t.node).await?).contains(&OUT_OF_SERVICE.into()));
    Ok(())
}

#[tokio::test]
async fn the_kill_switch_turns_every_action_into_a_dry_run_and_the_sweep_catches_up()
-> anyhow::Result<()> {
    let s = lifecycle_stack().await;
    let _g = exclusive().await;
    let emu = start(s, PLAIN).await;
    let (admin, ec2) = (s.admin().await?, s.ec2().await);
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), "kube-system");
    let switch = |value: &str| -> anyhow::Result<ConfigMap> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": "node-fencer", "namespace": "kube-system"},
            "data": {"dry-run": value}
        }))?)
    };
    let apply = PatchParams::apply("lifecycle-tests").force();
    let t = target(s, false).await?;
    for value in ["true", "maybe"] {
        maps.patch("node-fencer", &apply, &Patch::Apply(&switch(value)?))
            .await?;
        let out = invoke(emu, stopped(&t.m.instance)).await?;
        let r = report(&out);
        assert_eq!(r["kill_switch"], true, "{value}: {r:#}");
        assert_eq!(r["dry_run"], true, "{value}: {r:#}");
        assert_eq!(r["results"][0]["outcome"], "planned", "{value}: {r:#}");
        assert!(!taints(&get_node(&admin, &t.node).await?).contains(&OUT_OF_SERVICE.into()));
        assert_eq!(volume(&ec2, &t.volume).await?.0, "in-use");
    }
    maps.patch("node-fencer", &apply, &Patch::Apply(&switch("false")?))
        .await?;
    // The events were consumed while the switch was on; no event comes
    // again. The scheduled sweep finds the Node (issue 12, item 5).
    let out = invoke(emu, json!({"action": "sweep"})).await?;
    let r = report(&out);
    assert!(r.get("kill_switch").is_none(), "{r:#}");
    let ours = r["results"]
        .as_array()
        .and_then(|rs| rs.iter().find(|x| x["node"] == t.node.as_str()))
        .with_context(|| format!("the sweep did not look at {}: {r:#}", t.node))?;
    assert_eq!(ours["outcome"], "fenced", "{r:#}");
    assert_eq!(ours["origins"][0]["kind"], "sweep", "{r:#}");
    assert!(taints(&get_node(&admin, &t.node).await?).contains(&OUT_OF_SERVICE.into()));
    assert_eq!(volume(&ec2, &t.volume).await?.0, "available");
    // The sweep left its census, under the function's own RBAC (issue 19).
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-system");
    let census = leases
        .get(node_fencer::core::rules::control::CENSUS_NAME)
        .await?;
    let counted = census.metadata.annotations.unwrap_or_default();
    assert!(
        counted
            .get(node_fencer::core::rules::control::CENSUS_OTHERS)
            .is_some_and(|n| n.parse::<usize>().is_ok()),
        "{counted:?}"
    );
    let renewed = census
        .spec
        .and_then(|s| s.renew_time)
        .context("no count time")?;
    let age = k8s_openapi::jiff::Timestamp::now().as_second() - renewed.0.as_second();
    assert!((0..120).contains(&age), "counted {age} s ago");
    maps.delete("node-fencer", &DeleteParams::default()).await?;
    Ok(())
}

#[tokio::test]
async fn the_cap_holds_across_concurrent_invocations_and_the_second_confirmation_waits()
-> anyhow::Result<()> {
    let s = lifecycle_stack().await;
    let _g = exclusive().await;
    let (admin, ec2) = (s.admin().await?, s.ec2().await);
    // Only this test's nodes count against the cap of two.
    let names: Vec<String> = Api::<Node>::all(admin.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    delete_nodes(
        &admin,
        &names.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await;
    let mut emus = Vec::new();
    for config in CAPPED {
        emus.push(start(s, config).await);
    }
    let mut targets = Vec::new();
    for _ in 0..4 {
        targets.push(target(s, false).await?);
    }
    // Four environments at once: each decides before any taints (the
    // second confirmation holds each for three seconds), so only the
    // Lease and the recount under it keep the cap.
    let calls: Vec<_> = emus
        .iter()
        .zip(&targets)
        .map(|(emu, t)| invoke(emu, stopped(&t.m.instance)))
        .collect();
    let outs = futures::future::join_all(calls).await;
    let mut fenced = 0;
    let mut refused = 0;
    for out in outs {
        let out = out?;
        if out.error {
            assert!(out.output.contains("refused"), "{}", out.output);
            refused += 1;
        } else {
            assert_eq!(
                report(&out)["results"][0]["outcome"],
                "fenced",
                "{}",
                out.output
            );
            fenced += 1;
        }
    }
    let tainted = {
        let mut n = 0;
        for t in &targets {
            n += usize::from(
                taints(&get_node(&admin, &t.node).await?).contains(&OUT_OF_SERVICE.into()),
            );
        }
        n
    };
    assert_eq!((fenced, refused, tainted), (2, 2, 2));
    let names: Vec<&str> = targets.iter().map(|t| t.node.as_str()).collect();
    delete_nodes(&admin, &names).await;

    // The second confirmation (room under the cap again): the instance
    // starts during the delay.
    let late = target(s, false).await?;
    let emu = emus[0];
    let waits = || -> anyhow::Result<usize> {
        Ok(std::fs::read_to_string(&emu.log)?
            .matches("waiting before the second confirmation")
            .count())
    };
    let before = waits()?;
    let sent = Instant::now();
    let call = tokio::spawn(invoke(emu, stopped(&late.m.instance)));
    // Started once the first confirmation is made and the delay begun.
    while waits()? == before {
        anyhow::ensure!(sent.elapsed() < Duration::from_secs(30), "no delay began");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start_instance(&ec2, &late.m).await?;
    let out = call.await??;
    assert!(
        sent.elapsed() >= Duration::from_secs(3),
        "the delay was kept"
    );
    let r = report(&out);
    assert_eq!(
        r["results"][0]["skip"]["reason"], "instance_not_off",
        "{r:#}"
    );
    assert!(!taints(&get_node(&admin, &late.node).await?).contains(&OUT_OF_SERVICE.into()));
    assert_eq!(volume(&ec2, &late.volume).await?.0, "in-use");
    let log = std::fs::read_to_string(&emu.log)?;
    assert!(
        log.contains("re-confirmation did not confirm"),
        "the second look, not the first, stopped it"
    );
    Ok(())
}

#[tokio::test]
async fn legacy_mode_force_deletes_pods_and_attachments_and_recovers_without_a_taint()
-> anyhow::Result<()> {
    let s = lifecycle_stack().await;
    let _g = exclusive().await;
    let emu = start(s, LEGACY).await;
    let (admin, ec2) = (s.admin().await?, s.ec2().await);
    let t = target(s, false).await?;
    // No controller-manager here to create the namespace's service account.
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    if accounts.get_opt("default").await?.is_none() {
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}}))?;
        accounts.create(&PostParams::default(), &sa).await?;
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": unique("db"), "namespace": "default"},
        "spec": {"nodeName": t.node, "containers": [{"name": "db", "image": "db"}]}
    }))?;
    let pod = pods.create(&PostParams::default(), &pod).await?;
    let pod_name = pod.metadata.name.unwrap_or_default();

    let out = invoke(emu, stopped(&t.m.instance)).await?;
    assert!(!out.error, "{}", out.output);
    let r = report(&out);
    assert_eq!(r["mode"], "legacy", "{r:#}");
    let res = &r["results"][0];
    assert_eq!(res["outcome"], "fenced", "{r:#}");
    assert_eq!(res["pods_deleted"], 1, "{r:#}");
    assert_eq!(res["attachments_deleted"], 1, "{r:#}");
    assert!(pods.get_opt(&pod_name).await?.is_none(), "the pod is gone");
    assert_eq!(vas_of(&admin, &t.node).await?.len(), 0);
    assert_eq!(volume(&ec2, &t.volume).await?.0, "available");
    let node = get_node(&admin, &t.node).await?;
    assert!(
        !taints(&node).contains(&OUT_OF_SERVICE.into()),
        "no taint in legacy mode"
    );
    assert!(annotations(&node).contains(&"node-fencer.io/mode=legacy".to_owned()));
    assert_node_events(
        &admin,
        &t.node,
        &[
            "FencedLegacy",
            "PodsForceDeleted",
            "VolumeAttachmentsDeleted",
            "VolumesForceDetached",
        ],
    )
    .await?;

    // The same event again: nothing new to delete, converged.
    let out = invoke(emu, stopped(&t.m.instance)).await?;
    assert!(!out.error, "{}", out.output);
    assert_eq!(report(&out)["results"][0]["outcome"], "already_fenced");

    // Back: the legacy fencing ends (there is no taint to remove).
    start_instance(&ec2, &t.m).await?;
    set_ready(&admin, &t.node, "True").await?;
    let out = invoke(emu, running(&t.m.instance)).await?;
    assert!(!out.error, "{}", out.output);
    let r = report(&out);
    let rec = recovery(&r, &t.node);
    assert_eq!(rec["outcome"], "recovered", "{r:#}");
    assert_eq!(rec["taint_removed"], false, "{r:#}");
    assert!(annotations(&get_node(&admin, &t.node).await?).is_empty());
    Ok(())
}

fn check<'a>(preflight: &'a Value, name: &str) -> &'a Value {
    preflight["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["check"] == json!(name)))
        .unwrap_or_else(|| panic!("no check {name}: {preflight:#}"))
}

#[tokio::test]
async fn preflight_reports_every_permission_and_names_the_missing_one() -> anyhow::Result<()> {
    let s = lifecycle_stack().await;
    let _g = exclusive().await;
    let emu = start(s, PLAIN).await;
    let admin = s.admin().await?;
    let out = invoke(emu, json!({"action": "preflight"})).await?;
    assert!(!out.error, "{}", out.output);
    let p = report(&out);
    assert_eq!(p["passed"], true, "{p:#}");
    assert_eq!(check(&p, "api server")["status"], "pass", "{p:#}");
    assert!(
        check(&p, "fencing mode")["detail"]
            .as_str()
            .unwrap_or_default()
            .starts_with("taint (auto"),
        "{p:#}"
    );
    // Issue 37: how many Nodes node-fencer may act on.
    let reach = check(&p, "nodes in reach")["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        reach.contains("Node(s) may be fenced or powered off: every Node (NODE_SELECTOR unset)"),
        "{p:#}"
    );
    for name in [
        "patch nodes",
        "delete pods",
        "delete volumeattachments.storage.k8s.io",
        "update leases.coordination.k8s.io in kube-system",
        "get configmaps in kube-system",
        "ec2:DescribeInstances",
        "ec2:DetachVolume",
    ] {
        assert_eq!(check(&p, name)["status"], "pass", "{name}: {p:#}");
    }

    // The role without `patch nodes`: one failure, named, with its fix.
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let mut role = roles.get("node-fencer").await?;
    for rule in role.rules.iter_mut().flatten() {
        if rule.resources.iter().flatten().any(|r| r == "nodes") {
            rule.verbs.retain(|v| v != "patch");
        }
    }
    role.metadata.managed_fields = None;
    roles
        .replace("node-fencer", &PostParams::default(), &role)
        .await?;
    let fencer = s.fencer().await?;
    wait_for_rbac(&fencer, "patch", "", "nodes", false).await?;
    let out = invoke(emu, json!({"action": "preflight"})).await?;
    // Issue 58: every sweep's witness round asks the grants again, so the
    // role's loss is told on a quiet day, not at the next node's death.
    let swept = invoke(emu, json!({"action": "sweep"})).await?;
    restore_rbac(s).await?;
    wait_for_rbac(&fencer, "patch", "", "nodes", true).await?;
    let restored = invoke(emu, json!({"action": "sweep"})).await?;
    let witness = |out: &Invocation| report(out)["witness"].clone();
    assert_eq!(
        witness(&swept)["kubernetes_denied"],
        json!(["patch nodes"]),
        "{}",
        swept.output
    );
    assert_eq!(
        witness(&restored).get("kubernetes_denied"),
        None,
        "{}",
        restored.output
    );
    let p = report(&out);
    assert_eq!(p["passed"], false, "{p:#}");
    let failed: Vec<&Value> = p["checks"]
        .as_array()
        .map(|c| c.iter().filter(|c| c["status"] == "fail").collect())
        .unwrap_or_default();
    assert_eq!(failed.len(), 1, "{p:#}");
    assert_eq!(failed[0]["check"], "patch nodes");
    assert!(
        failed[0]["fix"]
            .as_str()
            .unwrap_or_default()
            .contains("rbac.yaml"),
        "{p:#}"
    );
    Ok(())
}
