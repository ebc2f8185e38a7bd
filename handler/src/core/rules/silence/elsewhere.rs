//! A kubelet that runs on another machine than the one its Node names. A
//! kubelet that registers under an existing Node's name adopts the object,
//! and the object's `providerID` cannot change: the Node then names a
//! machine that may be off while another one runs its pods. That its
//! machine is off then proves nothing of the kubelet.
//!
//! EC2 records when a stop was asked for, not when the machine got there,
//! and a kubelet renews its Lease through the guest's shutdown, so a write
//! after the recorded stop alone tells nothing. What does: the machine was
//! off at a known time, and the Lease was written after that, by the
//! apiserver's clock, while the cloud records no start of the machine
//! since. The machine is known off from when its trigger reported it got
//! there (an EC2 `stopped` or `terminated` event, the end of a Compute
//! Engine stop), or else from when node-fencer saw it off. Where the first
//! sign came (a Lease heard after the stop), node-fencer notes that time
//! ([`SeenOff`], on the Node); every later decision on the Node holds the
//! Lease's last write to that note. Pure.

use serde::Serialize;

use crate::core::model::facts::{Confirmation, SeenOff};
use crate::core::model::instance::InstanceId;

use super::SKEW_MARGIN_SECS;

/// The evidence that the Node's kubelet runs on another machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Elsewhere {
    /// When node-fencer saw the Node's machine off (Unix seconds).
    pub seen_off_at: i64,
    /// The apiserver's time of the Lease's last write (Unix seconds).
    pub written_at: i64,
}

/// The machine's last start, when the cloud describes it off and records
/// one: the note's key. A machine it describes otherwise, or without a
/// start, gets no note (a BMC records none).
fn started_at(confirmation: &Confirmation) -> Option<i64> {
    match confirmation {
        Confirmation::Seen(facts) if facts.state.is_off() => facts.started_at,
        _ => None,
    }
}

/// The note to write on a Node whose Lease was heard after its machine's
/// stop, now that the cloud describes the machine off: off since `now`, or
/// since the stop its trigger `reported` when that stop is of the machine's
/// current run (after its last start) and not in the future. A kubelet
/// cannot renew from a machine that got to `stopped`, so the earlier time
/// only ever refuses more: a kubelet that took the Node over and went
/// quiet before `now` is still told from the machine's own. `None` when
/// the Node already carries a note that applies from as early, or when the
/// cloud records no start.
pub fn note(
    current: Option<&SeenOff>,
    machine: &InstanceId,
    confirmation: &Confirmation,
    (reported, now): (Option<i64>, i64),
) -> Option<SeenOff> {
    let started_at = started_at(confirmation)?;
    let at = reported
        .filter(|at| (started_at..=now).contains(at))
        .unwrap_or(now);
    if applies(current, machine, confirmation).is_some_and(|noted| noted <= at) {
        return None;
    }
    Some(SeenOff {
        machine: machine.as_str().to_owned(),
        started_at,
        at,
    })
}

/// When the note saw the machine off, if it is of this machine and the
/// cloud records no start since (the same last start): the machine has
/// been off all along since then.
fn applies(
    note: Option<&SeenOff>,
    machine: &InstanceId,
    confirmation: &Confirmation,
) -> Option<i64> {
    let note = note?;
    let started_at = started_at(confirmation)?;
    (note.machine == machine.as_str() && note.started_at == started_at).then_some(note.at)
}

/// True when the Node's note applies: the decision must then read the
/// kubelet's Lease before it fences.
pub fn must_check(
    note: Option<&SeenOff>,
    machine: &InstanceId,
    confirmation: &Confirmation,
) -> bool {
    applies(note, machine, confirmation).is_some()
}

/// The judgement: the Lease was written, by the apiserver's clock, after
/// node-fencer saw the machine off (by the skew margin between the two
/// clocks), while the machine has not started since. A Lease without a
/// write time (a cluster that keeps no managed fields) proves nothing.
pub fn judge(
    note: Option<&SeenOff>,
    machine: &InstanceId,
    confirmation: &Confirmation,
    written_at: Option<i64>,
) -> Option<Elsewhere> {
    let seen_off_at = applies(note, machine, confirmation)?;
    let written_at = written_at?;
    (written_at > seen_off_at.saturating_add(SKEW_MARGIN_SECS)).then_some(Elsewhere {
        seen_off_at,
        written_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::facts::InstanceFacts;
    use crate::core::model::instance::InstanceState;

    const START: i64 = 1_795_000_000;
    const SEEN: i64 = START + 3_600;

    fn machine() -> InstanceId {
        InstanceId::parse("i-0123456789abcdef0").unwrap()
    }

    fn seen(state: InstanceState, started_at: Option<i64>) -> Confirmation {
        let mut facts = InstanceFacts::bare(machine(), state);
        facts.started_at = started_at;
        Confirmation::Seen(facts)
    }

    fn noted() -> SeenOff {
        SeenOff {
            machine: machine().as_str().to_owned(),
            started_at: START,
            at: SEEN,
        }
    }

    #[test]
    fn a_write_after_the_sight_of_the_machine_off_is_a_kubelet_elsewhere() {
        let off = seen(InstanceState::Stopped, Some(START));
        let note = noted();
        let margin = SKEW_MARGIN_SECS;
        assert_eq!(
            judge(Some(&note), &machine(), &off, Some(SEEN + margin + 1)),
            Some(Elsewhere {
                seen_off_at: SEEN,
                written_at: SEEN + margin + 1
            })
        );
        // Within the margin of the two clocks, or before: the machine's own
        // kubelet, in its shutdown.
        for written in [SEEN + margin, SEEN, SEEN - 30] {
            assert_eq!(judge(Some(&note), &machine(), &off, Some(written)), None);
        }
        assert_eq!(judge(Some(&note), &machine(), &off, None), None);
        assert_eq!(judge(None, &machine(), &off, Some(SEEN + 60)), None);
    }

    /// A machine started since the note is another run of it: its kubelet
    /// wrote after the note as it should, and the note no longer applies.
    #[test]
    fn a_start_since_the_note_ends_it() {
        let note = noted();
        let restarted = seen(InstanceState::Stopped, Some(SEEN + 100));
        assert_eq!(
            judge(Some(&note), &machine(), &restarted, Some(SEEN + 200)),
            None
        );
        assert!(!must_check(Some(&note), &machine(), &restarted));
        let other = InstanceId::parse("i-0fedcba9876543210").unwrap();
        let off = seen(InstanceState::Stopped, Some(START));
        assert!(!must_check(Some(&note), &other, &off));
        assert!(must_check(Some(&note), &machine(), &off));
        // A machine the cloud does not describe off, or without a start: no
        // note applies, and none is made.
        for odd in [
            seen(InstanceState::Running, Some(START)),
            seen(InstanceState::Stopped, None),
            Confirmation::NotFound,
        ] {
            assert!(!must_check(Some(&note), &machine(), &odd));
            assert_eq!(note_for(None, &odd), None);
        }
    }

    /// A kubelet that took the Node over, renewed after its machine's
    /// reported stop and went quiet before node-fencer first saw the machine
    /// off: dated from the report, its last write is still after the note.
    #[test]
    fn a_reported_stop_of_this_run_dates_the_note() {
        let off = seen(InstanceState::Terminated, Some(START));
        let now = SEEN + 500;
        let reported = SEEN;
        let dated = note(None, &machine(), &off, (Some(reported), now));
        assert_eq!(dated, Some(noted()));
        let written = SEEN + SKEW_MARGIN_SECS + 60;
        assert!(
            written < now,
            "the kubelet's last write came before the sight"
        );
        assert!(judge(dated.as_ref(), &machine(), &off, Some(written)).is_some());
        // Dated from the sight instead, that write proves nothing.
        let at_sight = note(None, &machine(), &off, (None, now));
        assert_eq!(
            judge(at_sight.as_ref(), &machine(), &off, Some(written)),
            None
        );
        // An earlier date replaces a note of a later sight; a later one never
        // replaces an earlier note.
        assert_eq!(
            note(at_sight.as_ref(), &machine(), &off, (Some(reported), now)),
            Some(noted())
        );
        assert_eq!(note(Some(&noted()), &machine(), &off, (None, now)), None);
        // A report of an earlier run's stop (before the last start), or of a
        // stop in the future, dates nothing: the note is of the sight.
        for odd in [START - 10, now + 1] {
            assert_eq!(
                note(None, &machine(), &off, (Some(odd), now)),
                Some(SeenOff { at: now, ..noted() })
            );
        }
    }

    fn note_for(current: Option<&SeenOff>, confirmation: &Confirmation) -> Option<SeenOff> {
        note(current, &machine(), confirmation, (None, SEEN + 500))
    }

    #[test]
    fn the_first_sight_is_kept_and_a_stale_one_replaced() {
        let off = seen(InstanceState::Terminated, Some(START));
        assert_eq!(
            note_for(None, &off),
            Some(SeenOff {
                at: SEEN + 500,
                ..noted()
            })
        );
        assert_eq!(note_for(Some(&noted()), &off), None);
        let restarted = seen(InstanceState::Stopped, Some(SEEN + 100));
        assert_eq!(
            note_for(Some(&noted()), &restarted),
            Some(SeenOff {
                machine: machine().as_str().to_owned(),
                started_at: SEEN + 100,
                at: SEEN + 500,
            })
        );
    }
}
