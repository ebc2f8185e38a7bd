//! The cluster-wide controls, kept in the cluster itself: the Lease that
//! serialises fencing across concurrent invocations, and the kill switch
//! that turns every action into a dry run. Pure: the shell reads and writes
//! the objects.

use std::time::Duration;

/// The name of the Lease and of the kill-switch ConfigMap.
pub const OBJECT_NAME: &str = "node-fencer";
/// The Lease in the same namespace where each sweep leaves its census of the
/// Nodes others put out of service (renewed at each count; nobody holds it).
pub const CENSUS_NAME: &str = "node-fencer-census";
/// The census' annotation on it: how many Nodes take room under the cap
/// without node-fencer's label. The count's time is the Lease's `renewTime`.
pub const CENSUS_OTHERS: &str = "node-fencer.io/others-out-of-service";
/// The census' annotation naming the machines more than one Node named when
/// it was counted (`ID=NODE,NODE;...`).
pub const CENSUS_SHARED: &str = "node-fencer.io/shared-machines";
/// The Lease in the same namespace where the witness round that ends each
/// sweep leaves what it told (renewed at each change; nobody holds it), so
/// that the next invocation tells only what changed since.
pub const WITNESS_NAME: &str = "node-fencer-witness";
/// The witness record's annotation on it: the Nodes whose witness fails,
/// with why (`{"node":"reason"}`, `core::rules::witness::record_text`).
pub const WITNESS_FAILING: &str = "node-fencer.io/witness-failing";
/// The annotation on the witness Lease that keeps, across restarts, the
/// UUID each System of the inventory served when last read
/// (`{"redfish://NAME":"UUID"}`).
pub const SYSTEM_UUIDS: &str = "node-fencer.io/system-uuids";
/// The kill switch's key in the ConfigMap's data.
pub const KILL_SWITCH_KEY: &str = "dry-run";
/// How long a Lease is held without renewal before another invocation may
/// take it over (an invocation that died holding it, or could not release
/// it). A holder keeps it for one node list, one EC2 lookup and the taint
/// patches, a few seconds; this is shorter than [`LEASE_WAIT`], so an
/// orphaned Lease delays the next invocation but does not fail it.
pub const LEASE_SECONDS: i32 = 20;
/// How long an invocation waits for the Lease before giving up (retryable).
pub const LEASE_WAIT: Duration = Duration::from_secs(30);

/// How a holder keeps the Lease while it works: it renews it every
/// `renew_every`, and writes a taint only while its last renewal (counted
/// from when the renewal was sent) is younger than `valid_for`. That is
/// shorter than the Lease's duration by a margin for the clocks of two
/// environments and a write in flight, so a holder that cannot renew in
/// time (a slow or unreachable apiserver) stops writing before any other
/// invocation may take the Lease over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTiming {
    /// How often the holder renews.
    pub(crate) renew_every: Duration,
    /// How long one renewal lets the holder write.
    pub(crate) valid_for: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            renew_every: Duration::from_secs(4),
            valid_for: Duration::from_secs(15),
        }
    }
}

/// The Lease as read, reduced to what the decision needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseFacts {
    /// `spec.holderIdentity`; `None` when released.
    pub holder: Option<String>,
    /// `spec.renewTime` (or `acquireTime`), Unix seconds.
    pub renewed: Option<i64>,
    /// `spec.leaseDurationSeconds`.
    pub(crate) duration_secs: Option<i32>,
}

/// What to do about the Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseStep {
    /// It is free, expired or ours: write ourselves in (guarded by its resourceVersion).
    Take,
    /// Another invocation holds it: look again after this long.
    Wait(Duration),
}

/// Decides whether `me` may take the Lease now.
pub fn lease_step(lease: &LeaseFacts, me: &str, now: i64) -> LeaseStep {
    let Some(holder) = lease.holder.as_deref().filter(|h| !h.is_empty()) else {
        return LeaseStep::Take;
    };
    if holder == me {
        return LeaseStep::Take;
    }
    let duration = i64::from(lease.duration_secs.unwrap_or(LEASE_SECONDS).max(1));
    let Some(renewed) = lease.renewed else {
        return LeaseStep::Take;
    };
    let expires = renewed.saturating_add(duration);
    if now >= expires {
        return LeaseStep::Take;
    }
    // Look again soon: holders release as soon as their taints are written.
    let left = u64::try_from(expires - now).unwrap_or(1);
    LeaseStep::Wait(Duration::from_millis(250).min(Duration::from_secs(left)))
}

/// The kill switch's state, from the ConfigMap's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KillSwitch {
    /// No ConfigMap, no key, or `false`: act normally.
    Off,
    /// `true`: every action becomes a dry run.
    On,
    /// A value that is neither: treated as on, and reported.
    Unreadable(String),
}

impl KillSwitch {
    /// Reads the ConfigMap's value; `None` when the ConfigMap or key is missing.
    pub fn from_value(value: Option<&str>) -> Self {
        match value.map(str::trim) {
            None | Some("") => Self::Off,
            Some(v) => match crate::core::model::values::parse_bool(v) {
                Some(true) => Self::On,
                Some(false) => Self::Off,
                None => Self::Unreadable(v.to_owned()),
            },
        }
    }

    /// True when actions must become plans: fail closed on anything but a clear `false`.
    pub fn engaged(&self) -> bool {
        !matches!(self, Self::Off)
    }
}

/// Whether this invocation may still write, and why not. It only ever turns
/// on: once a run is a plan (a dry run, the kill switch on at the start, or
/// on, or unreadable, when read again after a wait), nothing after it writes,
/// whatever a later read says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Switch {
    why: Option<PlanOnly>,
    kill_switch: bool,
    errors: Vec<String>,
}

/// Why an invocation only plans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanOnly {
    /// `DRY_RUN`, a `check`, or a caller's `--dry-run`.
    DryRun,
    /// The cluster's kill switch was on, or unreadable, at the start.
    KillSwitch,
    /// Read again after this wait, the kill switch was on or unreadable.
    TurnedOnDuring(&'static str),
}

impl Switch {
    /// The switch of an invocation that starts as a dry run, or not.
    pub fn new(dry_run: bool) -> Self {
        Self {
            why: dry_run.then_some(PlanOnly::DryRun),
            ..Self::default()
        }
    }

    /// Takes in the kill switch as read (`after`: the wait it followed, or
    /// `None` at the start). A read that failed counts as on, and its error
    /// is kept for the report, so the invocation is retried.
    pub fn read(&mut self, read: Result<KillSwitch, String>, after: Option<&'static str>) {
        let engaged = match read {
            Ok(k) => k.engaged(),
            Err(e) => {
                self.errors.push(match after {
                    None => format!("{e}; every action was a dry run"),
                    Some(_) => format!("{e}; what followed the wait was a dry run"),
                });
                true
            }
        };
        if engaged {
            self.kill_switch = true;
            self.turn_on(after.map_or(PlanOnly::KillSwitch, PlanOnly::TurnedOnDuring));
        }
    }

    /// Turns it on; the first reason stays.
    pub fn turn_on(&mut self, why: PlanOnly) {
        self.why.get_or_insert(why);
    }

    /// True when what follows only plans.
    pub fn is_on(&self) -> bool {
        self.why.is_some()
    }

    /// Why, when it is on.
    pub fn why(&self) -> Option<&PlanOnly> {
        self.why.as_ref()
    }

    /// True when the cluster's kill switch had a part in it (the report's
    /// `kill_switch`).
    pub fn by_kill_switch(&self) -> bool {
        self.kill_switch
    }

    /// The reads that failed, for the report.
    pub fn errors(&self) -> &[String] {
        &self.errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_stops_writing_before_its_lease_can_be_taken() {
        let t = LeaseTiming::default();
        let duration = Duration::from_secs(u64::try_from(LEASE_SECONDS).unwrap());
        // Room for clock skew and a write in flight.
        assert!(t.valid_for + Duration::from_secs(5) <= duration);
        // Two renewals may fail before the right to write runs out.
        assert!(t.renew_every * 3 <= t.valid_for);
        assert!(duration < LEASE_WAIT);
    }

    fn lease(holder: Option<&str>, renewed: Option<i64>) -> LeaseFacts {
        LeaseFacts {
            holder: holder.map(str::to_owned),
            renewed,
            duration_secs: Some(60),
        }
    }

    #[test]
    fn the_lease_is_taken_only_when_free_expired_or_ours() {
        assert_eq!(
            lease_step(&lease(None, Some(990)), "me", 1_000),
            LeaseStep::Take
        );
        assert_eq!(
            lease_step(&lease(Some(""), Some(990)), "me", 1_000),
            LeaseStep::Take
        );
        assert_eq!(
            lease_step(&lease(Some("me"), Some(990)), "me", 1_000),
            LeaseStep::Take
        );
        assert_eq!(
            lease_step(&lease(Some("other"), Some(900)), "me", 1_000),
            LeaseStep::Take
        );
        assert!(matches!(
            lease_step(&lease(Some("other"), Some(990)), "me", 1_000),
            LeaseStep::Wait(d) if d <= Duration::from_millis(250)
        ));
        assert!(matches!(
            lease_step(&lease(Some("other"), Some(1_000)), "me", 1_000),
            LeaseStep::Wait(_)
        ));
    }

    #[test]
    fn the_kill_switch_fails_closed() {
        assert_eq!(KillSwitch::from_value(None), KillSwitch::Off);
        assert_eq!(KillSwitch::from_value(Some(" ")), KillSwitch::Off);
        assert_eq!(KillSwitch::from_value(Some("false")), KillSwitch::Off);
        assert!(KillSwitch::from_value(Some("true")).engaged());
        assert!(KillSwitch::from_value(Some("yes")).engaged());
        assert!(KillSwitch::from_value(Some("maybe")).engaged());
    }
    #[test]
    fn the_switch_only_turns_on_and_keeps_its_first_reason() {
        let mut s = Switch::new(false);
        assert!(!s.is_on());
        s.read(Ok(KillSwitch::Off), None);
        assert!(!s.is_on() && !s.by_kill_switch());
        s.read(Ok(KillSwitch::On), Some("the Lease"));
        assert_eq!(s.why(), Some(&PlanOnly::TurnedOnDuring("the Lease")));
        s.read(Ok(KillSwitch::Off), Some("the settle delay"));
        assert!(s.is_on(), "a later read never turns it off");
        assert_eq!(s.why(), Some(&PlanOnly::TurnedOnDuring("the Lease")));
        assert!(s.by_kill_switch() && s.errors().is_empty());

        let mut dry = Switch::new(true);
        dry.read(Ok(KillSwitch::Off), None);
        assert_eq!(dry.why(), Some(&PlanOnly::DryRun));
        assert!(!dry.by_kill_switch());

        let mut failed = Switch::new(false);
        failed.read(Err("timed out".into()), None);
        assert_eq!(failed.why(), Some(&PlanOnly::KillSwitch));
        assert_eq!(failed.errors(), ["timed out; every action was a dry run"]);
        let mut unreadable = Switch::new(false);
        unreadable.read(Ok(KillSwitch::Unreadable("maybe".into())), None);
        assert!(unreadable.is_on() && unreadable.errors().is_empty());
    }
}
