//! The one retry policy of every request this crate and a protocol over it make (the Hub's API,
//! its files' `GET`s, a body cut short asked for again): how many times, how long between
//! tries, and for how long in all. Requests object_store makes itself (a cloud store's `GET`s,
//! `HEAD`s and listings) are retried by object_store under the same numbers
//! ([`RetryPolicy::object_store`]); every other retry waits the delays of
//! [`RetryPolicy::delays`].

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use object_store::{BackoffConfig, RetryConfig};

/// The longest wait between two tries (before its jitter).
pub const MAX_BACKOFF: Duration = Duration::from_secs(15);

/// How requests are retried: transport failures, 5xx and 429 answers, and bodies cut short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first try (0: none).
    pub max_retries: usize,
    /// The first wait; each next one doubles, to at most [`MAX_BACKOFF`].
    pub backoff: Duration,
    /// The most time all the waits of one request may add up to.
    pub timeout: Duration,
}

impl RetryPolicy {
    /// The waits before each retry, at most `max_retries` of them and `timeout` in all:
    /// exponential from `backoff` (doubling, at most [`MAX_BACKOFF`]), each lengthened by a
    /// random jitter within (0, wait), so that the many readers of one load (and the loads of
    /// many ranks) that failed together do not come back together. backon's exponential
    /// backoff.
    pub fn delays(&self) -> impl Iterator<Item = Duration> + Send + 'static {
        ExponentialBuilder::new()
            .with_min_delay(self.backoff)
            .with_max_delay(MAX_BACKOFF)
            .with_factor(2.0)
            .with_max_times(self.max_retries)
            .with_total_delay(Some(self.timeout))
            .with_jitter()
            .build()
    }

    /// The same policy as object_store's configuration, for the requests object_store makes
    /// itself (its backoff is jittered too: each wait is drawn between `backoff` and the last
    /// wait times the base).
    pub fn object_store(&self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig {
                init_backoff: self.backoff,
                max_backoff: MAX_BACKOFF,
                base: 2.0,
            },
            max_retries: self.max_retries,
            retry_timeout: self.timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delays_double_with_a_jitter_and_stop_at_the_count_and_the_total() {
        let policy = RetryPolicy {
            max_retries: 6,
            backoff: Duration::from_millis(100),
            timeout: Duration::from_secs(3600),
        };
        let runs: Vec<Vec<Duration>> = (0..20).map(|_| policy.delays().collect()).collect();
        for delays in &runs {
            assert_eq!(delays.len(), 6);
            for (i, delay) in delays.iter().enumerate() {
                // The i-th wait is 100 ms * 2^i plus a jitter below that again.
                let base = Duration::from_millis(100 << i);
                assert!(*delay >= base && *delay < base * 2, "{i}: {delay:?}");
            }
        }
        // Jittered: twenty schedules are not all the same.
        assert!(runs.iter().any(|r| r != &runs[0]), "{runs:?}");
        // At most MAX_BACKOFF before the jitter, however many retries.
        let long = RetryPolicy {
            max_retries: 12,
            ..policy
        };
        let last = long.delays().last().unwrap();
        assert!(last >= MAX_BACKOFF && last < MAX_BACKOFF * 2, "{last:?}");
        // No retries: no waits. A total: the waits stop before passing it.
        assert_eq!(
            RetryPolicy {
                max_retries: 0,
                ..policy
            }
            .delays()
            .count(),
            0
        );
        let short = RetryPolicy {
            timeout: Duration::from_millis(350),
            ..policy
        };
        let waits: Vec<Duration> = short.delays().collect();
        assert!(
            waits.iter().sum::<Duration>() <= Duration::from_millis(350),
            "{waits:?}"
        );
        assert!(!waits.is_empty() && waits.len() < 6, "{waits:?}");
    }

    #[test]
    fn object_store_gets_the_same_numbers() {
        let policy = RetryPolicy {
            max_retries: 3,
            backoff: Duration::from_millis(250),
            timeout: Duration::from_secs(60),
        };
        let config = policy.object_store();
        assert_eq!(config.max_retries, 3);
        assert_eq!(config.retry_timeout, Duration::from_secs(60));
        assert_eq!(config.backoff.init_backoff, Duration::from_millis(250));
        assert_eq!(config.backoff.max_backoff, MAX_BACKOFF);
    }
}
