//! Every wait of an invocation, and the rule that follows each one: the
//! kill switch is read again before the first write after it. A stage never
//! sleeps on its own (the architecture test holds the pipeline to it): it
//! pauses or polls here, so a new wait cannot forget the switch. The Lease's
//! own wait, a renewal on a timer, ends in [`after`] too.

use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use crate::core::outbound::metrics::Dependency;
use crate::core::rules::control::Switch;
use crate::pipeline::ctx::Ctx;

/// Reads the kill switch again after the wait `what`: on, or unreadable,
/// turns the invocation's switch on for the rest of it.
pub(crate) async fn after(ctx: &Ctx<'_>, switch: &mut Switch, namespace: &str, what: &'static str) {
    let was_on = switch.is_on();
    let read = ctx.control.kill_switch(namespace).await.map_err(|e| {
        ctx.meter.error(Dependency::Kubernetes);
        warn!(error = %e, "kill switch unreadable; acting as if it were on");
        e.to_string()
    });
    switch.read(read, Some(what));
    if switch.is_on() && !was_on {
        warn!(
            wait = what,
            "the kill switch turned on while waiting: the rest is a plan"
        );
    }
}

/// Sleeps for `pause`, then reads the switch again.
pub(crate) async fn pause(
    ctx: &Ctx<'_>,
    switch: &mut Switch,
    namespace: &str,
    pause: Duration,
    what: &'static str,
) {
    tokio::time::sleep(pause).await;
    after(ctx, switch, namespace, what).await;
}

/// Looks with `look` until it says it is done or `deadline` has passed,
/// `every` apart (the last pause cut to the deadline); reads the switch
/// again if it slept at all. The first look is at once. Returns whether
/// `look` said done; its error ends the wait.
pub(crate) async fn poll<E>(
    ctx: &Ctx<'_>,
    switch: &mut Switch,
    namespace: &str,
    (deadline, every): (Instant, Duration),
    what: &'static str,
    mut look: impl AsyncFnMut() -> Result<bool, E>,
) -> Result<bool, E> {
    let mut slept = false;
    let done = loop {
        let done = match look().await {
            Ok(done) => done,
            Err(e) => {
                if slept {
                    after(ctx, switch, namespace, what).await;
                }
                return Err(e);
            }
        };
        let now = Instant::now();
        if done || now >= deadline {
            break done;
        }
        tokio::time::sleep(every.min(deadline - now)).await;
        slept = true;
    };
    if slept {
        after(ctx, switch, namespace, what).await;
    }
    Ok(done)
}
