use super::*;
use crate::core::model::facts::InstanceFacts;
use crate::core::model::instance::{InstanceId, InstanceState};

const STOP: i64 = 1_795_000_000;

fn seen(state: InstanceState, stopped_at: Option<i64>) -> Confirmation {
    let mut facts = InstanceFacts::bare(InstanceId::parse("i-0123456789abcdef0").unwrap(), state);
    facts.stopped_at = stopped_at;
    Confirmation::Seen(facts)
}

/// A Lease renewed by the kubelet at `renewed` (its clock), last written at
/// `written` and read at `now` by the apiserver's clock, on the default
/// cadence (10 s).
fn lease(renewed: i64, written: Option<i64>, now: Option<i64>) -> LeaseRead {
    LeaseRead {
        lease: KubeletLease::RenewedAt(renewed),
        version: Some("41".into()),
        written_at: written,
        server_now: now,
        renew_every_secs: 10,
    }
}

/// A kubelet with a true clock, silent since `renewed`, read at `now`.
fn honest(renewed: i64, now: i64) -> LeaseRead {
    lease(renewed, Some(renewed), Some(now))
}

fn stopped() -> Confirmation {
    seen(InstanceState::Stopped, Some(STOP))
}

fn judged(read: &LeaseRead, watched: Watched, now: i64) -> Silence {
    judge(&stopped(), false, (read, watched), (None, now))
}

const DUE: i64 = 10 + LATE_RENEWAL_MARGIN_SECS;

fn silent(renewed_at: i64, quiet_secs: i64, clock: ProofClock) -> Silence {
    Silence::Silent(Proof {
        stopped_at: STOP,
        renewed_at,
        quiet_secs,
        renew_every_secs: 10,
        clock,
    })
}

/// The decision table of issues 39 and 58: one row per case they name.
#[test]
fn the_proof_as_a_table() {
    use InstanceState::*;
    let now = STOP + 60;
    let heard = |renewed_at, heard| Silence::HeardAfterStop {
        stopped_at: STOP,
        renewed_at,
        heard,
    };
    let unproven = |why| Silence::Unproven { why };
    let old = honest(STOP - 10, now);
    let rows: Vec<(&str, Confirmation, bool, LeaseRead, Silence)> = vec![
        (
            "silent for 10 s before the stop, 70 s by the apiserver",
            seen(Stopped, Some(STOP)),
            false,
            old.clone(),
            silent(STOP - 10, 70, ProofClock::Apiserver),
        ),
        (
            "terminated counts as off",
            seen(Terminated, Some(STOP)),
            false,
            old.clone(),
            silent(STOP - 10, 70, ProofClock::Apiserver),
        ),
        (
            "renewed exactly the margin before the stop",
            seen(Stopped, Some(STOP)),
            false,
            honest(STOP - SKEW_MARGIN_SECS, now),
            silent(STOP - SKEW_MARGIN_SECS, 65, ProofClock::Apiserver),
        ),
        (
            "renewed one second inside the margin",
            seen(Stopped, Some(STOP)),
            false,
            honest(STOP - SKEW_MARGIN_SECS + 1, now),
            heard(STOP - SKEW_MARGIN_SECS + 1, Heard::RenewTime),
        ),
        (
            "renewed after the stop",
            seen(Stopped, Some(STOP)),
            false,
            honest(STOP + 30, now),
            heard(STOP + 30, Heard::RenewTime),
        ),
        (
            "no stop time",
            seen(Stopped, None),
            false,
            old.clone(),
            unproven(Unproven::NoStopTime),
        ),
        (
            "no Lease",
            seen(Stopped, Some(STOP)),
            false,
            LeaseRead::missing(),
            unproven(Unproven::NoLease),
        ),
        (
            "a Lease never renewed",
            seen(Stopped, Some(STOP)),
            false,
            LeaseRead {
                lease: KubeletLease::NeverRenewed,
                ..old.clone()
            },
            unproven(Unproven::NoRenewal),
        ),
        (
            "a Lease of an earlier Node of the name",
            seen(Stopped, Some(STOP)),
            false,
            LeaseRead {
                lease: KubeletLease::OtherHolder,
                ..old.clone()
            },
            unproven(Unproven::OtherHolder),
        ),
        (
            "hibernated, not fenced by the setting",
            seen(Hibernated, Some(STOP)),
            false,
            old.clone(),
            unproven(Unproven::NotOff),
        ),
        (
            "hibernated, fenced by the setting",
            seen(Hibernated, Some(STOP)),
            true,
            old.clone(),
            silent(STOP - 10, 70, ProofClock::Apiserver),
        ),
        (
            "still stopping",
            seen(Stopping, Some(STOP)),
            false,
            old.clone(),
            unproven(Unproven::NotOff),
        ),
        (
            "running (started again)",
            seen(Running, Some(STOP)),
            false,
            old.clone(),
            unproven(Unproven::NotOff),
        ),
        (
            "a recreated VM: not the Node's machine",
            Confirmation::NotFound,
            false,
            old.clone(),
            unproven(Unproven::NotOff),
        ),
        (
            "the lookup failed",
            Confirmation::LookupFailed {
                error: "throttled".into(),
            },
            false,
            old,
            unproven(Unproven::NotOff),
        ),
    ];
    for (name, confirmation, hibernated, read, want) in rows {
        assert_eq!(
            judge(
                &confirmation,
                hibernated,
                (&read, Watched::Unchanged(Duration::ZERO)),
                (None, now)
            ),
            want,
            "{name}"
        );
    }
}

/// Issue 58, item 1: a live kubelet whose last renewal fell 6 s before the
/// stop was fenced at once. Its next renewal is due 4 s later: until a
/// renewal is overdue by the margin, nothing is proven, on any clock.
#[test]
fn a_renewal_before_the_stop_is_no_proof_until_the_next_one_is_overdue() {
    let renewed = STOP - 6;
    // Read 1 s after the stop: 7 s of quiet by the apiserver's clock.
    let read = honest(renewed, STOP + 1);
    assert_eq!(
        judged(&read, Watched::Unchanged(Duration::ZERO), STOP + 1),
        Silence::NotYetDue {
            after: Duration::from_secs((DUE - 7).unsigned_abs())
        }
    );
    // One second short of overdue, by either clock.
    let short = honest(renewed, renewed + DUE - 1);
    assert!(matches!(
        judged(
            &short,
            Watched::Unchanged(Duration::from_secs(8)),
            STOP + 20
        ),
        Silence::NotYetDue { .. }
    ));
    // Overdue by the margin on the apiserver's clock.
    let overdue = honest(renewed, renewed + DUE);
    assert_eq!(
        judged(&overdue, Watched::Unchanged(Duration::ZERO), STOP + 20),
        silent(renewed, DUE, ProofClock::Apiserver)
    );
    // The live kubelet renews on time: seen, so heard.
    assert!(matches!(
        judged(&short, Watched::Renewed, STOP + 20),
        Silence::HeardAfterStop {
            heard: Heard::Seen,
            ..
        }
    ));
}

/// Issue 58, item 1: a live kubelet whose clock runs 40 s behind stamps
/// every renewal 40 s early, so its `renewTime` always falls before the
/// stop. The apiserver's time of the write does not.
#[test]
fn a_kubelet_whose_clock_runs_behind_is_heard_by_the_apiservers_clock() {
    let written = STOP + 3;
    let skewed = lease(written - 40, Some(written), Some(STOP + 30));
    assert_eq!(
        judged(
            &skewed,
            Watched::Unchanged(Duration::from_secs(60)),
            STOP + 30
        ),
        Silence::HeardAfterStop {
            stopped_at: STOP,
            renewed_at: written - 40,
            heard: Heard::Written {
                written_at: written
            },
        }
    );
    // Within the margin before the stop, as with `renewTime`.
    let close = lease(
        STOP - 60,
        Some(STOP - SKEW_MARGIN_SECS + 1),
        Some(STOP + 30),
    );
    assert!(matches!(
        judged(&close, Watched::Nothing, STOP + 30),
        Silence::HeardAfterStop {
            heard: Heard::Written { .. },
            ..
        }
    ));
}

/// Where the apiserver keeps no managed fields (Kubernetes before 1.18),
/// node-fencer's own clock is the proof: the same version for a renewal
/// interval and the margin.
#[test]
fn without_the_apiservers_time_the_lease_unchanged_on_node_fencers_clock_proves_it() {
    let old = lease(STOP - 30, None, Some(STOP + 5));
    let due = Duration::from_secs(DUE.unsigned_abs());
    assert_eq!(
        judged(&old, Watched::Unchanged(Duration::ZERO), STOP + 5),
        Silence::NotYetDue { after: due }
    );
    assert_eq!(
        judged(&old, Watched::Unchanged(Duration::from_secs(4)), STOP + 9),
        Silence::NotYetDue {
            after: due - Duration::from_secs(4)
        }
    );
    assert_eq!(
        judged(&old, Watched::Unchanged(due), STOP + 20),
        silent(STOP - 30, DUE, ProofClock::NodeFencer)
    );
    assert!(matches!(
        judged(&old, Watched::Renewed, STOP + 20),
        Silence::HeardAfterStop {
            heard: Heard::Seen,
            ..
        }
    ));
    // Nothing to watch and no apiserver time: never proven.
    assert!(matches!(
        judged(&old, Watched::Nothing, STOP + 600),
        Silence::NotYetDue { .. }
    ));
    // The closer clock says when to look again.
    let both = lease(STOP - 30, Some(STOP - 30), Some(STOP - 30 + DUE - 2));
    assert_eq!(
        judged(&both, Watched::Unchanged(Duration::from_secs(1)), STOP + 1),
        Silence::NotYetDue {
            after: Duration::from_secs(2)
        }
    );
}

/// The cadence is the Lease's: a quarter of its duration.
#[test]
fn the_renewal_due_follows_the_leases_duration() {
    let short = LeaseRead {
        renew_every_secs: 2,
        ..honest(STOP - 30, STOP - 30 + 2 + LATE_RENEWAL_MARGIN_SECS)
    };
    assert!(matches!(
        judged(&short, Watched::Nothing, STOP + 1),
        Silence::Silent(Proof {
            renew_every_secs: 2,
            ..
        })
    ));
}

/// Issue 39's next step: EC2 records when the stop was asked for, and a
/// kubelet renews through the shutdown; the `stopped` event's time, when
/// the machine got there, proves it silent.
#[test]
fn a_reported_stop_later_than_the_recorded_one_is_the_reference() {
    let stopped = stopped();
    // Renewed 20 s after the stop request, during the shutdown; the
    // machine was stopped 40 s after the request.
    let now = STOP + 45;
    let read = honest(STOP + 20, now);
    let watched = Watched::Unchanged(Duration::ZERO);
    let judge =
        |c: &Confirmation, r: &LeaseRead, reported| judge(c, false, (r, watched), (reported, now));
    assert!(matches!(
        judge(&stopped, &read, None),
        Silence::HeardAfterStop { .. }
    ));
    assert_eq!(
        judge(&stopped, &read, Some(STOP + 40)),
        Silence::Silent(Proof {
            stopped_at: STOP + 40,
            renewed_at: STOP + 20,
            quiet_secs: 25,
            renew_every_secs: 10,
            clock: ProofClock::Apiserver,
        })
    );
    // A stale event of an earlier stop: the recorded stop is later.
    assert!(matches!(
        judge(&stopped, &read, Some(STOP - 3600)),
        Silence::HeardAfterStop {
            stopped_at: STOP,
            ..
        }
    ));
    // No recorded time: the reported one alone.
    let no_time = seen(InstanceState::Stopped, None);
    assert!(matches!(
        judge(&no_time, &read, Some(STOP + 40)),
        Silence::Silent(Proof { stopped_at, .. }) if stopped_at == STOP + 40
    ));
    // A kubelet renewing after the reported stop is heard.
    let alive = honest(STOP + 44, now);
    assert!(matches!(
        judge(&stopped, &alive, Some(STOP + 40)),
        Silence::HeardAfterStop { .. }
    ));
    // The report never makes a machine off that the cloud does not.
    let running = seen(InstanceState::Running, Some(STOP));
    assert_eq!(
        judge(&running, &read, Some(STOP + 40)),
        Silence::Unproven {
            why: Unproven::NotOff
        }
    );
    // A reported stop in the future is not believed.
    assert!(matches!(
        judge(&stopped, &read, Some(i64::MAX)),
        Silence::HeardAfterStop {
            stopped_at: STOP,
            ..
        }
    ));
}

proptest::proptest! {
    /// Whatever the Lease, the clocks and the watch say, a Node is proven
    /// silent only when a renewal was overdue on a trusted clock and no
    /// write by either clock came after the stop (by the margin); a kubelet
    /// seen renewing is never silent.
    #[test]
    fn silence_needs_an_overdue_renewal_on_a_trusted_clock(
        renewed in -120i64..120,
        written in proptest::option::of(-120i64..120),
        server in proptest::option::of(-60i64..240),
        watched_ms in proptest::option::of(0u64..60_000),
        renewed_seen in proptest::bool::ANY,
        every in 1i64..60,
    ) {
        let read = LeaseRead {
            lease: KubeletLease::RenewedAt(STOP + renewed),
            version: Some("7".into()),
            written_at: written.map(|w| STOP + w),
            server_now: server.map(|s| STOP + s),
            renew_every_secs: every,
        };
        let watched = match (renewed_seen, watched_ms) {
            (true, _) => Watched::Renewed,
            (false, Some(ms)) => Watched::Unchanged(Duration::from_millis(ms)),
            (false, None) => Watched::Nothing,
        };
        let due = every + LATE_RENEWAL_MARGIN_SECS;
        if let Silence::Silent(p) = judged(&read, watched, STOP + 300) {
            proptest::prop_assert!(!renewed_seen);
            proptest::prop_assert!(renewed + SKEW_MARGIN_SECS <= 0);
            proptest::prop_assert!(written.is_none_or(|w| w + SKEW_MARGIN_SECS <= 0));
            let by_apiserver = written.zip(server).is_some_and(|(w, s)| s - w >= due);
            let by_own = watched_ms.is_some_and(|ms| ms >= due.unsigned_abs() * 1000);
            proptest::prop_assert!(by_apiserver || by_own);
            proptest::prop_assert!(p.quiet_secs >= due);
        }
    }
}
