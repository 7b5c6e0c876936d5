//! The bandwidth cap: every byte received is given a slot on one shared timeline at the capped
//! rate, and a request that gets ahead of its slot sleeps until it comes (a leaky bucket with no
//! burst beyond one body chunk). Shared by every request of a [`Remote`](crate::Remote).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Paces received bytes to at most `rate` bytes per second.
#[derive(Debug)]
pub(crate) struct Pace {
    rate: u64,
    next: Mutex<Option<Instant>>,
}

impl Pace {
    /// A pace of `rate` bytes per second (at least 1).
    pub(crate) fn new(rate: u64) -> Self {
        Self {
            rate: rate.max(1),
            next: Mutex::new(None),
        }
    }

    /// How long to wait before using `bytes` more, reserving their slot.
    pub(crate) fn reserve(&self, bytes: usize, now: Instant) -> Duration {
        let cost = Duration::from_secs_f64(bytes as f64 / self.rate as f64);
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let start = match *next {
            Some(at) if at > now => at,
            _ => now,
        };
        *next = Some(start + cost);
        start - now
    }

    /// Waits for `bytes`' slot.
    pub(crate) async fn take(&self, bytes: usize) {
        let wait = self.reserve(bytes, Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_rate() {
        let pace = Pace::new(1000);
        let t0 = Instant::now();
        assert_eq!(pace.reserve(500, t0), Duration::ZERO);
        // The next 500 bytes may start once the first 500 have had their half second.
        assert_eq!(pace.reserve(500, t0), Duration::from_millis(500));
        assert_eq!(pace.reserve(1, t0), Duration::from_secs(1));
        // An idle pace does not bank credit: after a long pause it starts from now.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(pace.reserve(1000, later), Duration::ZERO);
        assert_eq!(pace.reserve(0, later), Duration::from_secs(1));
    }
}
