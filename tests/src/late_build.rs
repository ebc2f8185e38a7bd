//! Binaries `make test` builds beside the integration tests rather than
//! before them: the old control planes (`setup.sh --only-old-planes`), which
//! only the legacy and 1.15 tests run, then the checks' tools (`setup.sh
//! --only-checks`), of which the witness test runs promtool. Building them
//! while the other tests wait on their controllers' timers takes them off
//! the cold run's critical path.
//!
//! `make test` names that build's process in `NODE_FENCER_LATE_BUILD_PID`.
//! A stack that needs one of its binaries waits for it while that process
//! lives, and fails loudly once it has ended without it, or when no build
//! runs at all: never a skip.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The variable naming the build's process.
pub const PID_VAR: &str = "NODE_FENCER_LATE_BUILD_PID";

/// Longer than the build takes from an empty cache on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(45 * 60);
const POLL: Duration = Duration::from_secs(2);
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// The binaries the old control plane's stack runs: its kube-apiserver,
/// kube-controller-manager and kube-scheduler, and its hollow kubelet.
pub fn old_plane() -> anyhow::Result<Vec<PathBuf>> {
    let mut paths = plane("NODE_FENCER_KUBE_LEGACY_BIN")?;
    paths.push(env_path("NODE_FENCER_HOLLOW_KUBELET_LEGACY")?);
    Ok(paths)
}

/// The binaries the oldest control plane's stack runs, its external-attacher
/// among them.
pub fn oldest_plane() -> anyhow::Result<Vec<PathBuf>> {
    let mut paths = plane("NODE_FENCER_KUBE_OLDEST_BIN")?;
    paths.push(env_path(crate::attacher::OLDEST_ATTACHER)?);
    Ok(paths)
}

/// A tool of the checks `setup.sh` builds, named by `var` in `env.sh`
/// (`NODE_FENCER_PROMTOOL`), once it is built.
pub fn checks_tool(var: &str) -> anyhow::Result<PathBuf> {
    let path = env_path(var)?;
    wait_for(std::slice::from_ref(&path), var)?;
    Ok(path)
}

fn plane(var: &str) -> anyhow::Result<Vec<PathBuf>> {
    let dir = env_path(var)?;
    Ok([
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ]
    .iter()
    .map(|name| dir.join(name))
    .collect())
}

fn env_path(var: &str) -> anyhow::Result<PathBuf> {
    std::env::var_os(var).map(PathBuf::from).with_context(|| {
        format!("{var} is not set: run `make setup` (tests/stack/setup.sh) and source its env.sh")
    })
}

/// Returns once every one of `paths` is a file: at once when they are;
/// otherwise after waiting for the build `NODE_FENCER_LATE_BUILD_PID`
/// names, printing progress each minute. `what` names them in messages.
pub fn wait_for(paths: &[PathBuf], what: &str) -> anyhow::Result<()> {
    wait(paths, what, std::env::var(PID_VAR).ok().as_deref())
}

/// [`wait_for`], the build's process id given as `builder`.
fn wait(paths: &[PathBuf], what: &str, builder: Option<&str>) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut reported = None::<Instant>;
    loop {
        let missing: Vec<&Path> = paths
            .iter()
            .map(PathBuf::as_path)
            .filter(|p| !p.is_file())
            .collect();
        let Some(first) = missing.first() else {
            if reported.is_some() {
                eprintln!(
                    "{what}: built after {} s of waiting",
                    started.elapsed().as_secs()
                );
            }
            return Ok(());
        };
        let pid = match builder.map(str::parse::<u32>) {
            None => bail!(
                "{what}: {} does not exist: run `make setup` (tests/stack/setup.sh)",
                first.display()
            ),
            Some(Err(_)) => bail!("{PID_VAR} is not a process id: {builder:?}"),
            Some(Ok(pid)) => pid,
        };
        if !alive(pid) {
            bail!(
                "{what}: the build beside the tests (process {pid}, its lines start with \
                 [checks]) ended without {}",
                first.display()
            );
        }
        if started.elapsed() > PATIENCE {
            bail!(
                "{what}: still not built after {} min: {} is missing",
                PATIENCE.as_secs() / 60,
                first.display()
            );
        }
        if reported.is_none_or(|at| at.elapsed() >= REPORT_EVERY) {
            eprintln!(
                "{what}: waiting for the build beside the tests ([checks] lines) to write {} \
                 ({} s so far)",
                first.display(),
                started.elapsed().as_secs()
            );
            reported = Some(Instant::now());
        }
        std::thread::sleep(POLL);
    }
}

/// Whether process `pid` runs: not gone, and not a zombie its parent (the
/// shell of `make test`, which reaps it only after the tests) has yet to
/// wait for.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => state_of(&stat).is_some_and(|s| s != 'Z' && s != 'X'),
        Err(_) => false,
    }
}

/// The state letter of a `/proc/PID/stat` line, after the command name
/// (which may itself hold spaces and parentheses).
fn state_of(stat: &str) -> Option<char> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_is_read_after_the_last_parenthesis() {
        assert_eq!(state_of("42 (bash) S 1 42"), Some('S'));
        assert_eq!(state_of("42 (a) b) Z 1 42"), Some('Z'));
        assert_eq!(state_of("42 bash"), None);
    }

    #[test]
    fn this_process_is_alive_and_a_reaped_one_is_not() {
        assert!(alive(std::process::id()));
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawning true");
        let pid = child.id();
        // Ended but not yet waited for: a zombie, not a build that runs.
        std::thread::sleep(Duration::from_millis(300));
        assert!(!alive(pid));
        child.wait().expect("waiting for true");
        assert!(!alive(pid));
    }

    #[test]
    fn present_files_need_no_build() {
        let here = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        wait(std::slice::from_ref(&here), "the manifest", None).expect("present");
        wait(std::slice::from_ref(&here), "the manifest", Some("1")).expect("present");
    }

    #[test]
    fn a_missing_file_fails_without_a_build_or_once_it_ended() {
        let missing = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("no-such-binary");
        let err = wait(std::slice::from_ref(&missing), "a binary", None).expect_err("no build");
        assert!(format!("{err:#}").contains("make setup"), "{err:#}");

        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawning true");
        child.wait().expect("waiting for true");
        let pid = child.id().to_string();
        let err = wait(std::slice::from_ref(&missing), "a binary", Some(&pid)).expect_err("ended");
        assert!(format!("{err:#}").contains("ended without"), "{err:#}");
    }

    #[test]
    fn a_file_written_while_the_build_runs_is_waited_for() {
        let path = std::env::temp_dir().join(format!("late-build-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(500));
                std::fs::write(path, b"built").expect("writing the binary");
            })
        };
        let me = std::process::id().to_string();
        wait(std::slice::from_ref(&path), "a binary", Some(&me)).expect("written while waiting");
        writer.join().expect("the writer");
        let _ = std::fs::remove_file(&path);
    }
}
