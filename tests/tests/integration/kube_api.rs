//! The Kubernetes shell against a real API server, as node-fencer (the
//! ClusterRole of `infra/kubernetes/rbac.yaml`, nothing more).

use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use node_fencer::core::model::facts::FenceMode;
use node_fencer::core::model::facts::{OUT_OF_SERVICE_KEY, OUT_OF_SERVICE_VALUE};
use node_fencer::core::model::instance::{InstanceId, InstanceState};
use node_fencer::core::model::kube_read::{self, ANNOTATION_INSTANCE, ANNOTATION_TAINT};
use node_fencer::core::outbound::kube_patch::{self, Ending, Stamp, TaintPatch};
use node_fencer::core::rules::in_use::{self, ReleaseOutcome, ReleasePatch};
use node_fencer::shell::cluster::{
    ClusterReads, FencingWrites, Kube, TaintOutcome, UntaintOutcome,
};
use node_fencer_tests::fixtures::{
    NodeSpec, OUT_OF_SERVICE, create_node, get_node, set_ready, taints, unique, unique_ip,
};
use node_fencer_tests::stack;
use serde_json::json;

fn spec(ready: &'static str) -> NodeSpec {
    NodeSpec {
        name: unique("kube"),
        provider_id: Some("aws:///us-east-1a/i-0123456789abcdef0".into()),
        ready,
        ip: unique_ip(),
        hostname: None,
        taints: vec![json!({"key": "dedicated", "value": "db", "effect": "NoSchedule"})],
    }
}

/// Ending the fencing `at`, no settle delay.
fn ending(fenced_at: &str) -> Ending<'_> {
    Ending {
        fenced_at,
        settle_secs: 0,
        seen_ready_at: 0,
        needs_confirmation: false,
    }
}

fn stamp() -> Stamp {
    Stamp {
        instance: InstanceId::parse("i-0123456789abcdef0").expect("valid"),
        state: InstanceState::Stopped,
        at: "2026-11-22T10:00:00Z".into(),
        correlation_id: unique("corr"),
        mode: FenceMode::Taint,
        volumes: Vec::new(),
        no_schedule: false,
        node_uid: None,
    }
}

/// Issue 58, item 3: a Node deleted and registered again under its name
/// (a new instance that took the IP-based name) is another object. The
/// taint held to the uid judged writes nothing on it; and a patch built on
/// the old object, which names the old uid, is refused by the API server
/// itself, whatever its resourceVersion.
#[tokio::test]
async fn a_node_registered_again_under_its_name_is_not_tainted() -> anyhow::Result<()> {
    let s = stack();
    let admin = s.admin().await?;
    let cluster = Kube::new(s.fencer().await?, "tests");
    let spec = spec("Unknown");
    let judged = create_node(&admin, &spec).await?;
    let nodes = Api::<Node>::all(admin.clone());
    nodes.delete(&spec.name, &DeleteParams::default()).await?;
    let again = create_node(&admin, &spec).await?;
    assert_ne!(again.metadata.uid, judged.metadata.uid);
    let held = Stamp {
        node_uid: judged.metadata.uid.clone(),
        ..stamp()
    };
    assert_eq!(
        cluster.taint_node(&spec.name, &held).await?,
        TaintOutcome::AnotherNode
    );
    assert!(!taints(&get_node(&admin, &spec.name).await?).contains(&OUT_OF_SERVICE.into()));
    // The old object's patch, its resourceVersion swapped for the new one's.
    let TaintPatch::Apply(mut patch) = kube_patch::taint_patch(&judged, &held) else {
        panic!("the judged Node is fenced");
    };
    patch["metadata"]["resourceVersion"] = json!(
        get_node(&admin, &spec.name)
            .await?
            .metadata
            .resource_version
    );
    let err = Api::<Node>::all(s.fencer().await?)
        .patch(&spec.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect_err("a patch that names another uid must be refused");
    assert!(
        matches!(&err, kube::Error::Api(st) if st.code == 409 || st.code == 422),
        "{err}"
    );
    assert!(!taints(&get_node(&admin, &spec.name).await?).contains(&OUT_OF_SERVICE.into()));
    // The Node judged, with its uid, is fenced as ever.
    let now = Stamp {
        node_uid: again.metadata.uid.clone(),
        ..stamp()
    };
    assert_eq!(
        cluster.taint_node(&spec.name, &now).await?,
        TaintOutcome::Applied
    );
    nodes.delete(&spec.name, &DeleteParams::default()).await?;
    Ok(())
}

#[tokio::test]
async fn a_stale_patch_is_refused_by_the_api_server() -> anyhow::Result<()> {
    let s = stack();
    let admin = s.admin().await?;
    let spec = spec("Unknown");
    let stale = create_node(&admin, &spec).await?;
    // Someone else writes after we read.
    let other = json!({"spec": {"taints": [
        {"key": "dedicated", "value": "db", "effect": "NoSchedule"},
        {"key": "other-writer", "effect": "NoSchedule"}
    ]}});
    Api::<Node>::all(admin.clone())
        .patch(&spec.name, &PatchParams::default(), &Patch::Merge(&other))
        .await?;
    let TaintPatch::Apply(patch) = kube_patch::taint_patch(&stale, &stamp()) else {
        panic!("expected a patch");
    };
    let err = Api::<Node>::all(s.fencer().await?)
        .patch(&spec.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect_err("a patch built on a stale resourceVersion must be refused");
    assert!(
        matches!(&err, kube::Error::Api(st) if st.code == 409),
        "{err}"
    );
    assert!(
        taints(&get_node(&admin, &spec.name).await?).contains(&"other-writer:NoSchedule".into())
    );
    Ok(())
}

#[tokio::test]
async fn taint_survives_concurrent_writers_and_keeps_their_taints() -> anyhow::Result<()> {
    let s = stack();
    let admin = s.admin().await?;
    let spec = spec("False");
    create_node(&admin, &spec).await?;
    let cluster = Kube::new(s.fencer().await?, "tests");
    let writers = (0..12).map(|i| {
        let api: Api<Node> = Api::all(admin.clone());
        let name = spec.name.clone();
        async move {
            // A JSON patch "add" is applied by the server on the current object,
            // like the node lifecycle controller's own taint updates.
            let op = json!([{"op": "add", "path": "/spec/taints/-",
                             "value": {"key": format!("writer-{i}"), "effect": "NoSchedule"}}]);
            let patch: json_patch::Patch = serde_json::from_value(op).expect("valid patch");
            api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await
                .map(|_| ())
        }
    });
    let stamp = stamp();
    let (ours, theirs) = tokio::join!(
        cluster.taint_node(&spec.name, &stamp),
        futures::future::join_all(writers)
    );
    assert_eq!(ours?, TaintOutcome::Applied);
    for w in theirs {
        w?;
    }
    let node = get_node(&admin, &spec.name).await?;
    let t = taints(&node);
    assert!(t.contains(&OUT_OF_SERVICE.into()), "{t:?}");
    assert!(t.contains(&"dedicated:NoSchedule".into()));
    for i in 0..12 {
        assert!(
            t.contains(&format!("writer-{i}:NoSchedule")),
            "writer-{i} lost: {t:?}"
        );
    }
    let ann = node.metadata.annotations.unwrap_or_default();
    assert_eq!(
        ann[ANNOTATION_TAINT],
        "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
    );
    assert_eq!(ann[ANNOTATION_INSTANCE], "i-0123456789abcdef0=stopped");
    // Idempotent: another invocation (a Lambda retry) finds it present, the
    // same one (an attempt whose answer was lost) finds its own stamp, and
    // neither writes.
    let rv = get_node(&admin, &spec.name)
        .await?
        .metadata
        .resource_version;
    assert_eq!(
        cluster.taint_node(&spec.name, &self::stamp()).await?,
        TaintOutcome::AlreadyPresent
    );
    assert_eq!(
        cluster.taint_node(&spec.name, &stamp).await?,
        TaintOutcome::Applied
    );
    assert_eq!(
        get_node(&admin, &spec.name)
            .await?
            .metadata
            .resource_version,
        rv
    );
    Ok(())
}

#[tokio::test]
async fn a_node_that_turned_ready_or_vanished_is_not_tainted() -> anyhow::Result<()> {
    let s = stack();
    let admin = s.admin().await?;
    let cluster = Kube::new(s.fencer().await?, "tests");
    let ready = spec("True");
    create_node(&admin, &ready).await?;
    assert_eq!(
        cluster.taint_node(&ready.name, &stamp()).await?,
        TaintOutcome::NodeReady
    );
    assert!(
        !taints(&get_node(&admin, &ready.name).await?)
            .iter()
            .any(|t| t.contains("out-of-service"))
    );
    assert_eq!(
        cluster.taint_node(&unique("gone"), &stamp()).await?,
        TaintOutcome::NodeGone
    );
    Ok(())
}

#[tokio::test]
async fn the_role_allows_what_the_code_does_and_no_more() -> anyhow::Result<()> {
    let s = stack();
    let admin = s.admin().await?;
    let fencer = s.fencer().await?;
    let spec = spec("Unknown");
    create_node(&admin, &spec).await?;
    let cluster = Kube::new(fencer.clone(), "tests");
    assert!(!cluster.list_nodes().await?.is_empty());
    cluster.list_volume_attachments().await?;
    cluster.list_persistent_volumes().await?;
    let event = node_fencer::core::outbound::events::NodeEvent::pods_deleted(0);
    cluster
        .node_event(&spec.name, &event, &unique("event"))
        .await?;
    let denied = Api::<Node>::all(fencer)
        .delete(&spec.name, &DeleteParams::default())
        .await
        .expect_err("node-fencer must not delete nodes");
    assert!(
        matches!(&denied, kube::Error::Api(st) if st.code == 403),
        "{denied}"
    );
    Ok(())
}

/// Issue 35: the legacy mode's release of a dead Node's volumes from
/// `status.volumesInUse`, as node-fencer's ClusterRole allows it: only the
/// names given leave the list, every other entry and the rest of the status
/// stay; a second release finds nothing listed; the apiserver refuses a
/// write under a stale resourceVersion (the guard a kubelet's own write in
/// between trips).
#[tokio::test]
async fn the_legacy_release_takes_only_the_names_given_out_of_volumes_in_use() -> anyhow::Result<()>
{
    let s = stack();
    let admin = s.admin().await?;
    let cluster = Kube::new(s.fencer().await?, "tests");
    let spec = spec("Unknown");
    create_node(&admin, &spec).await?;
    let (freed, kept, in_tree) = (
        "kubernetes.io/csi/cstor.csi.openebs.io^pvc-freed",
        "kubernetes.io/csi/cstor.csi.openebs.io^pvc-kept",
        "kubernetes.io/aws-ebs/aws://us-east-1a/vol-0ffffffffffffffff",
    );
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .patch_status(
            &spec.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"volumesInUse": [kept, freed, in_tree]}})),
        )
        .await?;
    let stale = get_node(&admin, &spec.name).await?;

    let names = [freed.to_owned()];
    // Held to the Node judged: another uid is another Node object.
    assert_eq!(
        cluster
            .release_volumes_in_use(&spec.name, Some("another-uid"), &names)
            .await?,
        ReleaseOutcome::NodeGone
    );
    let uid = stale.metadata.uid.clone();
    let outcome = cluster
        .release_volumes_in_use(&spec.name, uid.as_deref(), &names)
        .await?;
    assert_eq!(outcome, ReleaseOutcome::Released(1));
    let status = get_node(&admin, &spec.name)
        .await?
        .status
        .unwrap_or_default();
    assert_eq!(status.volumes_in_use.unwrap_or_default(), [kept, in_tree]);
    assert_eq!(
        status.conditions,
        stale.status.clone().unwrap_or_default().conditions,
        "the conditions stay as they were"
    );
    assert_eq!(
        cluster
            .release_volumes_in_use(&spec.name, uid.as_deref(), &names)
            .await?,
        ReleaseOutcome::NoneListed
    );

    let ReleasePatch::Apply(patch, _) = in_use::release_patch(&stale, &[kept.to_owned()]) else {
        panic!("the stale Node lists {kept}");
    };
    let refused = nodes
        .patch_status(&spec.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect_err("a stale resourceVersion");
    assert!(
        matches!(&refused, kube::Error::Api(st) if st.code == 409),
        "{refused}"
    );
    assert_eq!(
        cluster
            .release_volumes_in_use("no-such-node", None, &names)
            .await?,
        ReleaseOutcome::NodeGone
    );
    nodes.delete(&spec.name, &DeleteParams::default()).await?;
    Ok(())
}

/// Issue 12, item 8: a legacy force-delete whose answer was lost is retried
/// by name; by then a StatefulSet may have created the replacement pod, and
/// the attach/detach controller a new VolumeAttachment, under the same name.
/// The UID precondition keeps the retry off them.
#[tokio::test]
async fn a_retried_legacy_delete_never_hits_the_replacement() -> anyhow::Result<()> {
    let s = stack();
    let admin = s.admin().await?;
    let cluster = Kube::new(s.fencer().await?, "tests");
    let (dead, healthy) = (unique("dead"), unique("healthy"));

    // The bare stack runs no controller-manager to create the namespace's
    // default ServiceAccount, which admission requires of every pod.
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}}))?;
    match accounts.create(&PostParams::default(), &account).await {
        Err(kube::Error::Api(st)) if st.is_already_exists() => {}
        created => {
            created?;
        }
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod_on = |node: &str, name: &str| -> anyhow::Result<Pod> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "db", "image": "db"}]}
        }))?)
    };
    let name = unique("db");
    pods.create(&PostParams::default(), &pod_on(&dead, &name)?)
        .await?;
    let ours = [OUT_OF_SERVICE_VALUE.to_owned()];
    let listed = cluster.pods_on_node(&dead, &ours).await?;
    let old = listed.iter().find(|p| p.name == name).cloned().unwrap();
    // The first delete went through; its answer was lost. The replacement
    // comes up on a healthy node under the same name.
    pods.delete(&name, &DeleteParams::default().grace_period(0))
        .await?;
    pods.create(&PostParams::default(), &pod_on(&healthy, &name)?)
        .await?;
    cluster.force_delete_pod(&old).await?;
    let replacement = pods.get(&name).await?;
    assert_ne!(replacement.metadata.uid.as_ref(), Some(&old.uid));
    assert_eq!(
        replacement.spec.and_then(|s| s.node_name).as_deref(),
        Some(healthy.as_str())
    );
    pods.delete(&name, &DeleteParams::default().grace_period(0))
        .await?;

    let vas: Api<VolumeAttachment> = Api::all(admin.clone());
    let va_on = |node: &str, name: &str| -> anyhow::Result<VolumeAttachment> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"attacher": "ebs.csi.aws.com", "nodeName": node,
                     "source": {"persistentVolumeName": "pv-db"}}
        }))?)
    };
    let name = unique("csi");
    vas.create(&PostParams::default(), &va_on(&dead, &name)?)
        .await?;
    let old = cluster
        .list_volume_attachments()
        .await?
        .into_iter()
        .find(|a| a.name == name)
        .unwrap();
    vas.delete(&name, &DeleteParams::default()).await?;
    vas.create(&PostParams::default(), &va_on(&healthy, &name)?)
        .await?;
    cluster.delete_volume_attachment(&name, &old.uid).await?;
    let replacement = vas.get(&name).await?;
    assert_eq!(replacement.spec.node_name, healthy);
    vas.delete(&name, &DeleteParams::default()).await?;
    Ok(())
}

/// A Node node-fencer fenced just now, Ready again since just now.
struct Fenced {
    admin: kube::Client,
    cluster: Kube,
    spec: NodeSpec,
    /// The fencing's `fenced-at`.
    at: String,
    _cleanup: node_fencer_tests::NodeCleanup,
}

async fn fenced_and_ready() -> anyhow::Result<Fenced> {
    let s = stack();
    let admin = s.admin().await?;
    let cluster = Kube::new(s.fencer().await?, "tests");
    let spec = spec("Unknown");
    create_node(&admin, &spec).await?;
    let _cleanup = s.delete_on_drop(&[&spec.name]);
    // A real stamp time, with the sub-second part the API server drops.
    let at = k8s_openapi::jiff::Timestamp::now().to_string();
    let ours = Stamp {
        at: at.clone(),
        ..stamp()
    };
    assert_eq!(
        cluster.taint_node(&spec.name, &ours).await?,
        TaintOutcome::Applied
    );
    set_ready(&admin, &spec.name, "True").await?;
    Ok(Fenced {
        admin,
        cluster,
        spec,
        at,
        _cleanup,
    })
}

/// Issue 12, item 9: while node-fencer's mark is on the Node, an operator
/// replaces the out-of-service taint with one of their own; recovery clears
/// the mark and leaves their taint, matched by value and `timeAdded` as the
/// API server stores them.
#[tokio::test]
async fn recovery_leaves_a_taint_an_operator_put_back() -> anyhow::Result<()> {
    let Fenced {
        admin,
        cluster,
        spec,
        at,
        _cleanup,
    } = fenced_and_ready().await?;

    // Recovery finds its own taint by value and time as stored.
    let mut back = cluster.untaint_node(&spec.name, &ending(&at)).await?;
    assert_eq!(
        back,
        UntaintOutcome::Ended {
            taint_removed: true
        }
    );

    // Fenced again; the operator swaps the taint for their own.
    let again = k8s_openapi::jiff::Timestamp::now().to_string();
    let ours = Stamp {
        at: again.clone(),
        ..stamp()
    };
    set_ready(&admin, &spec.name, "Unknown").await?;
    assert_eq!(
        cluster.taint_node(&spec.name, &ours).await?,
        TaintOutcome::Applied
    );
    let operator = json!({"spec": {"taints": [
        {"key": "dedicated", "value": "db", "effect": "NoSchedule"},
        {"key": OUT_OF_SERVICE_KEY, "value": "manual", "effect": "NoExecute"}
    ]}});
    Api::<Node>::all(admin.clone())
        .patch(
            &spec.name,
            &PatchParams::default(),
            &Patch::Merge(&operator),
        )
        .await?;
    set_ready(&admin, &spec.name, "True").await?;
    back = cluster.untaint_node(&spec.name, &ending(&again)).await?;
    assert_eq!(
        back,
        UntaintOutcome::Ended {
            taint_removed: false
        }
    );
    let node = get_node(&admin, &spec.name).await?;
    assert!(
        taints(&node).contains(&OUT_OF_SERVICE.into()),
        "the operator's taint stays"
    );
    assert!(
        node.metadata
            .annotations
            .unwrap_or_default()
            .keys()
            .all(|k| !k.starts_with(kube_read::ANNOTATION_PREFIX)),
        "node-fencer's mark is cleared"
    );
    Ok(())
}

/// Issue 12, item 10: the decision to end a fencing came from a node list
/// that saw the Node Ready long ago; it flapped since. The settle delay is
/// checked on the Node as read at patch time, so nothing is written.
#[tokio::test]
async fn the_settle_delay_is_checked_on_the_node_read_at_patch_time() -> anyhow::Result<()> {
    // Ready again just now (a fresh lastTransitionTime).
    let Fenced {
        admin,
        cluster,
        spec,
        at,
        _cleanup,
    } = fenced_and_ready().await?;
    let long_ago = Ending {
        fenced_at: &at,
        settle_secs: 600,
        seen_ready_at: k8s_openapi::jiff::Timestamp::now().as_second() - 3600,
        ..ending(&at)
    };
    let held = cluster.untaint_node(&spec.name, &long_ago).await?;
    assert!(
        matches!(held, UntaintOutcome::NotSettled { remaining_secs } if remaining_secs > 590),
        "{held:?}"
    );
    let node = get_node(&admin, &spec.name).await?;
    assert!(
        taints(&node).contains(&OUT_OF_SERVICE.into()),
        "still fenced"
    );
    assert!(kube_read::fence_mark(&node).is_some(), "mark kept");
    Ok(())
}
