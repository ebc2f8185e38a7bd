//! Retrying a call's transient failures under a [`RetryPolicy`]: the
//! attempts, the pauses with jitter and the time budget the core decides,
//! for the clients whose library does not retry on its own (Kubernetes,
//! Pub/Sub's REST call).

use std::future::Future;
use std::time::{Duration, Instant};

use crate::core::rules::retry::RetryPolicy;

/// Runs `attempt` until it succeeds, fails in a way `transient` says is
/// final, or `policy` gives up; `before_retry` hears of each retry (how
/// many attempts failed, the pause, the error) before its pause.
pub(crate) async fn retrying<T, E, F, Fut>(
    policy: &RetryPolicy,
    mut attempt: F,
    transient: impl Fn(&E) -> bool,
    mut before_retry: impl FnMut(u32, Duration, &E),
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    let mut failed = 0;
    loop {
        match attempt().await {
            Err(e) if transient(&e) => {
                failed += 1;
                let Some(pause) = policy.pause(failed, started.elapsed(), fastrand::f64()) else {
                    return Err(e);
                };
                before_retry(failed, pause, &e);
                tokio::time::sleep(pause).await;
            }
            done => return done,
        }
    }
}
