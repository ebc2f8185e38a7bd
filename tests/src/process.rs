//! The harness's own processes: each in a session of its own that ends
//! with the test process, so that no run leaks a server.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

/// Sends the signal `name` (`KILL`, `STOP`, `CONT`, ...) to `pid`.
pub fn signal(pid: u32, name: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .context("running kill")?;
    if !status.success() {
        bail!("kill -{name} {pid} failed: the process is gone");
    }
    Ok(())
}

/// A process started by [`spawn_watched`].
#[derive(Debug)]
pub struct Watched {
    /// The command's own pid, for signals.
    pub pid: u32,
    /// Its output, appended.
    pub log: PathBuf,
}

/// Starts `command` (its program and arguments; the environment is this
/// process's) in a session of its own beside a shell that ends the session
/// once this test process is gone or the command has exited, its output
/// appended to `STATE_DIR/logs/NAME-<pid>.log`.
pub fn spawn_watched(dir: &Path, name: &str, command: &Command) -> anyhow::Result<Watched> {
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let me = std::process::id();
    let log = logs.join(format!("{name}-{me}.log"));
    let pid_file = logs.join(format!("{name}-{me}.pid"));
    let _ = std::fs::remove_file(&pid_file);
    Command::new("setsid")
        .arg("bash")
        .arg("-c")
        .arg(format!(
            "\"$@\" >>'{log}' 2>&1 & echo $! >'{pid}'; \
             while kill -0 {me} 2>/dev/null && kill -0 $! 2>/dev/null; do sleep 1; done; kill -KILL -- -$$",
            log = log.display(),
            pid = pid_file.display()
        ))
        .arg(name)
        .arg(command.get_program())
        .args(command.get_args())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {name} (setsid bash)"))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file)
            && let Ok(pid) = text.trim().parse()
        {
            return Ok(Watched { pid, log });
        }
        if std::time::Instant::now() > deadline {
            bail!("{name} did not start within 10 s: see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
