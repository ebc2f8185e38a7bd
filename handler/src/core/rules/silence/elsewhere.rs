//! A kubelet that runs on another machine than the one its Node names. A
//! kubelet that registers under an existing Node's name adopts the object,
//! and the object's `providerID` cannot change: the Node then names a
//! machine that may be off while another one runs its pods. That its
//! machine is off then proves nothing of the kubelet.
//!
//! EC2 records when a stop was asked for, not when the machine got there,
//! and a kubelet renews its Lease through the guest's shutdown, so a write
//! after the recorded stop alone tells nothing. What does: node-fencer saw
//! the machine off, and the Lease was written after that, by the
//! apiserver's clock, while the cloud records no start of the machine
//! since. Where the first sign came (a Lease heard after the recorded
//! stop), node-fencer notes when it saw the machine off
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
/// recorded stop, now that the cloud describes the machine off: `None`
/// when the Node already carries one that applies (the earliest sight is
/// the one that counts), or when the cloud records no start.
pub fn note(
    current: Option<&SeenOff>,
    machine: &InstanceId,
    confirmation: &Confirmation,
    now: i64,
) -> Option<SeenOff> {
    let started_at = started_at(confirmation)?;
    if applies(current, machine, confirmation).is_some() {
        return None;
    }
    Some(SeenOff {
        machine: machine.as_str().to_owned(),
        started_at,
        at: now,
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

    fn note_for(current: Option<&SeenOff>, confirmation: &Confirmation) -> Option<SeenOff> {
        note(current, &machine(), confirmation, SEEN + 500)
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
