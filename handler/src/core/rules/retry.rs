//! When to try a call again and how long to wait first: bounded attempts,
//! a time budget, exponential backoff with jitter. Pure: the caller supplies
//! the random draw and the clock reading, so every decision is testable.
//!
//! EC2 calls get the same shape from the AWS SDK's standard retry mode
//! (configured from [`EC2`] in `shell::connect`), Compute Engine calls from
//! the Google Cloud client's policies (configured from [`COMPUTE`] in
//! `shell::cloud::gce`); Kubernetes calls from
//! `shell::cluster`, because kube's own retry layer allows 15 attempts and
//! 1000 s pauses, far beyond a Lambda invocation.

use std::time::Duration;

/// How a dependency's transient failures are retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// The pause ceiling before the first retry; doubles with each retry.
    pub base: Duration,
    /// No pause exceeds this.
    pub cap: Duration,
    /// No retry starts once this much time has passed since the first attempt,
    /// so one call cannot eat the invocation's timeout.
    pub budget: Duration,
}

/// Kubernetes API calls: a 429 clears within a second; the pauses of eight
/// attempts add up to 6 to 12 s, long enough to ride out an apiserver
/// restart.
pub const KUBERNETES: RetryPolicy = RetryPolicy {
    max_attempts: 8,
    base: Duration::from_millis(200),
    cap: Duration::from_secs(3),
    budget: Duration::from_secs(20),
};

/// EC2 API calls (the SDK applies the attempts and backoff; the budget is
/// its operation timeout).
pub const EC2: RetryPolicy = RetryPolicy {
    max_attempts: 5,
    base: Duration::from_millis(200),
    cap: Duration::from_secs(5),
    budget: Duration::from_secs(30),
};

/// Compute Engine API calls. The client library's own default allows 10
/// attempts over 60 s, pauses of up to 60 s and no attempt timeout, so one
/// call could hold a hung connection for its whole minute; these bounds are
/// EC2's. The client applies the attempts, the backoff (its jitter is full,
/// not equal) and the budget.
pub const COMPUTE: RetryPolicy = RetryPolicy {
    max_attempts: 5,
    base: Duration::from_millis(200),
    cap: Duration::from_secs(5),
    budget: Duration::from_secs(30),
};

/// Publishing a notification: bounded tighter than the clouds' calls,
/// three attempts in ten seconds, so an unreachable topic costs an
/// invocation little time.
pub const NOTIFY: RetryPolicy = RetryPolicy {
    max_attempts: 3,
    base: Duration::from_millis(200),
    cap: Duration::from_secs(2),
    budget: Duration::from_secs(10),
};

/// A BMC's Redfish API: two attempts within ten seconds. A BMC is slow
/// and easily overloaded (one request at a time on some), and a machine
/// that lost its power often took its BMC along: the next trigger or sweep
/// asks again, rather than one look holding the invocation up.
pub const REDFISH: RetryPolicy = RetryPolicy {
    max_attempts: 2,
    base: Duration::from_millis(500),
    cap: Duration::from_secs(2),
    budget: Duration::from_secs(10),
};

impl RetryPolicy {
    /// The pause before the next attempt after `failed` attempts have failed
    /// (`failed >= 1`) and `elapsed` time since the first began, or `None`
    /// when the call must give up. `draw` is a uniform random number in
    /// `[0, 1)`; out-of-range draws are clamped.
    ///
    /// Equal jitter: half the exponential ceiling, plus a random share of the
    /// other half, so concurrent callers spread out yet always back off.
    pub fn pause(&self, failed: u32, elapsed: Duration, draw: f64) -> Option<Duration> {
        if failed == 0 || failed >= self.max_attempts || elapsed >= self.budget {
            return None;
        }
        let ceiling = self
            .base
            .checked_mul(1u32.checked_shl(failed - 1).unwrap_or(u32::MAX))
            .unwrap_or(self.cap)
            .min(self.cap);
        let draw = if draw.is_finite() {
            draw.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let pause = ceiling / 2 + ceiling.mul_f64(draw / 2.0);
        // Never sleep past the budget: the last attempt still gets to run.
        Some(pause.min(self.budget - elapsed))
    }
}

/// True for the HTTP statuses that mean "try again later" rather than "no":
/// throttling and the server-side failures a restart or overload produces.
pub fn is_transient_status(code: u16) -> bool {
    matches!(code, 429 | 500 | 502 | 503 | 504)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const P: RetryPolicy = RetryPolicy {
        max_attempts: 4,
        base: Duration::from_millis(100),
        cap: Duration::from_millis(500),
        budget: Duration::from_secs(3),
    };

    #[test]
    fn backs_off_exponentially_up_to_the_cap() {
        let lowest: Vec<_> = (1..4).map(|n| P.pause(n, Duration::ZERO, 0.0)).collect();
        let highest: Vec<_> = (1..4).map(|n| P.pause(n, Duration::ZERO, 1.0)).collect();
        let ms = Duration::from_millis;
        assert_eq!(lowest, [Some(ms(50)), Some(ms(100)), Some(ms(200))]);
        assert_eq!(highest, [Some(ms(100)), Some(ms(200)), Some(ms(400))]);
        let long = RetryPolicy {
            max_attempts: 100,
            ..P
        };
        assert_eq!(long.pause(40, Duration::ZERO, 1.0), Some(ms(500)));
    }

    #[test]
    fn gives_up_after_the_last_attempt_or_the_budget() {
        assert_eq!(P.pause(4, Duration::ZERO, 0.5), None);
        assert_eq!(P.pause(1, Duration::from_secs(3), 0.5), None);
        assert_eq!(P.pause(0, Duration::ZERO, 0.5), None);
        assert_eq!(
            P.pause(3, Duration::from_millis(2950), 1.0),
            Some(Duration::from_millis(50)),
            "a pause is cut to what is left of the budget"
        );
    }

    #[test]
    fn the_kubernetes_policy_rides_out_a_restart_within_its_budget() {
        let total = |draw: f64| -> Duration {
            (1..KUBERNETES.max_attempts)
                .filter_map(|n| KUBERNETES.pause(n, Duration::ZERO, draw))
                .sum()
        };
        assert!(total(0.0) >= Duration::from_secs(6), "{:?}", total(0.0));
        assert!(total(1.0) <= KUBERNETES.budget, "{:?}", total(1.0));
    }

    #[test]
    fn the_cloud_policies_leave_their_budget_to_the_attempts() {
        for policy in [EC2, COMPUTE] {
            let pauses: Duration = (1..policy.max_attempts)
                .filter_map(|n| policy.pause(n, Duration::ZERO, 1.0))
                .sum();
            assert!(pauses * 4 <= policy.budget, "{policy:?}: {pauses:?}");
        }
    }

    #[test]
    fn transient_statuses() {
        for code in [429, 500, 502, 503, 504] {
            assert!(is_transient_status(code), "{code}");
        }
        for code in [200, 400, 401, 403, 404, 409, 410, 422, 501] {
            assert!(!is_transient_status(code), "{code}");
        }
    }

    proptest! {
        #[test]
        fn pauses_stay_within_bounds(
            failed in 0u32..50,
            elapsed_ms in 0u64..5000,
            draw in prop::num::f64::ANY,
        ) {
            let elapsed = Duration::from_millis(elapsed_ms);
            if let Some(pause) = P.pause(failed, elapsed, draw) {
                prop_assert!((1..P.max_attempts).contains(&failed));
                prop_assert!(pause <= P.cap);
                prop_assert!(elapsed + pause <= P.budget);
            }
        }

        #[test]
        fn total_wait_is_bounded(draws in prop::collection::vec(0.0f64..1.0, 10)) {
            let mut elapsed = Duration::ZERO;
            let mut attempts = 1;
            while let Some(pause) = P.pause(attempts, elapsed, draws[attempts as usize]) {
                elapsed += pause;
                attempts += 1;
            }
            prop_assert!(attempts <= P.max_attempts);
            prop_assert!(elapsed <= P.budget);
        }
    }
}
