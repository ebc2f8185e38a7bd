//! `sim`: replays one seed of the simulator, or explores fresh seeds for a
//! while. See docs/simulator.md.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// node-fencer's fencing pipeline against a simulated world under a
/// seeded adversary: every write checked against the world's truth.
#[derive(Parser)]
#[command(name = "sim")]
struct Args {
    /// Replay this seed and print its story.
    #[arg(long, conflicts_with_all = ["seconds", "from"])]
    seed: Option<u64>,
    /// Explore fresh seeds for this many seconds of wall time.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// The first seed to explore (default: a random one).
    #[arg(long)]
    from: Option<u64>,
    /// Explore past failures, and tell each kind of failure found, how
    /// often, and its first seed.
    #[arg(long, conflicts_with = "seed")]
    keep_going: bool,
    /// Hold back the replacements that leave a stale Node (a kubelet on
    /// another machine adopting the Node object of its name), drawn by
    /// default: a seed then draws as it did before they were.
    #[arg(long)]
    no_stale_nodes: bool,
    /// The default since they were mended; still taken, so that a replay
    /// line printed before then runs as printed.
    #[arg(long, hide = true, conflicts_with = "no_stale_nodes")]
    stale_nodes: bool,
    /// Hold back active fencing (hung Nodes powered off, `stuck` or `on`),
    /// drawn in half the runs by default: a seed then runs as it did before.
    #[arg(long)]
    no_active_fencing: bool,
    /// Run each seed twice and tell those whose two runs differ.
    #[arg(long, conflicts_with_all = ["seed", "keep_going"])]
    twice: bool,
    /// With --seed: carry out only these of the adversary's moves, by
    /// their numbers in the order drawn (`0,4,9`, or `none`): a shrunk
    /// run, as a failure's replay line gives it.
    #[arg(long, requires = "seed", value_parser = node_fencer_sim::Moves::parse)]
    moves: Option<node_fencer_sim::Moves>,
    /// Shrink a failing seed to the fewest moves that still fail, for at
    /// most this many seconds of wall time, and tell the shrunk run's
    /// story (0: tell the seed's own story, unshrunk).
    #[arg(long, default_value_t = 30)]
    shrink_seconds: u64,
}

/// Prints to stdout; a reader that went away (`| head`) ends nothing.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

fn main() -> ExitCode {
    let args = Args::parse();
    let options = node_fencer_sim::Options {
        stale_nodes: !args.no_stale_nodes,
        active_fencing: !args.no_active_fencing,
    };
    if let Some(seed) = args.seed {
        let moves = args.moves.clone().unwrap_or_default();
        let run = node_fencer_sim::replay(seed, options, moves);
        if run.violations.is_empty() {
            say!("{}", run.story.trim_end());
            say!(
                "seed {seed}: no invariant broken ({} invocations, {} calls, {} simulated)",
                run.invocations,
                run.calls,
                node_fencer_sim::world::secs(run.simulated)
            );
            return ExitCode::SUCCESS;
        }
        tell_failure(&run, args.shrink_seconds);
        return ExitCode::FAILURE;
    }
    let first = args.from.unwrap_or_else(|| fastrand::u64(..u64::MAX / 2));
    if args.twice {
        let (seeds, differ) =
            node_fencer_sim::unsteady(first, Duration::from_secs(args.seconds), options);
        say!(
            "{seeds} seeds from {first}, each run twice: {} told two stories {differ:?}",
            differ.len()
        );
        return if differ.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    if args.keep_going {
        let found = node_fencer_sim::survey(first, Duration::from_secs(args.seconds), options);
        say!(
            "{} seeds from {first} in {:.1} s; failures by kind (seeds, first seed):",
            found.seeds,
            found.wall.as_secs_f64()
        );
        for (kind, (count, seed)) in &found.kinds {
            say!("  {count:>5}  seed {seed:<8} {kind}");
        }
        if found.kinds.is_empty() {
            say!("  none");
        }
        return if found.kinds.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let found = node_fencer_sim::explore(first, Duration::from_secs(args.seconds), options);
    say!("{}", found.figures());
    match &found.failure {
        None => ExitCode::SUCCESS,
        Some(run) => {
            tell_failure(run, args.shrink_seconds);
            ExitCode::FAILURE
        }
    }
}

/// Tells a failing run: what it broke and how to replay it, then the story
/// of the run shrunk within `budget` seconds (or its own, unshrunk).
fn tell_failure(run: &node_fencer_sim::Run, budget: u64) {
    if budget == 0 {
        say!("{}", node_fencer_sim::report(run).trim_end());
        return;
    }
    say!("{}", node_fencer_sim::headline(run).trim_end());
    eprintln!("shrinking seed {} (at most {budget} s)...", run.seed);
    let shrunk = node_fencer_sim::shrink(run, Duration::from_secs(budget));
    say!("\n{}:", shrunk.figures());
    say!("{}", node_fencer_sim::report(&shrunk.run).trim_end());
}
