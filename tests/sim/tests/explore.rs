//! The simulator as `cargo test` (and so `make test`) runs it: fresh seeds
//! for a bounded wall-clock time, a seed replayed exactly, and a run shrunk
//! to the moves it needs.

use std::io::Write;
use std::time::Duration;

use node_fencer_sim::shrink::shrink_while;
use node_fencer_sim::{Moves, Options, Run, replay, run};

/// Fresh seeds for about 20 s of wall time (`NODE_FENCER_SIM_SECONDS`
/// changes it) break no invariant. The figures go to stderr past the test
/// harness's capture, so that every run shows them. The seeds start at a
/// random one, or at `NODE_FENCER_SIM_FIRST_SEED` (`make mutants` starts
/// each run at 1, so that a mutant is tried against the same seeds).
#[test]
fn fresh_seeds_break_no_invariant() {
    let number = |name: &str| std::env::var(name).ok().and_then(|s| s.parse().ok());
    let seconds = number("NODE_FENCER_SIM_SECONDS").unwrap_or(20);
    let first =
        number("NODE_FENCER_SIM_FIRST_SEED").unwrap_or_else(|| fastrand::u64(..u64::MAX / 2));
    let options = node_fencer_sim::Options::default();
    let found = node_fencer_sim::explore(first, Duration::from_secs(seconds), options);
    let _ = writeln!(std::io::stderr(), "simulator: {}", found.figures());
    if let Some(run) = &found.failure {
        let shrunk = node_fencer_sim::shrink(run, Duration::from_secs(20));
        panic!(
            "{}\n{}:\n{}",
            node_fencer_sim::headline(run),
            shrunk.figures(),
            node_fencer_sim::report(&shrunk.run)
        );
    }
}

/// One seed, run twice, tells the same story: every source of
/// nondeterminism is the seed's.
#[test]
fn a_seed_replays_exactly() {
    for seed in [1, 7, 42] {
        let options = Options::default();
        let (a, b) = (run(seed, options), run(seed, options));
        assert_eq!(a.story, b.story, "seed {seed} told two stories");
    }
}

/// Shrinking keeps what the run needs and nothing it can do without: a run
/// whose story tells a machine losing power shrinks to moves of which no
/// one can go, and its moves replay it exactly.
#[test]
fn a_run_shrinks_to_moves_none_of_which_can_go() {
    let options = Options::default();
    let holds = |run: &Run| run.story.contains("loses power");
    let from = (1..500)
        .map(|seed| run(seed, options))
        .find(|r| holds(r) && r.drawn >= 6)
        .expect("a seed among the first 500 with a machine losing power, after 6 moves or more");
    let shrunk = shrink_while(&from, Duration::from_secs(120), holds);
    let seed = from.seed;
    assert!(!shrunk.cut_short, "seed {seed}: {}", shrunk.figures());
    assert!(
        shrunk.kept < shrunk.from,
        "seed {seed}: {}",
        shrunk.figures()
    );
    assert!(holds(&shrunk.run), "seed {seed}: {}", shrunk.run.story);
    let Moves::Only(kept) = &shrunk.run.moves else {
        panic!("seed {seed}: shrunk, yet every move kept");
    };
    assert_eq!(kept.len(), shrunk.kept);
    let again = replay(seed, options, shrunk.run.moves.clone());
    assert_eq!(again.story, shrunk.run.story, "seed {seed}: two stories");
    for n in kept {
        let mut fewer = kept.clone();
        fewer.remove(n);
        let without = replay(seed, options, Moves::Only(fewer));
        assert!(!holds(&without), "seed {seed}: move {n} could go too");
    }
}

/// A list of moves reads back as its flag writes it; anything else is
/// refused with the reason.
#[test]
fn the_moves_flag_reads_what_it_writes() {
    for list in ["0,4,9", "3", "none"] {
        let moves = Moves::parse(list).expect(list);
        assert_eq!(moves.flag(), format!(" --moves {list}"));
    }
    assert_eq!(Moves::All.flag(), "");
    for bad in ["", "1,,2", "-1", "x"] {
        let refused = Moves::parse(bad).expect_err(bad);
        assert!(refused.contains("move's number"), "{bad:?}: {refused}");
    }
}
