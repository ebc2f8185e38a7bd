//! The proof that a Node's kubelet is dead (`FAST_NOT_READY`), so that
//! node-fencer may mark its Node `Ready=Unknown` itself rather than wait
//! out the node controller's grace period. Two things must hold:
//!
//! - **silent since the stop**: the cloud confirmed the machine off and
//!   recorded when it stopped, and the kubelet's Lease was last written
//!   before that, by [`SKEW_MARGIN_SECS`], both by the kubelet's own
//!   `renewTime` and by the apiserver's time of the write;
//! - **a renewal missed**: a renewal the kubelet was due to make (every
//!   quarter of the Lease's duration, 10 s by default) has not come, by
//!   [`LATE_RENEWAL_MARGIN_SECS`], measured on a clock node-fencer trusts:
//!   the apiserver's (its `Date` against its own time of the Lease's last
//!   write), or node-fencer's own monotonic clock across which the Lease
//!   kept one `resourceVersion`. Never the kubelet's `renewTime` alone: the
//!   kubelet stamps it with its own clock, which may run behind, and a live
//!   kubelet whose last renewal merely fell before the stop is not silent.
//!
//! A renewal seen at any point means the kubelet was heard after the stop.
//! Pure: the judgement over what was read; the Lease's reading, the stop
//! times and the mark written live in the submodules.

pub mod elsewhere;
pub mod lease;
pub mod mark;
pub mod stops;

use std::time::Duration;

use serde::Serialize;

use crate::core::model::facts::Confirmation;
use crate::core::rules::decide;

pub use lease::{KubeletLease, LeaseRead};
pub use mark::{MARK_REASON, MarkPatch, mark_message, mark_patch};
pub use stops::{ec2_stop_time, gce_stop_time, reported_stops, stop_time};

/// How much earlier than the recorded stop the kubelet's last renewal
/// must be. The Lease's `renewTime` is the node's clock, the stop time the
/// cloud's: both are NTP-disciplined (Amazon Time Sync, Google's metadata
/// server), typically within milliseconds, but a kubelet's clock may drift
/// before its sync; five seconds covers that drift and the stop time's
/// one-second resolution. A kubelet that died with a renewal inside the
/// margin is never proven silent: neither its last renewal nor the stop
/// moves again, so its Node waits for the node controller, as without
/// the setting.
pub const SKEW_MARGIN_SECS: i64 = 5;

/// How late past its due time a renewal may come from a live kubelet: the
/// kubelet's renewal timer jitters by up to 4% (0.4 s of 10 s) and starts
/// after the previous renewal's request ends, and the request itself takes
/// its time; the two clocks' second resolution adds up to a second more.
pub const LATE_RENEWAL_MARGIN_SECS: i64 = 5;

/// What node-fencer's own clock has seen of the Lease in this invocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Watched {
    /// Nothing to compare: no `resourceVersion` read.
    Nothing,
    /// The same `resourceVersion` on every read, the first this long ago.
    Unchanged(Duration),
    /// Written again since the first read, which came after the cloud had
    /// confirmed the machine off: someone renewed it after the stop.
    Renewed,
}

/// Which trusted clock showed the missed renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProofClock {
    /// The apiserver's: its `Date` against its own time of the last write.
    Apiserver,
    /// node-fencer's monotonic clock, the Lease unchanged across it.
    NodeFencer,
}

impl ProofClock {
    /// How a message names it.
    pub fn phrase(self) -> &'static str {
        match self {
            Self::Apiserver => "by the apiserver's clock",
            Self::NodeFencer => "by node-fencer's own clock",
        }
    }
}

/// The evidence that a kubelet is dead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Proof {
    /// The cloud's recorded stop (Unix seconds).
    pub stopped_at: i64,
    /// The Lease's last renewal by the kubelet's clock (Unix seconds).
    pub renewed_at: i64,
    /// How long the Lease has gone unwritten, in whole seconds.
    pub quiet_secs: i64,
    /// How often the kubelet renews it.
    pub renew_every_secs: i64,
    /// The clock that measured `quiet_secs`.
    pub clock: ProofClock,
}

/// What showed the kubelet heard after the stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "by")]
pub enum Heard {
    /// Its own `renewTime` is after the stop, or within the margin of it.
    RenewTime,
    /// The apiserver's time of the Lease's last write is after the stop,
    /// or within the margin of it.
    Written {
        /// That time (Unix seconds).
        written_at: i64,
    },
    /// node-fencer saw the Lease written again during this invocation.
    Seen,
}

/// The judgement on one Node whose machine the cloud calls off.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "proof")]
pub enum Silence {
    /// Silent since the stop and past a renewal it was due to make: the
    /// Node may be marked `Ready=Unknown`.
    Silent(Proof),
    /// The kubelet may be alive: nothing is marked and the contradiction
    /// is reported.
    HeardAfterStop {
        /// The cloud's recorded stop (Unix seconds).
        stopped_at: i64,
        /// The Lease's last renewal by the kubelet's clock (Unix seconds).
        renewed_at: i64,
        /// What showed it.
        heard: Heard,
    },
    /// Silent since the stop, but no renewal has been due long enough to
    /// show it missed: look again after `after`.
    NotYetDue {
        /// When a renewal will be overdue, on the clock that is closest.
        after: Duration,
    },
    /// Nothing proves it either way: the Node controller's own judgement
    /// is waited for, as without the setting.
    Unproven {
        /// What is missing.
        why: Unproven,
    },
}

/// What keeps the proof from being made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unproven {
    /// The cloud does not confirm the machine off in this look.
    NotOff,
    /// The cloud recorded no stop time.
    NoStopTime,
    /// No Lease of the Node's kubelet.
    NoLease,
    /// The Lease was never renewed.
    NoRenewal,
    /// The Lease belongs to another Node object of the same name.
    OtherHolder,
}

impl Silence {
    /// A short, stable name for logs.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Silent(_) => "silent",
            Self::HeardAfterStop { .. } => "heard_after_stop",
            Self::NotYetDue { .. } => "not_yet_due",
            Self::Unproven { why } => match why {
                Unproven::NotOff => "unproven_not_off",
                Unproven::NoStopTime => "unproven_no_stop_time",
                Unproven::NoLease => "unproven_no_lease",
                Unproven::NoRenewal => "unproven_no_renewal",
                Unproven::OtherHolder => "unproven_other_holder",
            },
        }
    }
}

/// Judges one Node from the cloud's answer about its machine, the stop a
/// trigger reported for it (see [`stop_time`]), its kubelet's Lease as just
/// read and what node-fencer has watched of it. A hibernated stop is off
/// only with `fence_hibernated`, exactly as for the taint.
pub fn judge(
    confirmation: &Confirmation,
    fence_hibernated: bool,
    (read, watched): (&LeaseRead, Watched),
    (reported, now): (Option<i64>, i64),
) -> Silence {
    let unproven = |why| Silence::Unproven { why };
    let facts = match confirmation {
        Confirmation::Seen(facts)
            if decide::not_confirmed(confirmation, fence_hibernated).is_none() =>
        {
            facts
        }
        _ => return unproven(Unproven::NotOff),
    };
    let Some(stopped_at) = stop_time(facts.stopped_at, reported, now) else {
        return unproven(Unproven::NoStopTime);
    };
    let renewed_at = match read.lease {
        KubeletLease::Missing => return unproven(Unproven::NoLease),
        KubeletLease::NeverRenewed => return unproven(Unproven::NoRenewal),
        KubeletLease::OtherHolder => return unproven(Unproven::OtherHolder),
        KubeletLease::RenewedAt(at) => at,
    };
    let after_stop = |at: i64| at.saturating_add(SKEW_MARGIN_SECS) > stopped_at;
    let heard = match (read.written_at, watched) {
        _ if after_stop(renewed_at) => Some(Heard::RenewTime),
        (Some(written_at), _) if after_stop(written_at) => Some(Heard::Written { written_at }),
        (_, Watched::Renewed) => Some(Heard::Seen),
        _ => None,
    };
    if let Some(heard) = heard {
        return Silence::HeardAfterStop {
            stopped_at,
            renewed_at,
            heard,
        };
    }
    let due = read
        .renew_every_secs
        .max(1)
        .saturating_add(LATE_RENEWAL_MARGIN_SECS);
    let proof = |quiet_secs, clock| {
        Silence::Silent(Proof {
            stopped_at,
            renewed_at,
            quiet_secs,
            renew_every_secs: read.renew_every_secs,
            clock,
        })
    };
    let by_apiserver = read
        .written_at
        .zip(read.server_now)
        .map(|(written, now)| now.saturating_sub(written));
    if let Some(quiet) = by_apiserver.filter(|q| *q >= due) {
        return proof(quiet, ProofClock::Apiserver);
    }
    let due_for = Duration::from_secs(due.unsigned_abs());
    let by_own = match watched {
        Watched::Unchanged(quiet) => Some(quiet),
        Watched::Nothing | Watched::Renewed => None,
    };
    if let Some(quiet) = by_own.filter(|q| *q >= due_for) {
        let secs = i64::try_from(quiet.as_secs()).unwrap_or(i64::MAX);
        return proof(secs, ProofClock::NodeFencer);
    }
    let left_by_apiserver =
        by_apiserver.map(|q| Duration::from_secs(due.saturating_sub(q).unsigned_abs()));
    let left_by_own = by_own.map(|q| due_for.saturating_sub(q));
    let after = match (left_by_apiserver, left_by_own) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => due_for,
    };
    Silence::NotYetDue { after }
}

#[cfg(test)]
mod tests;
