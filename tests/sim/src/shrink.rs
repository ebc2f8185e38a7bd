//! A failing seed shrunk to the fewest of the adversary's moves that still
//! break the same invariant first: greedy delta debugging over the moves'
//! numbers. Leave out a run of moves, keep the cut if the replay still
//! holds, halve the runs when none can go, down to single moves; what is
//! left is a set from which no one move can go. Each try replays the seed
//! from the same world, policy and swarm; a move left out still draws what
//! it would have, so what follows stays in step until the world it left
//! unchanged makes the pipeline call otherwise. A shrunk run replays
//! exactly with its `--moves`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::adversary::Moves;
use crate::runner::{Run, replay};

/// What shrinking found.
#[derive(Clone, Debug)]
pub struct Shrunk {
    /// The smallest run found that still holds.
    pub run: Run,
    /// The moves the first run carried out.
    pub from: usize,
    /// The moves the smallest run carries out.
    pub kept: usize,
    /// The replays tried.
    pub tries: usize,
    /// The wall time they took.
    pub wall: Duration,
    /// The budget ran out before no one move could go.
    pub cut_short: bool,
}

impl Shrunk {
    /// The figures, in one line.
    pub fn figures(&self) -> String {
        format!(
            "shrunk from {} moves to {} in {} replays ({:.1} s){}",
            self.from,
            self.kept,
            self.tries,
            self.wall.as_secs_f64(),
            if self.cut_short {
                "; the budget ran out, smaller may exist"
            } else {
                ""
            }
        )
    }
}

/// Shrinks `failing` to the fewest moves whose replay still breaks an
/// invariant of the same kind first, within `budget` of wall time.
pub fn shrink(failing: &Run, budget: Duration) -> Shrunk {
    let target = failing.violations.first().map(|v| crate::kind(&v.what));
    shrink_while(failing, budget, |run| {
        target.is_some() && run.violations.first().map(|v| crate::kind(&v.what)) == target
    })
}

/// Shrinks `from` to the fewest moves whose replay `holds`, within
/// `budget` of wall time.
pub fn shrink_while(from: &Run, budget: Duration, holds: impl Fn(&Run) -> bool) -> Shrunk {
    let began = Instant::now();
    let mut kept: Vec<usize> = (0..from.drawn).filter(|n| from.moves.keeps(*n)).collect();
    let first = kept.len();
    let (mut best, mut tries, mut cut_short) = (from.clone(), 0, false);
    let mut chunk = (kept.len() / 2).max(1);
    'passes: while !kept.is_empty() {
        let mut cut = false;
        let mut i = 0;
        while i < kept.len() {
            if began.elapsed() >= budget {
                cut_short = true;
                break 'passes;
            }
            let mut candidate = kept.clone();
            candidate.drain(i..(i + chunk).min(kept.len()));
            tries += 1;
            let only: BTreeSet<usize> = candidate.iter().copied().collect();
            let run = replay(from.seed, from.options, Moves::Only(only));
            if holds(&run) {
                (kept, best, cut) = (candidate, run, true);
            } else {
                i += chunk;
            }
        }
        if chunk > 1 {
            chunk /= 2;
        } else if !cut {
            break;
        }
    }
    // Numbers past the last move the smallest run drew change nothing.
    kept.retain(|n| *n < best.drawn);
    if best.moves != Moves::All {
        best.moves = Moves::Only(kept.iter().copied().collect());
    }
    Shrunk {
        run: best,
        from: first,
        kept: kept.len(),
        tries,
        wall: began.elapsed(),
        cut_short,
    }
}
