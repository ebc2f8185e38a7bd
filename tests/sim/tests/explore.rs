//! The simulator as `cargo test` (and so `make test`) runs it: fresh seeds
//! for a bounded wall-clock time, and a seed replayed exactly.

use std::io::Write;
use std::time::Duration;

/// Fresh seeds for about 20 s of wall time (`NODE_FENCER_SIM_SECONDS`
/// changes it) break no invariant. The figures go to stderr past the test
/// harness's capture, so that every run shows them.
#[test]
fn fresh_seeds_break_no_invariant() {
    let seconds = std::env::var("NODE_FENCER_SIM_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let first = fastrand::u64(..u64::MAX / 2);
    let options = node_fencer_sim::Options::default();
    let found = node_fencer_sim::explore(first, Duration::from_secs(seconds), options);
    let _ = writeln!(std::io::stderr(), "simulator: {}", found.figures());
    if let Some(run) = &found.failure {
        panic!("{}", node_fencer_sim::report(run));
    }
}

/// One seed, run twice, tells the same story: every source of
/// nondeterminism is the seed's.
#[test]
fn a_seed_replays_exactly() {
    for seed in [1, 7, 42] {
        let options = node_fencer_sim::Options { stale_nodes: true };
        let (a, b) = (
            node_fencer_sim::run(seed, options),
            node_fencer_sim::run(seed, options),
        );
        assert_eq!(a.story, b.story, "seed {seed} told two stories");
    }
}
