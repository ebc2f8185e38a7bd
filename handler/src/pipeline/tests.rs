//! The pipeline over the in-memory fakes: named scenarios that assert every
//! call in order, the safety rules, and every single call failing in turn.
//! What only real components show (the apiserver's patch semantics under
//! load, EC2's answers, the Lambda runtime) is tested in `tests/`.

use std::time::Duration;

use super::fakes::{FakeCloud, FakeCluster, Recorder};
use super::{Ctx, PipelineError, run};
use crate::core::control::KillSwitch;
use crate::core::decide::Skip;
use crate::core::facts::OUT_OF_SERVICE_KEY;
use crate::core::instance::{InstanceId, InstanceState, VolumeId, VolumeState};
use crate::core::metrics::Meter;
use crate::core::mode::ModeSetting;
use crate::core::ownership::ClusterIdentity;
use crate::core::policy::Policy;
use crate::core::power::{ActiveFencing, PowerOutcome, Refusal};
use crate::core::recovery::{Hold, RecoveryPolicy};
use crate::core::report::{AttachmentOutcome, Outcome, RecoveryOutcome, Report, VolumeOutcome};
use crate::core::suspect::{Batch, Intent, NodeRef, Origin, Suspect};
use crate::core::view::Census;
use crate::shell::cluster::ClusterReads;

const NODE: &str = "ip-10-0-1-17.ec2.internal";

fn instance(n: u8) -> InstanceId {
    InstanceId::parse(&format!("i-0123456789abcde{n:02x}")).unwrap()
}

fn volume(n: u8) -> VolumeId {
    VolumeId::parse(&format!("vol-0123456789abcde{n:02x}")).unwrap()
}

fn policy() -> Policy {
    Policy {
        max_out_of_service: 10,
        recovery_settle: Duration::ZERO,
        detach_wait: Duration::ZERO,
        not_ready_wait: Duration::ZERO,
        poll_interval: Duration::from_millis(1),
        ..Policy::default()
    }
}

fn batch(intent: Intent, ids: &[InstanceId]) -> Batch {
    Batch {
        suspects: ids
            .iter()
            .map(|id| Suspect {
                target: NodeRef::Instance(id.clone()),
                intent,
                origin: Origin::Direct,
            })
            .collect(),
        ..Batch::default()
    }
}

/// A cluster and a cloud sharing one call log.
struct World {
    calls: Recorder,
    cloud: FakeCloud,
    cluster: FakeCluster,
}

impl World {
    fn new() -> Self {
        let calls = Recorder::default();
        Self {
            cloud: FakeCloud::new(calls.clone()),
            cluster: FakeCluster::new(calls.clone()),
            calls,
        }
    }

    /// Node `name` on instance `n` in `state`, `Ready` as given, with one
    /// EBS volume attached through a PersistentVolume.
    fn with_node(self, name: &str, n: u8, state: InstanceState, ready: &str) -> Self {
        self.cloud.instance(&instance(n), state);
        self.cloud
            .attached_volume(&volume(n), &instance(n), "/dev/xvdba");
        self.cluster.node(name, &instance(n), ready);
        self.cluster.attachment(name, &volume(n));
        self
    }

    /// The seed case: one stopped machine whose Node went silent.
    fn stopped() -> Self {
        Self::new().with_node(NODE, 1, InstanceState::Stopped, "Unknown")
    }

    /// The seed case on a Node that records its volume, as the
    /// attach/detach controller does, with another node's attachment in the
    /// cluster.
    fn stopped_recorded() -> Self {
        let w = Self::new();
        w.cloud.instance(&instance(1), InstanceState::Stopped);
        w.cloud
            .attached_volume(&volume(1), &instance(1), "/dev/xvdba");
        w.cluster.node(NODE, &instance(1), "Unknown");
        w.cluster.recorded_attachment(NODE, &volume(1));
        w.cluster.attachment("another-node", &volume(2));
        w
    }

    async fn run(&self, policy: &Policy, batch: Batch) -> Result<Report, PipelineError> {
        let id = format!("test-{}", self.calls.log().len());
        self.run_as(&id, policy, batch).await
    }

    /// One invocation under `correlation_id`: a Lambda retry keeps it.
    async fn run_as(
        &self,
        correlation_id: &str,
        policy: &Policy,
        batch: Batch,
    ) -> Result<Report, PipelineError> {
        let meter = Meter::default();
        let ctx = Ctx::new(&self.cloud, &self.cluster, &meter, correlation_id);
        run(&ctx, policy, batch).await
    }

    async fn fence(&self, policy: &Policy) -> Result<Report, PipelineError> {
        self.run(policy, batch(Intent::Fence, &[instance(1)])).await
    }

    /// The seed event, as the invocation `correlation_id` (or its retry).
    async fn fence_as(&self, correlation_id: &str) -> Result<Report, PipelineError> {
        let fence = batch(Intent::Fence, &[instance(1)]);
        self.run_as(correlation_id, &policy(), fence).await
    }

    /// The seed node's machine runs again, its Node is Ready, and the
    /// attach/detach controller removed the detached volume's attachment.
    fn back_up(&self) {
        self.cloud.instance(&instance(1), InstanceState::Running);
        self.cluster.set_ready(NODE, "True");
        self.cluster.remove_attachment(&volume(1));
    }

    /// A recovery request for the seed node (or an operator's confirmation).
    async fn recover(&self, policy: &Policy, intent: Intent) -> Report {
        self.run(policy, batch(intent, &[instance(1)]))
            .await
            .unwrap()
    }

    /// The seed node's fencing ended: taint and mark gone.
    fn assert_recovered(&self, report: &Report) {
        assert_eq!(
            report.recoveries[0].outcome,
            RecoveryOutcome::Recovered,
            "{report:#?}"
        );
        assert_eq!(self.out_of_service_taints(NODE), 0);
        assert!(self.cluster.facts(NODE).unwrap().fenced.is_none());
    }

    fn out_of_service_taints(&self, node: &str) -> usize {
        self.cluster
            .taints(node)
            .iter()
            .filter(|t| t.key == OUT_OF_SERVICE_KEY)
            .count()
    }

    fn writes(&self) -> Vec<String> {
        const WRITES: [&str; 9] = [
            "StopInstances",
            "MarkPoweredOff",
            "TaintNode",
            "UntaintNode",
            "DetachVolume",
            "CreateEvent",
            "DeletePod",
            "DeleteVolumeAttachment",
            "AcquireLease",
        ];
        self.calls
            .log()
            .into_iter()
            .filter(|c| WRITES.iter().any(|w| c.starts_with(w)))
            .collect()
    }
}

#[tokio::test]
async fn a_stopped_silent_node_is_tainted_and_its_volume_freed_in_this_order() {
    let w = World::stopped();
    // Evicted by the taint at once; staying for good; staying for a while.
    w.cluster.pod(NODE, "db-0");
    w.cluster.staying_pod(NODE, "storage-daemon", true, None);
    w.cluster.patient_pod(NODE, "batch-job");
    w.cluster.pod("another-node", "web-0");
    let report = w.fence(&policy()).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert!(r.taint_applied);
    assert_eq!(r.volumes[0].outcome, VolumeOutcome::Detached);
    assert_eq!(
        r.reason,
        "tainted out-of-service, 1 pod(s) force-deleted; 1 volume(s) force-detached"
    );
    assert_eq!(r.pods_deleted, 1);
    assert_eq!(
        w.cluster.pods(NODE),
        2,
        "the pods the taint does not evict yet"
    );
    assert_eq!(w.cluster.pods("another-node"), 1);
    assert!(!report.incomplete());
    assert_eq!(w.out_of_service_taints(NODE), 1);
    assert_eq!(
        w.cloud.volume_state(&volume(1)),
        Some(VolumeState::Available)
    );
    assert_eq!(
        w.cluster.events(NODE),
        [
            "OutOfServiceTaintApplied",
            "PodsForceDeleted",
            "VolumesForceDetached"
        ]
    );
    assert!(w.cluster.lease().is_none(), "the Lease is released");
    let vol = volume(1);
    assert_eq!(
        w.calls.log(),
        [
            // The instance first: its answer is also the confirmation.
            "DescribeInstances".to_owned(),
            "GetKillSwitch".into(),
            "ListNodes".into(),
            "GetVersion".into(),
            "ListVolumeAttachments".into(),
            "ListPersistentVolumes".into(),
            "DescribeVolumes".into(),
            format!("ListPods {NODE}"),
            "AcquireLease".into(),
            "ListNodes".into(),
            "DescribeInstances".into(),
            format!("TaintNode {NODE}"),
            // The Events wait until the Lease is free.
            "ReleaseLease".into(),
            format!("CreateEvent {NODE}"),
            // Confirmed off again, then the pods the garbage collector would
            // delete on its next pass, right after the taint.
            "DescribeInstances".into(),
            format!("ListPods {NODE}"),
            "DeletePod db-0".into(),
            format!("CreateEvent {NODE}"),
            format!("DetachVolume {vol}"),
            format!("CreateEvent {NODE}"),
            "DescribeVolumes".into(),
        ]
    );
}

/// The policy of cluster `prod` in `vpc-0123abcd`.
fn identified() -> Policy {
    Policy {
        identity: ClusterIdentity {
            name: Some("prod".into()),
            vpc: Some("vpc-0123abcd".into()),
        },
        ..policy()
    }
}

/// Issue 19: every cluster of the account hears of every instance.
#[tokio::test]
async fn another_clusters_instance_costs_one_ec2_call_and_no_kubernetes_request() {
    let w = World::stopped().with_node(
        "ip-10-0-9-9.ec2.internal",
        2,
        InstanceState::Stopped,
        "Unknown",
    );
    w.cloud.describe_as(&instance(1), |f| {
        f.tags = vec![("eks:cluster-name".into(), "staging".into())];
    });
    w.cloud
        .describe_as(&instance(2), |f| f.vpc_id = Some("vpc-99999999".into()));
    let ours = identified();
    let report = w
        .run(&ours, batch(Intent::Fence, &[instance(1), instance(2)]))
        .await
        .unwrap();
    assert_eq!(w.calls.log(), ["DescribeInstances"]);
    let skips: Vec<_> = report.results.iter().map(|r| r.skip.clone()).collect();
    assert_eq!(
        skips,
        [
            Some(Skip::OtherCluster {
                cluster: "staging".into()
            }),
            Some(Skip::OtherVpc {
                vpc: "vpc-99999999".into()
            }),
        ]
    );
    assert!(!report.incomplete(), "nothing for a retry to do");
    assert_eq!(w.out_of_service_taints(NODE), 0);
}

#[tokio::test]
async fn with_an_identity_this_clusters_instance_is_fenced_and_asked_about_no_more_often() {
    let plain = World::stopped();
    let report = plain.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced);
    let w = World::stopped().with_node(
        "ip-10-0-9-9.ec2.internal",
        2,
        InstanceState::Stopped,
        "Unknown",
    );
    w.cloud.describe_as(&instance(1), |f| {
        f.tags = vec![("kubernetes.io/cluster/prod".into(), "owned".into())];
        f.vpc_id = Some("vpc-0123abcd".into());
    });
    w.cloud.describe_as(&instance(2), |f| {
        f.tags = vec![("kubernetes.io/cluster/staging".into(), "owned".into())];
    });
    let ours = identified();
    let report = w
        .run(&ours, batch(Intent::Fence, &[instance(2), instance(1)]))
        .await
        .unwrap();
    let fenced: Vec<_> = report
        .results
        .iter()
        .map(|r| (r.node.clone(), r.outcome))
        .collect();
    assert_eq!(
        fenced,
        [
            (None, Outcome::Skipped),
            (Some(NODE.into()), Outcome::Fenced)
        ],
        "{report:#?}"
    );
    assert_eq!(w.calls.log()[0], "DescribeInstances", "screened first");
    assert_eq!(
        w.describes(),
        plain.describes(),
        "the screen's answer is the first confirmation"
    );
    assert_eq!(w.out_of_service_taints("ip-10-0-9-9.ec2.internal"), 0);
}

/// Issue 19: a census from a recent sweep, as it stands now.
fn census(others: usize) -> Census {
    Census {
        others,
        counted_at: k8s_openapi::jiff::Timestamp::now().as_second(),
    }
}

impl World {
    /// EC2 gives instance `n` the private DNS name `name`, as it names EKS nodes.
    fn named(self, n: u8, name: &str) -> Self {
        self.cloud
            .describe_as(&instance(n), |f| f.private_dns_name = Some(name.into()));
        self
    }

    fn describes(&self) -> usize {
        self.calls
            .log()
            .iter()
            .filter(|c| *c == "DescribeInstances")
            .count()
    }

    fn lists(&self) -> usize {
        self.calls
            .log()
            .iter()
            .filter(|c| *c == "ListNodes")
            .count()
    }
}

#[tokio::test]
async fn with_a_fresh_census_an_event_reads_its_node_by_name_and_never_every_node() {
    let w =
        World::stopped()
            .named(1, NODE)
            .with_node("bystander", 2, InstanceState::Running, "True");
    w.cluster.census(census(0));
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(w.lists(), 0, "{:?}", w.calls.log());
    let log = w.calls.log();
    let reads: Vec<&str> = log
        .iter()
        .map(String::as_str)
        .filter(|c| c.starts_with("GetNode") || *c == "ListFencedNodes" || *c == "GetCensus")
        .collect();
    assert_eq!(
        reads,
        [
            "GetCensus",
            &format!("GetNode {NODE}"),
            "ListFencedNodes",
            // Under the Lease, the recount reads them again.
            "GetCensus",
            &format!("GetNode {NODE}"),
            "ListFencedNodes",
        ]
    );
    // Fenced, so labelled: the next invocation counts it without a full list.
    let labelled = w.cluster.list_fenced_nodes().await.unwrap();
    assert_eq!(labelled.len(), 1);
    assert_eq!(labelled[0].name, NODE);
}

#[tokio::test]
async fn a_node_of_that_name_whose_provider_id_names_another_instance_is_not_trusted() {
    // Instance 1's private DNS name is the name of instance 2's Node (a
    // later instance at the same address, or another VPC).
    let w = World::new().with_node(NODE, 2, InstanceState::Stopped, "Unknown");
    w.cloud.instance(&instance(1), InstanceState::Stopped);
    let w = w.named(1, NODE);
    w.cluster.census(census(0));
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(
        report.results[0].skip,
        Some(Skip::NotInCluster),
        "{report:#?}"
    );
    assert_eq!(w.lists(), 1, "read every Node instead: {:?}", w.calls.log());
    assert!(w.writes().is_empty(), "{:?}", w.writes());
    assert_eq!(w.out_of_service_taints(NODE), 0);
}

#[tokio::test]
async fn without_a_fresh_census_every_node_is_read() {
    for stale in [None, Some(20 * 60 + 5)] {
        let w = World::stopped().named(1, NODE);
        if let Some(age) = stale {
            let mut old = census(0);
            old.counted_at -= age;
            w.cluster.census(old);
        }
        let report = w.fence(&policy()).await.unwrap();
        assert_eq!(report.results[0].outcome, Outcome::Fenced);
        assert_eq!(w.lists(), 2, "{stale:?}: {:?}", w.calls.log());
        assert!(!w.calls.log().iter().any(|c| c.starts_with("GetNode")));
    }
}

#[tokio::test]
async fn a_partial_view_only_admits_a_refusal_is_decided_over_every_node() {
    let one = Policy {
        max_out_of_service: 1,
        ..policy()
    };
    // The census counted a Node that has come back since: over every Node,
    // there is room.
    let w = World::stopped().named(1, NODE);
    w.cluster.census(census(1));
    let report = w.fence(&one).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert!(w.lists() >= 1, "decided again over every Node");
    // A Node tainted by hand, which the census counted: refused over every
    // Node too, as without a census.
    let w =
        World::stopped()
            .named(1, NODE)
            .with_node("by-hand", 2, InstanceState::Stopped, "False");
    w.cluster.taint_by_hand("by-hand");
    w.cluster.census(census(1));
    let report = w.fence(&one).await.unwrap();
    assert!(
        matches!(
            report.results[0].skip,
            Some(Skip::CapReached { limit: 1, .. })
        ),
        "{report:#?}"
    );
    assert_eq!(w.out_of_service_taints(NODE), 0);
}

#[tokio::test]
async fn the_sweep_leaves_a_census_of_the_nodes_others_put_out_of_service() {
    let w = World::stopped()
        .with_node("by-hand", 2, InstanceState::Stopped, "False")
        .with_node("by-hand-dead", 3, InstanceState::Terminated, "False")
        .with_node("healthy", 4, InstanceState::Running, "True");
    w.cluster.taint_by_hand("by-hand");
    w.cluster.taint_by_hand("by-hand-dead");
    let sweep = Batch {
        sweep: true,
        ..Batch::default()
    };
    let dry = Policy {
        dry_run: true,
        ..policy()
    };
    w.run(&dry, sweep.clone()).await.unwrap();
    assert_eq!(w.cluster.census_written(), None, "a dry run writes nothing");
    let report = w.run(&policy(), sweep).await.unwrap();
    let fenced: Vec<_> = report.results.iter().map(|r| r.outcome).collect();
    assert_eq!(fenced, [Outcome::Fenced], "{report:#?}");
    // Both Nodes tainted by hand count: the sweep knows nothing of their
    // machines when it counts, and a Node not known dead takes room.
    let left = w.cluster.census_written().expect("a census");
    assert_eq!(left.others, 2);
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    assert!(left.fresh(now));
}

#[tokio::test]
async fn split_brain_a_silent_node_whose_instance_runs_is_left_alone() {
    let w = World::new().with_node(NODE, 1, InstanceState::Running, "Unknown");
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(
        report.results[0].skip,
        Some(Skip::InstanceNotOff {
            state: InstanceState::Running
        })
    );
    assert!(w.writes().is_empty(), "{:?}", w.writes());
    assert_eq!(w.out_of_service_taints(NODE), 0);
}

/// Issue 12, item 2: a hibernated instance resumes from RAM when started.
#[tokio::test]
async fn a_hibernated_instance_is_fenced_only_when_the_setting_says_so() {
    let w = World::new().with_node(NODE, 1, InstanceState::Hibernated, "Unknown");
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::Hibernated));
    assert!(!report.incomplete());
    assert!(w.writes().is_empty(), "{:?}", w.writes());
    let anyway = Policy {
        fence_hibernated: true,
        ..policy()
    };
    let report = w.fence(&anyway).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
}

#[tokio::test]
async fn a_ready_node_is_never_fenced_and_the_event_is_retried() {
    let w = World::new().with_node(NODE, 1, InstanceState::Stopped, "True");
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady));
    assert!(report.incomplete(), "a retry may find it NotReady");
    assert!(w.writes().is_empty(), "{:?}", w.writes());
}

/// Issue 16: EC2's `stopped` comes before the node controller's grace
/// period is over. The invocation waits for the Node to turn NotReady
/// (bounded), asking EC2 nothing more meanwhile, and fences at once; a Node
/// that stays Ready past the wait fails the invocation for a retry, and a
/// dry run does not wait.
#[tokio::test]
async fn a_node_still_ready_when_its_instance_is_off_is_fenced_once_it_turns_not_ready() {
    let waiting = Policy {
        not_ready_wait: Duration::from_secs(30),
        ..policy()
    };
    let w = World::new().with_node(NODE, 1, InstanceState::Stopped, "True");
    w.cluster.not_ready_from_list(NODE, 4);
    let report = w.fence(&waiting).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert!(!report.incomplete());
    let log = w.calls.log();
    let leased = log.iter().position(|c| c == "AcquireLease").unwrap();
    let before: Vec<&str> = log[..leased]
        .iter()
        .map(String::as_str)
        .filter(|c| matches!(*c, "ListNodes" | "DescribeInstances"))
        .collect();
    assert_eq!(
        before,
        [
            "DescribeInstances",
            "ListNodes",
            "ListNodes",
            "ListNodes",
            "ListNodes"
        ],
        "EC2 is asked once; the Node is looked at until NotReady"
    );

    // Long enough for more than one look on a loaded machine (a look takes
    // well under a millisecond with the fakes), short for the suite.
    let short = Policy {
        not_ready_wait: Duration::from_millis(300),
        poll_interval: Duration::from_millis(10),
        ..policy()
    };
    let w = World::new().with_node(NODE, 1, InstanceState::Stopped, "True");
    let report = w.fence(&short).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady));
    assert!(report.incomplete(), "retried once the wait ran out");
    assert!(w.writes().is_empty(), "{:?}", w.writes());
    assert!(w.calls.log().iter().filter(|c| *c == "ListNodes").count() > 2);

    let w = World::new().with_node(NODE, 1, InstanceState::Stopped, "True");
    let check = w
        .run(&waiting, batch(Intent::Check, &[instance(1)]))
        .await
        .unwrap();
    assert_eq!(check.results[0].skip, Some(Skip::NodeReady));
    assert_eq!(
        w.calls.log().iter().filter(|c| *c == "ListNodes").count(),
        1,
        "a check does not wait"
    );
}

#[tokio::test]
async fn an_instance_started_before_the_second_look_is_not_fenced() {
    let w = World::stopped();
    w.cloud.on_describe(2, &instance(1), InstanceState::Pending);
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(
        report.results[0].skip,
        Some(Skip::InstanceNotOff {
            state: InstanceState::Pending
        })
    );
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert!(
        !w.calls
            .log()
            .iter()
            .any(|c| c.starts_with("TaintNode") || c.starts_with("DetachVolume"))
    );
}

/// Issue 12, item 3: the taint patch, its retries and the Lease lie between
/// the second look and the detaches.
#[tokio::test]
async fn an_instance_started_after_the_taint_keeps_its_volumes() {
    for mode in [ModeSetting::Taint, ModeSetting::Legacy] {
        let w = World::stopped();
        w.cluster.pod(NODE, "db-0");
        w.cluster
            .driver_attachment(NODE, "cstor.csi.openebs.io", "pv-cstor");
        w.cloud.on_describe(3, &instance(1), InstanceState::Running);
        let p = Policy { mode, ..policy() };
        let report = w.fence(&p).await.unwrap();
        let r = &report.results[0];
        assert_eq!(r.outcome, Outcome::Failed, "{report:#?}");
        assert!(report.incomplete(), "a retry looks again");
        let log = w.calls.log();
        for write in ["DetachVolume", "DeletePod", "DeleteVolumeAttachment"] {
            assert!(
                !log.iter().any(|c| c.starts_with(write)),
                "{mode:?}: {log:?}"
            );
        }
        assert_eq!(w.cloud.volume_state(&volume(1)), Some(VolumeState::InUse));
        assert_eq!(w.cluster.pods(NODE), 1);
        assert_eq!(w.cluster.attachments().len(), 2, "no driver's is freed");
    }
}

#[tokio::test]
async fn a_node_turned_ready_before_the_taint_is_left_alone() {
    let w = World::stopped();
    w.cluster.ready_before_taint(NODE);
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].skip, Some(Skip::NodeReady));
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert!(!w.calls.log().iter().any(|c| c.starts_with("DetachVolume")));
}

#[tokio::test]
async fn a_dry_run_or_the_kill_switch_plans_and_writes_nothing() {
    let dry = Policy {
        dry_run: true,
        ..policy()
    };
    let cases = [
        (dry, KillSwitch::Off),
        (policy(), KillSwitch::On),
        (policy(), KillSwitch::Unreadable("maybe".into())),
    ];
    for (p, switch) in cases {
        let w = World::stopped();
        w.cluster.set_kill_switch(switch.clone());
        let report = w.fence(&p).await.unwrap();
        assert_eq!(report.results[0].outcome, Outcome::Planned, "{switch:?}");
        assert_eq!(
            report.results[0].volumes[0].outcome,
            VolumeOutcome::WouldDetach
        );
        assert!(report.dry_run);
        assert!(w.writes().is_empty(), "{switch:?}: {:?}", w.writes());
    }
}

/// Issue 12, item 11: the kill switch is read again after every wait, before
/// the first write after it.
#[tokio::test]
async fn a_kill_switch_turned_on_during_a_wait_stops_what_comes_after_it() {
    // While the second confirmation waits, or another invocation holds the Lease.
    let delayed = Policy {
        confirm_again_after: Duration::from_millis(1),
        ..policy()
    };
    for (p, lease_held) in [(delayed, false), (policy(), true)] {
        let w = World::stopped();
        w.cluster.kill_switch_from_read(2, KillSwitch::On);
        if lease_held {
            w.cluster.lease_held_once();
        }
        let report = w.fence(&p).await.unwrap();
        assert_eq!(report.results[0].outcome, Outcome::Planned, "{report:#?}");
        assert!(report.kill_switch && report.dry_run);
        let log = w.calls.log();
        assert_eq!(log.iter().filter(|c| *c == "GetKillSwitch").count(), 2);
        for write in ["TaintNode", "DetachVolume", "CreateEvent"] {
            assert!(!log.iter().any(|c| c.starts_with(write)), "{log:?}");
        }
        assert!(w.cluster.lease().is_none(), "the Lease is let go");
    }

    // The second read fails: that counts as on, and the invocation is retried.
    let baseline = World::stopped();
    let delayed = Policy {
        confirm_again_after: Duration::from_millis(1),
        ..policy()
    };
    baseline.fence(&delayed).await.unwrap();
    let second_read = baseline
        .calls
        .log()
        .iter()
        .enumerate()
        .filter(|(_, c)| *c == "GetKillSwitch")
        .nth(1)
        .map(|(k, _)| k);
    let w = World::stopped();
    w.calls.fail_at(second_read);
    let report = w.fence(&delayed).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Planned, "{report:#?}");
    assert!(report.incomplete(), "an unreadable switch is retried");
    assert!(!w.calls.log().iter().any(|c| c.starts_with("TaintNode")));

    // While a requested recovery waits out the settle delay.
    let w = World::stopped();
    w.fence(&policy()).await.unwrap();
    w.cloud.instance(&instance(1), InstanceState::Running);
    w.cluster.set_ready(NODE, "True");
    w.cluster.remove_attachment(&volume(1));
    w.cluster.kill_switch_from_read(2, KillSwitch::On);
    let settle = Policy {
        recovery_settle: Duration::from_secs(1),
        ..policy()
    };
    let report = w
        .run(&settle, batch(Intent::Recover, &[instance(1)]))
        .await
        .unwrap();
    assert_eq!(
        report.recoveries[0].outcome,
        RecoveryOutcome::Planned,
        "{report:#?}"
    );
    assert!(report.kill_switch);
    assert!(!w.calls.log().iter().any(|c| c.starts_with("UntaintNode")));
    assert_eq!(w.out_of_service_taints(NODE), 1);
}

#[tokio::test]
async fn the_cap_refuses_the_second_node_and_records_why() {
    let w = World::stopped().with_node("other", 2, InstanceState::Terminated, "False");
    let p = Policy {
        max_out_of_service: 1,
        ..policy()
    };
    let report = w
        .run(&p, batch(Intent::Fence, &[instance(1), instance(2)]))
        .await
        .unwrap();
    let outcomes: Vec<Outcome> = report.results.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Outcome::Fenced, Outcome::Skipped]);
    assert!(matches!(
        report.results[1].skip,
        Some(Skip::CapReached { limit: 1, .. })
    ));
    assert_eq!(w.cluster.events("other"), ["FencingRefused"]);
    assert_eq!(w.out_of_service_taints("other"), 0);
    assert_eq!(
        w.cloud.volume_state(&volume(2)).as_ref(),
        Some(&VolumeState::InUse)
    );
    assert!(report.incomplete(), "a refused node is retried");
}

/// Issue 12, item 14: a fenced Node whose instance was terminated since can
/// never come back, so it takes no room under the cap; one whose instance is
/// only stopped does.
#[tokio::test]
async fn a_fenced_node_whose_instance_is_terminated_takes_no_room_under_the_cap() {
    let w = World::stopped();
    w.fence(&policy()).await.unwrap();
    assert_eq!(w.out_of_service_taints(NODE), 1);
    let w = w.with_node("other", 2, InstanceState::Stopped, "False");
    let p = Policy {
        max_out_of_service: 1,
        ..policy()
    };
    let second = || batch(Intent::Fence, &[instance(2)]);
    let report = w.run(&p, second()).await.unwrap();
    assert!(
        matches!(report.results[0].skip, Some(Skip::CapReached { .. })),
        "{report:#?}"
    );
    // The machine of the first Node is terminated now (an Auto Scaling
    // group replaced it); its Node object stays, tainted.
    w.cloud.instance(&instance(1), InstanceState::Terminated);
    let report = w.run(&p, second()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(w.out_of_service_taints("other"), 1);
}

/// Issue 12, item 5: the sweep finds what no event named. One node list and
/// one batched lookup decide every NotReady Node: the one whose machine is
/// off is fenced, the hung one (machine running) left alone, the one still
/// stopping left for the retry, the Ready one not even looked at.
#[tokio::test]
async fn the_sweep_fences_what_no_event_named_with_one_lookup() {
    let w = World::stopped()
        .with_node("hung", 2, InstanceState::Running, "Unknown")
        .with_node("stopping", 3, InstanceState::Stopping, "False")
        .with_node("healthy", 4, InstanceState::Running, "True");
    let report = w
        .run(&policy(), crate::core::trigger::direct::sweep())
        .await
        .unwrap();
    let seen: Vec<(&str, Outcome)> = report
        .results
        .iter()
        .map(|r| (r.node.as_deref().unwrap_or("-"), r.outcome))
        .collect();
    assert_eq!(
        seen,
        [
            ("hung", Outcome::Skipped),
            (NODE, Outcome::Fenced),
            ("stopping", Outcome::Skipped)
        ],
        "{report:#?}"
    );
    assert!(report.results.iter().all(|r| r.origins == [Origin::Sweep]));
    assert_eq!(w.out_of_service_taints(NODE), 1);
    assert_eq!(w.out_of_service_taints("hung"), 0);
    assert_eq!(w.out_of_service_taints("stopping"), 0);
    let log = w.calls.log();
    let first_taint = log.iter().position(|c| c.starts_with("TaintNode")).unwrap();
    assert_eq!(
        log[..first_taint]
            .iter()
            .filter(|c| c.starts_with("ListNodes"))
            .count(),
        2,
        "the sweep's list, and the recount under the Lease: {log:?}"
    );
    assert_eq!(
        log[..first_taint]
            .iter()
            .filter(|c| *c == "DescribeInstances")
            .count(),
        2,
        "one lookup to decide, one to confirm again: {log:?}"
    );
    // A machine on its way off is retried, not dropped.
    assert!(report.incomplete(), "{report:#?}");
    assert!(report.results[2].leaves_work());
    assert!(!report.results[0].leaves_work());
}

/// Issue 12, item 4: a pod that tolerates the out-of-service taint (a
/// storage daemon with `operator: Exists`) is never evicted, so its volume
/// stays attached and is reported kept; the fencing's annotation does not
/// list it, so recovery does not wait for its VolumeAttachment to go.
#[tokio::test]
async fn the_volume_of_a_pod_that_stays_on_the_node_stays_attached() {
    let w = World::stopped();
    let daemons = volume(9);
    w.cloud
        .attached_volume(&daemons, &instance(1), "/dev/xvdbz");
    w.cluster.attachment(NODE, &daemons);
    w.cluster
        .staying_pod(NODE, "storage-daemon", true, Some(&daemons));
    w.cluster
        .staying_pod(NODE, "app-0", false, Some(&volume(1)));
    let report = w.fence(&policy()).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert!(!report.incomplete(), "{report:#?}");
    let outcomes: Vec<(String, VolumeOutcome)> = r
        .volumes
        .iter()
        .map(|v| (v.volume.to_string(), v.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [
            (volume(1).to_string(), VolumeOutcome::Detached),
            (daemons.to_string(), VolumeOutcome::Kept)
        ]
    );
    assert_eq!(w.cloud.volume_state(&daemons), Some(VolumeState::InUse));
    let mark = w.cluster.facts(NODE).unwrap().fenced.unwrap();
    assert_eq!(mark.volumes, [volume(1)], "only what was detached");
    // Back: the daemon's attachment remains, and recovery ends the fencing.
    w.cloud.instance(&instance(1), InstanceState::Running);
    w.cluster.set_ready(NODE, "True");
    w.cluster.remove_attachment(&volume(1));
    let asked = w.describes();
    let back = w
        .run(&policy(), batch(Intent::Recover, &[instance(1)]))
        .await
        .unwrap();
    assert_eq!(
        back.recoveries[0].outcome,
        RecoveryOutcome::Recovered,
        "{back:#?}"
    );
    assert_eq!(
        w.describes() - asked,
        1,
        "the screen's answer serves the recovery"
    );
}

/// Issue 12, item 6: the holder renews the Lease while it works, so a
/// holder slowed past the time one renewal allows (EC2 throttled under the
/// Lease) still writes its taint; a holder whose Lease was taken over meanwhile
/// writes none, and the invocation is retried.
#[tokio::test]
async fn a_slow_holder_renews_its_lease_and_writes_nothing_once_it_is_lost() {
    let p = Policy {
        lease: crate::core::control::LeaseTiming {
            renew_every: Duration::from_millis(10),
            valid_for: Duration::from_millis(40),
        },
        ..policy()
    };
    // The second DescribeInstances, under the Lease, answers after 150 ms:
    // several times what one renewal allows.
    let slow = Duration::from_millis(150);
    let w = World::stopped();
    w.cloud.slow_describe(2, slow);
    let report = w.fence(&p).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    let renewals = w.calls.log().iter().filter(|c| *c == "RenewLease").count();
    assert!(renewals >= 3, "renewed while slow: {renewals}");

    // A long wait for another holder does not eat into the time to write:
    // the Lease's duration runs from when it was taken.
    let w = World::stopped();
    w.cluster.lease_held_for(Duration::from_millis(150));
    let report = w.fence(&p).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");

    let w = World::stopped();
    w.cloud.slow_describe(2, slow);
    w.cluster.lease_taken_at_renewal(2);
    let report = w.fence(&p).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Failed, "{report:#?}");
    assert!(report.incomplete(), "retried");
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert!(!w.calls.log().iter().any(|c| c.starts_with("TaintNode")));
    assert!(!w.calls.log().iter().any(|c| c.starts_with("DetachVolume")));
    assert_eq!(w.cloud.volume_state(&volume(1)), Some(VolumeState::InUse));
}

#[tokio::test]
async fn legacy_mode_deletes_pods_and_attachments_then_detaches() {
    let w = World::stopped();
    w.cluster.pod(NODE, "db-0");
    let p = Policy {
        mode: ModeSetting::Legacy,
        ..policy()
    };
    let report = w.fence(&p).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!((r.pods_deleted, r.attachments_deleted), (1, 1));
    assert_eq!(w.out_of_service_taints(NODE), 0, "no taint in legacy mode");
    assert_eq!(w.cluster.pods(NODE), 0);
    assert!(w.cluster.attachments().is_empty());
    assert_eq!(
        w.cloud.volume_state(&volume(1)),
        Some(VolumeState::Available)
    );
    assert_eq!(
        w.cluster.events(NODE),
        [
            "FencedLegacy",
            "PodsForceDeleted",
            "VolumeAttachmentsDeleted",
            "VolumesForceDetached"
        ]
    );
    let mark = w.cluster.facts(NODE).and_then(|n| n.fenced).unwrap();
    assert_eq!(mark.volumes, [volume(1)]);
}

/// Issue 20: without the taint, every driver's attachment is held for the
/// attach/detach controller's 6 minutes, so the legacy recipe deletes the
/// node's VolumeAttachments of every CSI driver (naming their uids), not
/// only EBS's, and reports them per driver; a pod that tolerates the taint
/// stays, with its volume's attachment. The taint mode deletes none: the
/// attach/detach controller frees every driver's volumes once the taint is
/// on (shown against the real controllers in `tests/`).
#[tokio::test]
async fn legacy_mode_frees_the_attachments_of_every_csi_driver() {
    let w = World::stopped();
    w.cluster
        .driver_attachment(NODE, "cstor.csi.openebs.io", "pv-db");
    w.cluster
        .driver_attachment(NODE, "iscsi.csi.example.com", "pv-target");
    w.cluster
        .driver_attachment("another-node", "cstor.csi.openebs.io", "pv-other");
    w.cluster
        .pod_with_claim(NODE, "db-0", false, Some("claim-pv-db"));
    w.cluster
        .pod_with_claim(NODE, "iscsi-target", true, Some("claim-pv-target"));
    let legacy = Policy {
        mode: ModeSetting::Legacy,
        ..policy()
    };
    let report = w.fence(&legacy).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!((r.pods_deleted, r.attachments_deleted), (1, 2), "{r:#?}");
    let attachments: Vec<(&str, &str, AttachmentOutcome)> = r
        .attachments
        .iter()
        .map(|a| (a.attachment.as_str(), a.driver.as_str(), a.outcome))
        .collect();
    let ebs = format!("csi-{}", volume(1));
    assert_eq!(
        attachments,
        [
            (ebs.as_str(), "ebs.csi.aws.com", AttachmentOutcome::Deleted),
            (
                "va-pv-db",
                "cstor.csi.openebs.io",
                AttachmentOutcome::Deleted
            ),
            (
                "va-pv-target",
                "iscsi.csi.example.com",
                AttachmentOutcome::Kept
            ),
        ]
    );
    assert!(
        r.reason
            .contains("(cstor.csi.openebs.io 1, ebs.csi.aws.com 1)"),
        "{}",
        r.reason
    );
    assert_eq!(w.cluster.attachments(), ["va-pv-target", "va-pv-other"]);
    assert_eq!(w.cluster.pods(NODE), 1, "the tolerating pod stays");
    let deletes: Vec<String> = w
        .calls
        .log()
        .into_iter()
        .filter(|c| c.starts_with("Delete"))
        .collect();
    assert_eq!(
        deletes,
        [
            "DeletePod db-0".to_owned(),
            format!("DeleteVolumeAttachment {ebs}"),
            "DeleteVolumeAttachment va-pv-db".to_owned(),
        ]
    );
    assert_eq!(
        w.cloud.volume_state(&volume(1)),
        Some(VolumeState::Available),
        "EBS volumes are still force-detached"
    );

    let w = World::stopped();
    w.cluster
        .driver_attachment(NODE, "cstor.csi.openebs.io", "pv-db");
    w.cluster
        .pod_with_claim(NODE, "db-0", false, Some("claim-pv-db"));
    let report = w.fence(&policy()).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert!(r.attachments.is_empty(), "{r:#?}");
    assert_eq!(w.cluster.attachments().len(), 2);
    assert!(
        !w.calls
            .log()
            .iter()
            .any(|c| c.starts_with("DeleteVolumeAttachment"))
    );
}

#[tokio::test]
async fn a_volume_still_attached_after_the_wait_fails_the_node() {
    let w = World::stopped();
    w.cloud.stick(&volume(1));
    let report = w.fence(&policy()).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Failed, "{report:#?}");
    assert_eq!(r.volumes[0].outcome, VolumeOutcome::Stuck);
    assert_eq!(
        r.volumes[0].detail.as_deref(),
        Some("not available after 0s")
    );
    assert!(report.incomplete());
}

#[tokio::test]
async fn a_volume_attached_elsewhere_is_not_detached() {
    let w = World::stopped();
    w.cloud
        .attached_volume(&volume(1), &instance(9), "/dev/xvdba");
    let report = w.fence(&policy()).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(r.volumes[0].outcome, VolumeOutcome::AlreadyDetached);
    assert!(!w.calls.log().iter().any(|c| c.starts_with("DetachVolume")));
}

#[tokio::test]
async fn a_fenced_node_back_up_is_recovered_and_its_taint_removed() {
    let w = World::stopped();
    w.fence(&policy()).await.unwrap();
    assert_eq!(w.out_of_service_taints(NODE), 1);
    w.back_up();
    w.assert_recovered(&w.recover(&policy(), Intent::Recover).await);
    assert_eq!(
        w.cluster.events(NODE).last(),
        Some(&"OutOfServiceTaintRemoved")
    );
}

/// Issue 15: Rook/Ceph's pair goes on together and comes off together,
/// once the machine EC2 saw stopped runs again.
#[tokio::test]
async fn the_no_schedule_pair_is_applied_and_removed_together() {
    let w = World::stopped();
    w.cluster.boot(NODE, "boot-1");
    let pair = Policy {
        no_schedule_too: true,
        ..policy()
    };
    w.fence(&pair).await.unwrap();
    assert_eq!(w.out_of_service_taints(NODE), 2);
    let mark = w.cluster.facts(NODE).unwrap().fenced.unwrap();
    assert!(mark.no_schedule);
    assert_eq!(mark.boot_id.as_deref(), Some("boot-1"));
    w.back_up();
    // The same boot id: EC2's `stopped` at fencing is the proof.
    w.assert_recovered(&w.recover(&policy(), Intent::Recover).await);
}

/// Issue 15: with manual recovery a node back up stays fenced until an
/// operator confirms it healthy; a confirmation given early waits for the
/// other rules, and ends that fencing once they allow it.
#[tokio::test]
async fn manual_recovery_waits_for_an_operators_confirmation() {
    let manual = Policy {
        recovery: RecoveryPolicy::Manual,
        ..policy()
    };
    let w = World::stopped();
    w.fence(&manual).await.unwrap();
    w.back_up();
    let report = w.recover(&manual, Intent::Recover).await;
    let r = &report.recoveries[0];
    assert_eq!(r.outcome, RecoveryOutcome::Kept, "{report:#?}");
    assert!(
        matches!(r.hold, Some(Hold::AwaitingConfirmation { .. })),
        "{report:#?}"
    );
    assert_eq!(w.out_of_service_taints(NODE), 1);

    w.assert_recovered(&w.recover(&manual, Intent::Confirm).await);
    assert!(w.cluster.events(NODE).contains(&"RecoveryConfirmed"));

    // Confirmed while the instance is still stopped: held by the other
    // rules, then ended by a routine look once they allow it.
    let w = World::stopped();
    w.fence(&manual).await.unwrap();
    let report = w.recover(&manual, Intent::Confirm).await;
    assert!(
        matches!(
            report.recoveries[0].hold,
            Some(Hold::InstanceNotRunning { .. })
        ),
        "{report:#?}"
    );
    assert!(w.cluster.facts(NODE).unwrap().fenced.unwrap().confirmed);
    assert_eq!(w.out_of_service_taints(NODE), 1);
    w.back_up();
    w.assert_recovered(&w.recover(&manual, Intent::Recover).await);
}

/// Every call of the seed scenario failing in turn, one at a time: whatever
/// fails, no volume is freed from a Node without the taint, nothing is
/// written once a confirmation failed, the work left is reported (so Lambda
/// retries), and the retry (the same event under the same request id, as
/// Lambda retries it) converges to one taint, a free volume and exactly one
/// `OutOfServiceTaintApplied` Event: none lost, none twice (issue 12, item 12).
#[tokio::test]
async fn every_call_failing_in_turn_leaves_a_safe_state_and_the_retry_converges() {
    // Over every Node, and over the Node read by name with a census.
    let by_name = || {
        let w = World::stopped().named(1, NODE);
        w.cluster.census(census(0));
        w
    };
    for world in [World::stopped, by_name, World::stopped_recorded] {
        fail_each_call_in_turn(world).await;
    }
}

/// Issue 19: a Node that records its volumes has its attachments and their
/// PersistentVolumes read by name; no list of either is read.
#[tokio::test]
async fn a_node_that_records_its_volumes_has_them_read_by_name() {
    let w = World::stopped_recorded();
    let report = w.fence(&policy()).await.unwrap();
    let r = &report.results[0];
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    assert_eq!(r.volumes.len(), 1, "{report:#?}");
    assert_eq!(
        w.cloud.volume_state(&volume(1)),
        Some(VolumeState::Available)
    );
    let log = w.calls.log();
    let lists: Vec<_> = log
        .iter()
        .filter(|c| *c == "ListVolumeAttachments" || *c == "ListPersistentVolumes")
        .collect();
    assert!(lists.is_empty(), "{log:?}");
    let attachment = crate::core::volumes::attachment_name(
        &crate::core::facts::CsiVolume {
            driver: crate::core::volumes::EBS_CSI_DRIVER.into(),
            handle: volume(1).to_string(),
        },
        NODE,
    );
    for read in [
        format!("GetVolumeAttachment {attachment}"),
        format!("GetPersistentVolume pv-{}", volume(1)),
    ] {
        assert!(log.contains(&read), "{read} missing from {log:?}");
    }

    // A read by name that fails (a role without `get`, say): the lists.
    let w = World::stopped_recorded();
    let get = log
        .iter()
        .position(|c| c.starts_with("GetVolumeAttachment"));
    w.calls.fail_at(get);
    let report = w.fence(&policy()).await.unwrap();
    assert_eq!(report.results[0].outcome, Outcome::Fenced, "{report:#?}");
    assert!(!report.incomplete(), "{report:#?}");
    assert!(w.calls.log().contains(&"ListVolumeAttachments".to_owned()));
    assert_eq!(
        w.cloud.volume_state(&volume(1)),
        Some(VolumeState::Available)
    );
}

async fn fail_each_call_in_turn(world: fn() -> World) {
    let baseline = world();
    baseline.fence(&policy()).await.unwrap();
    let calls = baseline.calls.log();
    assert!(calls.len() > 10, "{calls:?}");
    for (k, failed) in calls.iter().enumerate() {
        let w = world();
        w.calls.fail_at(Some(k));
        let result = w.fence_as("request-1").await;
        let log = w.calls.log();
        assert_eq!(log.get(k), Some(failed), "the same path up to the fault");

        let freed = w.cloud.volume_state(&volume(1)) == Some(VolumeState::Available);
        assert!(
            !freed || w.out_of_service_taints(NODE) == 1,
            "call {k} ({failed}) failing freed a volume of an untainted node"
        );
        if failed == "DescribeInstances" {
            let after: Vec<_> = log[k..]
                .iter()
                .filter(|c| c.starts_with("TaintNode") || c.starts_with("DetachVolume"))
                .collect();
            assert!(
                after.is_empty(),
                "acted after a failed confirmation: {after:?}"
            );
        }
        // A failed read by name, of the census or of the labelled Nodes
        // falls back to reading every Node; a failed read of an attachment
        // or a volume by name, to the lists.
        let benign = failed.starts_with("CreateEvent")
            || failed == "ReleaseLease"
            || failed.starts_with("GetNode")
            || failed == "GetCensus"
            || failed == "ListFencedNodes"
            || failed.starts_with("GetVolumeAttachment")
            || failed.starts_with("GetPersistentVolume");
        match &result {
            Err(_) => {}
            Ok(report) => assert!(
                benign || report.incomplete(),
                "call {k} ({failed}) failing was reported done: {report:#?}"
            ),
        }

        w.calls.fail_at(None);
        let again = w.fence_as("request-1").await.unwrap();
        let r = &again.results[0];
        assert!(
            matches!(r.outcome, Outcome::Fenced | Outcome::AlreadyFenced),
            "call {k} ({failed}): the retry did not converge: {again:#?}"
        );
        assert!(!again.incomplete(), "call {k} ({failed})");
        assert_eq!(w.out_of_service_taints(NODE), 1, "call {k} ({failed})");
        assert_eq!(
            w.cloud.volume_state(&volume(1)),
            Some(VolumeState::Available)
        );
        let applied = w
            .cluster
            .events(NODE)
            .iter()
            .filter(|e| **e == "OutOfServiceTaintApplied")
            .count();
        assert_eq!(
            applied, 1,
            "call {k} ({failed}): the taint recorded {applied} times"
        );
    }
}

/// Active fencing on, with a short wait for a powered-off machine to stop.
fn active() -> Policy {
    Policy {
        active_fencing: Some(ActiveFencing {
            wait: Duration::from_millis(50),
            ..ActiveFencing::default()
        }),
        ..policy()
    }
}

/// An operator's `fence --power-off NODE`.
fn power_off() -> Batch {
    Batch {
        suspects: vec![Suspect {
            target: NodeRef::Name(crate::core::names::NodeName::parse(NODE).unwrap()),
            intent: Intent::PowerOff,
            origin: Origin::Direct,
        }],
        ..Batch::default()
    }
}

impl World {
    /// A hung node: silent for long, its machine running; two healthy ones.
    fn hung() -> Self {
        let w = Self::new()
            .with_node(NODE, 1, InstanceState::Running, "Unknown")
            .with_node("healthy-2", 2, InstanceState::Running, "True")
            .with_node("healthy-3", 3, InstanceState::Running, "True");
        w.cluster.boot(NODE, "boot-1");
        w
    }

    fn stops(&self) -> usize {
        self.calls
            .log()
            .iter()
            .filter(|c| c.starts_with("StopInstances"))
            .count()
    }

    fn power_report(report: &Report) -> crate::core::power::PowerReport {
        report
            .results
            .iter()
            .find(|r| r.node.as_deref() == Some(NODE))
            .and_then(|r| r.power_off.clone())
            .expect("a power-off report for the node")
    }
}

/// Issue 15: a hung node whose machine EC2 still calls running is powered
/// off under the Lease, waited for until EC2 reports it stopped, then fenced
/// through the usual path with its own confirmations.
#[tokio::test]
async fn a_hung_node_is_powered_off_then_fenced_as_a_stopped_one() {
    let w = World::hung();
    w.cloud.checks(&instance(1), "impaired", "ok");
    let report = w
        .run(&active(), crate::core::trigger::direct::sweep())
        .await
        .unwrap();
    let r = report
        .results
        .iter()
        .find(|r| r.node.as_deref() == Some(NODE))
        .unwrap();
    assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
    let power = World::power_report(&report);
    assert_eq!(power.outcome, PowerOutcome::Stopped, "{report:#?}");
    assert_eq!(
        power.status_checks.as_ref().map(|c| c.instance.as_str()),
        Some("impaired")
    );
    assert!(!report.incomplete(), "{report:#?}");
    assert_eq!(
        w.cloud.instance_state(&instance(1)),
        Some(InstanceState::Stopped)
    );
    assert_eq!(w.out_of_service_taints(NODE), 1);
    assert_eq!(
        w.cloud.volume_state(&volume(1)),
        Some(VolumeState::Available)
    );
    let mark = w.cluster.facts(NODE).unwrap().power.powered_off.unwrap();
    assert_eq!(mark.boot_id.as_deref(), Some("boot-1"));
    assert_eq!(w.cluster.events(NODE)[0], "PoweredOff");
    let log = w.calls.log();
    let at = |what: &str| log.iter().position(|c| c.starts_with(what)).unwrap();
    let stop = at("StopInstances");
    // Under the Lease: the Nodes and EC2 read again right before the stop,
    // and the mark written before it (issue 33, item 9), so that another
    // invocation counts the power-off under the cap while it is in flight.
    assert_eq!(
        log[..stop]
            .iter()
            .rev()
            .take(4)
            .cloned()
            .collect::<Vec<_>>(),
        [
            format!("MarkPoweredOff {NODE}"),
            "DescribeInstances".into(),
            "ListNodes".into(),
            "AcquireLease".into()
        ],
        "{log:?}"
    );
    let taint = at("TaintNode");
    assert!(stop < taint, "{log:?}");
    assert!(
        log[stop..taint]
            .iter()
            .filter(|c| *c == "DescribeInstances")
            .count()
            >= 2,
        "seen stopped, then confirmed again before the taint: {log:?}"
    );
    assert_eq!(w.stops(), 1);
    for healthy in ["healthy-2", "healthy-3"] {
        assert_eq!(w.out_of_service_taints(healthy), 0);
    }
}

#[tokio::test]
async fn with_active_fencing_off_a_hung_node_is_left_running() {
    let w = World::hung();
    let report = w
        .run(&policy(), crate::core::trigger::direct::sweep())
        .await
        .unwrap();
    assert_eq!(w.stops(), 0);
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert!(report.results.iter().all(|r| r.power_off.is_none()));
    // An operator who asks hears why.
    let report = w.run(&policy(), power_off()).await.unwrap();
    assert_eq!(
        World::power_report(&report).refusal,
        Some(Refusal::Disabled)
    );
    assert_eq!(w.stops(), 0);
    assert_eq!(
        w.cloud.instance_state(&instance(1)),
        Some(InstanceState::Running)
    );
}

#[tokio::test]
async fn a_node_that_reports_again_before_the_stop_is_left_running() {
    let w = World::hung();
    // The Nodes read under the Lease show it Ready.
    w.cluster.ready_from_list(NODE, 2);
    let report = w.run(&active(), power_off()).await.unwrap();
    assert_eq!(w.stops(), 0, "{:?}", w.calls.log());
    assert_eq!(
        World::power_report(&report).refusal,
        Some(Refusal::NodeReady)
    );
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert!(w.cluster.lease().is_none(), "the Lease is released");
}

#[tokio::test]
async fn the_partition_guard_refuses_when_many_nodes_go_dark_at_once() {
    let w = World::hung()
        .with_node("dark-4", 4, InstanceState::Running, "Unknown")
        .with_node("dark-5", 5, InstanceState::Running, "Unknown");
    let report = w
        .run(&active(), crate::core::trigger::direct::sweep())
        .await
        .unwrap();
    assert_eq!(w.stops(), 0);
    let refusals: Vec<_> = report
        .results
        .iter()
        .filter_map(|r| r.power_off.as_ref()?.refusal.clone())
        .collect();
    assert_eq!(refusals.len(), 3, "{report:#?}");
    assert!(
        refusals.iter().all(|r| matches!(
            r,
            Refusal::Partition {
                dark: 3,
                nodes: 5,
                ..
            }
        )),
        "{refusals:?}"
    );
    assert!(
        report
            .results
            .iter()
            .filter_map(|r| r.power_off.as_ref())
            .all(|p| p.not_ready_for.is_some()),
        "a refusal says how long the node was NotReady: {report:#?}"
    );
    assert_eq!(w.cluster.events(NODE), ["PowerOffRefused"]);
    assert!(w.writes().iter().all(|c| c.starts_with("CreateEvent")));
}

#[tokio::test]
async fn the_kill_switch_and_a_dry_run_only_plan_a_power_off() {
    for dry in [true, false] {
        let w = World::hung();
        let policy = if dry {
            Policy {
                dry_run: true,
                ..active()
            }
        } else {
            w.cluster.set_kill_switch(KillSwitch::On);
            active()
        };
        let report = w.run(&policy, power_off()).await.unwrap();
        assert_eq!(
            World::power_report(&report).outcome,
            PowerOutcome::Planned,
            "{report:#?}"
        );
        assert_eq!(w.writes(), Vec::<String>::new());
    }
}

#[tokio::test]
async fn the_cap_counts_the_node_about_to_be_powered_off() {
    let w = World::hung();
    w.cluster.taint_by_hand("healthy-2");
    let capped = Policy {
        max_out_of_service: 1,
        ..active()
    };
    let report = w.run(&capped, power_off()).await.unwrap();
    assert_eq!(w.stops(), 0);
    assert_eq!(
        World::power_report(&report).refusal,
        Some(Refusal::CapReached { limit: 1, taken: 1 })
    );
}

/// A stop EC2 accepts but does not complete within the wait: no taint, the
/// invocation reports work left (Lambda retries it), and the retry fences
/// once EC2 reports the machine stopped, without stopping it again.
#[tokio::test]
async fn a_stop_that_does_not_complete_in_time_fails_for_retry_untainted() {
    let w = World::hung();
    w.cloud.stop_hangs(&instance(1));
    let report = w.run(&active(), power_off()).await.unwrap();
    assert_eq!(
        World::power_report(&report).outcome,
        PowerOutcome::StopPending
    );
    assert!(report.incomplete(), "{report:#?}");
    assert_eq!(w.out_of_service_taints(NODE), 0);
    assert!(!w.calls.log().iter().any(|c| c.starts_with("DetachVolume")));

    w.cloud.instance(&instance(1), InstanceState::Stopped);
    let again = w.run(&active(), power_off()).await.unwrap();
    assert_eq!(again.results[0].outcome, Outcome::Fenced, "{again:#?}");
    assert_eq!(w.stops(), 1);
}

/// Never twice without a recovery in between: a machine powered off, then
/// started by someone, whose kubelet never reported again, is not powered
/// off a second time; once the kubelet reported a new boot, it may be.
#[tokio::test]
async fn a_node_is_not_powered_off_twice_without_booting_in_between() {
    let w = World::hung();
    w.run(&active(), power_off()).await.unwrap();
    assert_eq!(w.stops(), 1);
    w.cloud.instance(&instance(1), InstanceState::Running);
    let report = w.run(&active(), power_off()).await.unwrap();
    assert!(
        matches!(
            World::power_report(&report).refusal,
            Some(Refusal::PoweredOffBefore { .. })
        ),
        "{report:#?}"
    );
    assert_eq!(w.stops(), 1);
    w.cluster.boot(NODE, "boot-2");
    let report = w.run(&active(), power_off()).await.unwrap();
    assert_eq!(
        World::power_report(&report).outcome,
        PowerOutcome::Stopped,
        "{report:#?}"
    );
    assert_eq!(w.stops(), 2);
}

/// Every call of a power-off failing in turn: nothing is tainted while the
/// machine runs, the machine is stopped at most once, and the retry fences.
#[tokio::test]
async fn every_call_failing_in_turn_while_powering_off_stays_safe() {
    let baseline = World::hung();
    baseline.run(&active(), power_off()).await.unwrap();
    let calls = baseline.calls.log();
    let stop = calls
        .iter()
        .position(|c| c.starts_with("StopInstances"))
        .unwrap();
    for (k, failed) in calls.iter().enumerate() {
        let w = World::hung();
        w.calls.fail_at(Some(k));
        let result = w.run_as("request-1", &active(), power_off()).await;
        let log = w.calls.log();
        assert_eq!(log.get(k), Some(failed), "the same path up to the fault");
        if let Some(taint) = log.iter().position(|c| c.starts_with("TaintNode")) {
            assert!(
                log[..taint].iter().any(|c| c.starts_with("StopInstances")),
                "call {k} ({failed}): tainted without a stop: {log:?}"
            );
        }
        // Reads with a fallback, and what is only recorded.
        let benign = failed.starts_with("CreateEvent")
            || failed.starts_with("GetNode")
            || failed == "GetCensus"
            || failed == "ListFencedNodes"
            || failed == "DescribeInstanceStatus"
            || failed == "ReleaseLease";
        if k <= stop
            && !benign
            && let Ok(report) = &result
        {
            assert!(
                report.incomplete(),
                "call {k} ({failed}) failing before the stop was reported done: {report:#?}"
            );
        }
        w.calls.fail_at(None);
        let again = w.run_as("request-1", &active(), power_off()).await.unwrap();
        assert_eq!(
            again.results[0].outcome,
            Outcome::Fenced,
            "call {k} ({failed}): the retry did not converge: {again:#?}"
        );
        assert_eq!(
            w.stops(),
            if failed.starts_with("StopInstances") {
                2
            } else {
                1
            },
            "call {k} ({failed})"
        );
        assert_eq!(w.out_of_service_taints(NODE), 1);
        assert_eq!(
            w.cloud.volume_state(&volume(1)),
            Some(VolumeState::Available)
        );
    }
}
