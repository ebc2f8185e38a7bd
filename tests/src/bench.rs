//! What the benchmark commands share: progress lines with the elapsed time,
//! and the median with min and max of a set of samples.

use std::time::Instant;

/// Progress, with the time since the start.
pub struct Clock(pub Instant);

impl Clock {
    /// Starts now.
    pub fn start() -> Self {
        Self(Instant::now())
    }

    /// Prints one progress line.
    pub fn say(&self, what: &str) {
        println!("[{:>6.1}s] {what}", self.0.elapsed().as_secs_f64());
    }
}

/// Median, min and max of the samples; `None` for none.
pub fn median(samples: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let med = match v.len() {
        0 => return None,
        n if n % 2 == 0 => (v[mid - 1] + v[mid]) / 2.0,
        _ => v[mid],
    };
    Some((med, v[0], v[v.len() - 1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0)));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some((2.5, 1.0, 4.0)));
    }
}
