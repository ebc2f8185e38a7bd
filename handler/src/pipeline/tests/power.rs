//! Active fencing: a hung node powered off, then fenced; and every guard
//! that refuses it. Each test holds on EC2 and on Compute Engine alike
//! (issue 36): the guards know no cloud, only the shell does.

use super::*;

/// Issue 15: a hung node whose machine the cloud still calls running is
/// powered off under the Lease, waited for until the cloud reports it
/// stopped, then fenced through the usual path with its own confirmations;
/// issue 36: a hung GKE node on its Compute Engine VM the same way.
#[tokio::test]
async fn a_hung_node_is_powered_off_then_fenced_as_a_stopped_one() {
    for on in CLOUDS {
        let w = World::hung_on(on);
        w.cloud.checks(&w.instance(1), "impaired", "ok");
        let report = w
            .run(&active(), crate::core::inbound::trigger::direct::sweep())
            .await
            .unwrap();
        let r = World::seed_report(&report);
        assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
        let power = World::power_report(&report);
        assert_eq!(power.outcome, PowerOutcome::Stopped, "{report:#?}");
        assert_eq!(
            power.status_checks.as_ref().map(|c| c.instance.as_str()),
            Some("impaired")
        );
        assert!(!report.incomplete(), "{report:#?}");
        assert_eq!(
            w.cloud.instance_state(&w.instance(1)),
            Some(InstanceState::Stopped)
        );
        assert_eq!(w.out_of_service_taints(NODE), 1);
        assert_eq!(
            w.cloud.volume_state(&w.volume(1)),
            Some(VolumeState::Available)
        );
        let mark = w.cluster.facts(NODE).unwrap().power.powered_off.unwrap();
        assert_eq!(mark.boot_id.as_deref(), Some("boot-1"));
        // The stop names this power-off by its mark (Compute Engine's
        // request id is derived from it: a retried call is one stop).
        assert_eq!(w.cloud.power_offs(), [(w.instance(1), mark.at)], "{on:?}");
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
}

#[tokio::test]
async fn with_active_fencing_off_a_hung_node_is_left_running() {
    for on in CLOUDS {
        let w = World::hung_on(on);
        let report = w
            .run(&policy(), crate::core::inbound::trigger::direct::sweep())
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
            w.cloud.instance_state(&w.instance(1)),
            Some(InstanceState::Running)
        );
    }
}

#[tokio::test]
async fn a_node_that_reports_again_before_the_stop_is_left_running() {
    for on in CLOUDS {
        let w = World::hung_on(on);
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
}

#[tokio::test]
async fn the_partition_guard_refuses_when_many_nodes_go_dark_at_once() {
    for on in CLOUDS {
        let w = World::hung_on(on)
            .with_node("dark-4", 4, InstanceState::Running, "Unknown")
            .with_node("dark-5", 5, InstanceState::Running, "Unknown");
        let report = w
            .run(&active(), crate::core::inbound::trigger::direct::sweep())
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
}

#[tokio::test]
async fn the_kill_switch_and_a_dry_run_only_plan_a_power_off() {
    for on in CLOUDS {
        for dry in [true, false] {
            let w = World::hung_on(on);
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
}

#[tokio::test]
async fn the_cap_counts_the_node_about_to_be_powered_off() {
    for on in CLOUDS {
        let w = World::hung_on(on);
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
}

/// Found by the simulator (seed 157869281913181194, cap 1): the power-off
/// mark takes the cap's room, and the fencing that follows must take that
/// same room over, not ask for more. Before, the Node's own mark refused
/// its taint (`cap_reached`), in this invocation and every later one: the
/// machine stayed off and its volume held for good. A retry that finds the
/// machine stopped and the Node marked fences it too.
#[tokio::test]
async fn with_a_cap_of_one_a_node_powered_off_is_fenced_in_its_own_room() {
    for on in CLOUDS {
        let capped = Policy {
            max_out_of_service: 1,
            ..active()
        };
        let w = World::hung_on(on);
        let report = w.run(&capped, power_off()).await.unwrap();
        assert_eq!(
            World::power_report(&report).outcome,
            PowerOutcome::Stopped,
            "{report:#?}"
        );
        let r = World::seed_report(&report);
        assert_eq!(r.outcome, Outcome::Fenced, "{report:#?}");
        assert_eq!(w.out_of_service_taints(NODE), 1);

        // The stop completes after the wait: the retry fences it.
        let w = World::hung_on(on);
        w.cloud.stop_hangs(&w.instance(1));
        w.run(&capped, power_off()).await.unwrap();
        assert_eq!(w.out_of_service_taints(NODE), 0);
        w.cloud.instance(&w.instance(1), InstanceState::Stopped);
        let again = w
            .run(&capped, crate::core::inbound::trigger::direct::sweep())
            .await
            .unwrap();
        let r = World::seed_report(&again);
        assert_eq!(r.outcome, Outcome::Fenced, "{again:#?}");
        assert_eq!(w.out_of_service_taints(NODE), 1);
    }
}

/// A stop EC2 accepts but does not complete within the wait: no taint, the
/// invocation reports work left (Lambda retries it), and the retry fences
/// once EC2 reports the machine stopped, without stopping it again.
#[tokio::test]
async fn a_stop_that_does_not_complete_in_time_fails_for_retry_untainted() {
    for on in CLOUDS {
        let w = World::hung_on(on);
        w.cloud.stop_hangs(&w.instance(1));
        let report = w.run(&active(), power_off()).await.unwrap();
        assert_eq!(
            World::power_report(&report).outcome,
            PowerOutcome::StopPending
        );
        assert!(report.incomplete(), "{report:#?}");
        assert_eq!(w.out_of_service_taints(NODE), 0);
        assert!(!w.calls.log().iter().any(|c| c.starts_with("DetachVolume")));

        w.cloud.instance(&w.instance(1), InstanceState::Stopped);
        let again = w.run(&active(), power_off()).await.unwrap();
        assert_eq!(again.results[0].outcome, Outcome::Fenced, "{again:#?}");
        assert_eq!(w.stops(), 1);
    }
}

/// Never twice without a recovery in between: a machine powered off, then
/// started by someone, whose kubelet never reported again, is not powered
/// off a second time; once the kubelet reported a new boot, it may be.
#[tokio::test]
async fn a_node_is_not_powered_off_twice_without_booting_in_between() {
    for on in CLOUDS {
        let w = World::hung_on(on);
        w.run(&active(), power_off()).await.unwrap();
        assert_eq!(w.stops(), 1);
        w.cloud.instance(&w.instance(1), InstanceState::Running);
        // Started again after the mark, as the cloud records it: the mark
        // took effect and stands, however long ago it was written.
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        w.cloud
            .describe_as(&w.instance(1), |f| f.started_at = Some(now + 1));
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
}

/// Issue 58, item 7: a process that died between the power-off mark and
/// the stop left the Node refused `PoweredOffBefore` for ever. Once
/// `POWER_OFF_WAIT` has passed, with the machine running the boot the mark
/// recorded and started before it, the mark lapses with a Warning and the
/// machine is powered off; where the cloud records no start, the mark
/// stands.
#[tokio::test]
async fn a_power_off_mark_whose_stop_never_came_lapses_after_the_wait() {
    use crate::core::outbound::kube_patch::PowerStamp;
    use crate::shell::cluster::FencingWrites;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let stamp = PowerStamp {
        at: k8s_openapi::jiff::Timestamp::from_second(now - 5)
            .unwrap()
            .to_string(),
        boot_id: Some("boot-1".into()),
        reason: "an earlier invocation that died before its stop".into(),
    };
    for on in CLOUDS {
        for started_at in [Some(now - 3600), None] {
            let w = World::hung_on(on);
            w.cloud
                .describe_as(&w.instance(1), |f| f.started_at = started_at);
            w.cluster.mark_powered_off(NODE, &stamp).await.unwrap();
            let report = w.run(&active(), power_off()).await.unwrap();
            let power = World::power_report(&report);
            if started_at.is_some() {
                assert_eq!(power.outcome, PowerOutcome::Stopped, "{report:#?}");
                assert_eq!(w.stops(), 1);
                assert_eq!(w.cluster.events(NODE)[0], "PowerOffLapsed");
            } else {
                assert!(
                    matches!(power.refusal, Some(Refusal::PoweredOffBefore { .. })),
                    "{report:#?}"
                );
                assert_eq!(w.stops(), 0);
                assert!(!w.cluster.events(NODE).contains(&"PowerOffLapsed"));
            }
        }
    }
}

/// Issue 33, item 1: a second Node names the hung node's machine (a
/// re-registration under a new name; outside EKS nothing deletes the stale
/// Node). The machine is neither powered off nor, once stopped, fenced:
/// which Node runs on it is a question for a person.
#[tokio::test]
async fn a_machine_two_nodes_name_is_neither_powered_off_nor_fenced() {
    for on in CLOUDS {
        let w = World::hung_on(on);
        w.cluster
            .node("ip-10-0-1-17.reregistered", &w.instance(1), "True");
        w.sweep_refused("shared_machine").await;
        assert!(w.cluster.events(NODE).contains(&"PowerOffRefused"));
        // Stopped by someone: still no fencing of either Node.
        w.cloud.instance(&w.instance(1), InstanceState::Stopped);
        let report = w.fence(&active()).await.unwrap();
        assert!(
            report.results.iter().all(|r| r.outcome == Outcome::Skipped),
            "{report:#?}"
        );
        assert_eq!(
            report.results[0].skip.as_ref().map(Skip::code),
            Some("shared_machine")
        );
        assert_eq!(w.out_of_service_taints(NODE), 0);
        assert!(w.cluster.events(NODE).contains(&"FencingRefused"));
    }
}

/// Issue 33, item 7: a hung control-plane Node's machine may hold an etcd
/// member whose loss breaks quorum: not powered off unless configured.
#[tokio::test]
async fn a_control_plane_node_is_powered_off_only_when_configured() {
    for on in CLOUDS {
        let w = World::hung_on(on);
        w.cluster
            .label(NODE, "node-role.kubernetes.io/control-plane", "");
        w.sweep_refused("control_plane").await;
        let mut allowed = active();
        if let Some(a) = allowed.active_fencing.as_mut() {
            a.control_plane = true;
        }
        let report = w
            .run(&allowed, crate::core::inbound::trigger::direct::sweep())
            .await
            .unwrap();
        assert_eq!(w.stops(), 1, "{report:#?}");
    }
}

/// Issue 33, design note: a kubelet that reports `Ready=False` is alive;
/// only a silent one (`Ready=Unknown`) counts toward a power-off.
#[tokio::test]
async fn a_kubelet_that_reports_not_ready_is_not_powered_off() {
    for on in CLOUDS {
        let w = World::on(on)
            .with_node(NODE, 1, InstanceState::Running, "False")
            .with_node("healthy-2", 2, InstanceState::Running, "True")
            .with_node("healthy-3", 3, InstanceState::Running, "True");
        let report = w.run(&active(), power_off()).await.unwrap();
        assert_eq!(w.stops(), 0, "{report:#?}");
        assert_eq!(
            World::power_report(&report).refusal.map(|r| r.code()),
            Some("kubelet_reporting")
        );
    }
}

/// Issue 33, item 10: a power-off in flight (marked, not fenced yet) takes
/// room under the taint's cap too: another stopped node is refused.
#[tokio::test]
async fn a_power_off_in_flight_takes_room_under_the_taints_cap() {
    for on in CLOUDS {
        let w = World::hung_on(on);
        w.cloud.stop_hangs(&w.instance(1));
        let one = Policy {
            max_out_of_service: 1,
            ..active()
        };
        let report = w.run(&one, power_off()).await.unwrap();
        assert_eq!(w.stops(), 1, "{report:#?}");
        assert_eq!(w.out_of_service_taints(NODE), 0, "still stopping");
        let w = w.with_node("stopped-4", 4, InstanceState::Stopped, "Unknown");
        let report = w
            .run(&one, batch(Intent::Fence, &[w.instance(4)]))
            .await
            .unwrap();
        assert_eq!(
            report.results[0].skip.as_ref().map(Skip::code),
            Some("cap_reached"),
            "{report:#?}"
        );
        assert_eq!(w.out_of_service_taints("stopped-4"), 0);
    }
}

/// Issue 33, item 5: the wait for a powered-off machine to stop is a wait
/// like any other: the kill switch turned on during it leaves the machine
/// stopped and untainted, its volumes attached.
#[tokio::test]
async fn the_kill_switch_turned_on_while_a_machine_stops_stops_what_follows() {
    for on in CLOUDS {
        let w = World::hung_on(on);
        w.cloud.stop_hangs(&w.instance(1));
        // Stopped on the fourth look: the decision's, the one under the Lease,
        // and the wait's first, then a pause.
        w.cloud
            .on_describe(4, &w.instance(1), InstanceState::Stopped);
        w.cluster.kill_switch_from_read(2, KillSwitch::On);
        let report = w.run(&active(), power_off()).await.unwrap();
        assert_eq!(w.stops(), 1, "{report:#?}");
        assert!(report.kill_switch && report.dry_run, "{report:#?}");
        assert_eq!(report.results[0].outcome, Outcome::Planned, "{report:#?}");
        assert_eq!(w.out_of_service_taints(NODE), 0);
        assert!(
            !w.calls
                .log()
                .iter()
                .any(|c| c.starts_with("DetachVolume") || c.starts_with("DeletePod")),
            "{:?}",
            w.calls.log()
        );
    }
}

/// Issue 33, item 5: so is the wait for a Node still Ready on a machine
/// off: the kill switch turned on during it, nothing after it is written,
/// not even the power-off of another node in the same batch.
#[tokio::test]
async fn the_kill_switch_turned_on_while_waiting_for_not_ready_stops_what_follows() {
    for on in CLOUDS {
        let w = World::hung_on(on).with_node("ready-4", 4, InstanceState::Stopped, "True");
        w.cluster.not_ready_from_list("ready-4", 2);
        w.cluster.kill_switch_from_read(2, KillSwitch::On);
        // The wait, as when nothing proves the kubelet silent.
        let waits = Policy {
            not_ready_wait: Duration::from_secs(5),
            fast_not_ready: false,
            ..active()
        };
        let mut both = power_off();
        both.suspects
            .extend(batch(Intent::Fence, &[w.instance(4)]).suspects);
        let report = w.run(&waits, both).await.unwrap();
        assert!(report.kill_switch && report.dry_run, "{report:#?}");
        assert_eq!(w.stops(), 0, "{report:#?}");
        assert_eq!(w.out_of_service_taints("ready-4"), 0);
        assert!(w.writes().is_empty(), "{:?}", w.writes());
    }
}

impl World {
    /// A sweep under active fencing that powers nothing off, the hung
    /// node's power-off refused for `code`.
    async fn sweep_refused(&self, code: &str) {
        let report = self
            .run(&active(), crate::core::inbound::trigger::direct::sweep())
            .await
            .unwrap();
        assert_eq!(self.stops(), 0, "{report:#?}");
        assert_eq!(
            World::power_report(&report).refusal.map(|r| r.code()),
            Some(code),
            "{report:#?}"
        );
    }
}

/// `ACTIVE_FENCING=stuck`, at the sweep's pace.
fn stuck_only() -> Policy {
    let mut p = active();
    if let Some(a) = p.active_fencing.as_mut() {
        a.scope = crate::core::rules::power::Scope::Stuck;
    }
    p
}

/// Issue 60: under `stuck`, a hung node one of whose pods holds a volume
/// only one node may attach is powered off and fenced; what is stuck is
/// read only for it, never for a Node no guard would power off.
#[tokio::test]
async fn under_stuck_a_hung_node_whose_pod_holds_its_volume_is_powered_off() {
    for on in CLOUDS {
        let w = World::hung_on(on);
        w.cluster
            .staying_pod(NODE, "db-0", false, Some(&w.volume(1)));
        w.cluster.pod("healthy-2", "web-1");
        let report = w
            .run(
                &stuck_only(),
                crate::core::inbound::trigger::direct::sweep(),
            )
            .await
            .unwrap();
        let power = World::power_report(&report);
        assert_eq!(power.outcome, PowerOutcome::Stopped, "{report:#?}");
        assert_eq!(w.stops(), 1);
        assert_eq!(w.out_of_service_taints(NODE), 1);
        // The power-off says what was stuck.
        let notes = w.cluster.event_notes(NODE).join("\n");
        let held = format!("default/db-0 holds pv-{}, stuck", w.volume(1));
        assert!(notes.contains(&held), "{notes}");
        let log = w.calls.log();
        let at = |what: &str| log.iter().position(|c| c == what);
        let pods = at(&format!("ListPods {NODE}")).expect("its pods read");
        assert!(pods < at("AcquireLease").unwrap(), "{log:?}");
        assert!(at("ListPods healthy-2").is_none(), "{log:?}");
    }
}

/// Issue 60: under `stuck`, a hung node whose pods hold no volume is left
/// to Kubernetes, with a Warning saying why; one whose pods cannot be read
/// is left running too, and a retry reads them again.
#[tokio::test]
async fn under_stuck_a_hung_node_with_nothing_stuck_is_left_to_kubernetes() {
    for on in CLOUDS {
        let w = World::hung_on(on);
        w.cluster.pod(NODE, "web-0");
        let report = w
            .run(
                &stuck_only(),
                crate::core::inbound::trigger::direct::sweep(),
            )
            .await
            .unwrap();
        assert_eq!(
            World::power_report(&report).refusal,
            Some(Refusal::NothingStuck),
            "{report:#?}"
        );
        assert_eq!(w.stops(), 0);
        assert_eq!(w.out_of_service_taints(NODE), 0);
        assert_eq!(w.cluster.events(NODE), ["PowerOffRefused"]);
        let notes = w.cluster.event_notes(NODE).join("\n");
        assert!(notes.contains("nothing is stuck"), "{notes}");
        // The same node under `on` is powered off: the scope refused it.
        let w = World::hung_on(on);
        w.cluster.pod(NODE, "web-0");
        w.run(&active(), crate::core::inbound::trigger::direct::sweep())
            .await
            .unwrap();
        assert_eq!(w.stops(), 1);
    }
    let world = || {
        let w = World::hung_on(On::Ec2);
        w.cluster
            .staying_pod(NODE, "db-0", false, Some(&w.volume(1)));
        w
    };
    let w = world();
    w.run(&stuck_only(), power_off()).await.unwrap();
    let list = w
        .calls
        .log()
        .iter()
        .position(|c| *c == format!("ListPods {NODE}"));
    assert!(list.is_some());
    let w = world();
    w.calls.fail_at(list);
    let report = w.run(&stuck_only(), power_off()).await.unwrap();
    assert_eq!(
        World::power_report(&report).refusal,
        Some(Refusal::PodsUnread),
        "{report:#?}"
    );
    assert_eq!(w.stops(), 0);
}
