//! The one retry policy of every request this crate and a protocol over it make (the Hub's API,
//! its files' `GET`s, a body cut short asked for again): how many times, how long between
//! tries, and for how long in all. Requests object_store makes itself (a cloud store's `GET`s,
//! `HEAD`s and listings) are retried by object_store under the same numbers
//! ([`RetryPolicy::object_store`]); every other retry is the one loop here
//! ([`RetryContext::run`], [`RetryPolicy::retry`]), as object_store's own is one
//! (`RetryableRequest::send` with its `RetryContext`).
//!
//! The operation retried says what each try came to ([`Attempt`]): done, a transient failure
//! (tried again after the policy's next wait), one to re-issue at once (it changed what it asks
//! for: a signed URL asked for afresh, bounded by the operation itself), or a permanent failure.
//! Which failures are transient is decided once: [`transient_status`] (5xx, 429) and
//! [`transient_transport`] (no answer, unless the request could not even be built). The loop
//! carries a context across the requests it re-issues: the waits left and the tries made, and
//! the operation's own state (where a body got to, whether to ask afresh), handed from one try
//! to the next.

use std::future::Future;
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

/// Whether an answer of `status` is worth asking again: the server's trouble, or too many
/// requests.
pub fn transient_status(status: reqwest::StatusCode) -> bool {
    status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS
}

/// Whether a request that got no answer is worth sending again: any transport failure (no
/// connection, a timeout, a connection dropped), but a request that could not be built.
pub fn transient_transport(e: &reqwest::Error) -> bool {
    !e.is_builder()
}

/// What one try of a retried operation came to.
#[derive(Debug)]
pub enum Attempt<T, E> {
    /// It succeeded.
    Done(T),
    /// It failed in a way a later try may not: tried again after the policy's next wait; once
    /// the waits have run out, this is the error.
    Transient(E),
    /// It is to be tried again at once: the operation changed what it asks for (a signed URL
    /// asked for afresh). No wait is taken; the operation bounds how often, in its state.
    Reissue,
    /// It failed for good: not tried again.
    Permanent(E),
}

/// Why a retried operation failed: the last try's error, the tries made so far under its
/// context, and whether the policy's waits had run out (else the failure was permanent).
#[derive(Debug)]
pub struct RetryError<E> {
    /// The last try's error.
    pub error: E,
    /// The tries made under the context, this one included.
    pub tries: usize,
    /// Whether the retries ran out (the error is transient, tried as often as allowed).
    pub exhausted: bool,
}

impl<E: std::fmt::Display> std::fmt::Display for RetryError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.exhausted {
            write!(f, "{} (tried {} times)", self.error, self.tries)
        } else {
            write!(f, "{}", self.error)
        }
    }
}

impl<E: std::fmt::Debug + std::fmt::Display> std::error::Error for RetryError<E> {}

/// The context of a retried operation, carried across every request it issues: the policy's
/// waits left, the waits taken and the tries made. One context may serve several runs (a body
/// resumed each time it is cut short shares one budget across its chunks).
pub struct RetryContext {
    delays: Box<dyn Iterator<Item = Duration> + Send>,
    tries: usize,
    retries: usize,
}

impl std::fmt::Debug for RetryContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryContext")
            .field("tries", &self.tries)
            .field("retries", &self.retries)
            .finish_non_exhaustive()
    }
}

impl RetryContext {
    /// A fresh context under `policy`.
    pub fn new(policy: &RetryPolicy) -> Self {
        Self {
            delays: Box::new(policy.delays()),
            tries: 0,
            retries: 0,
        }
    }

    /// The tries made so far.
    pub fn tries(&self) -> usize {
        self.tries
    }

    /// The waits taken so far: the transient failures tried again.
    pub fn retries(&self) -> usize {
        self.retries
    }

    /// The one retry loop: tries `op` on `state` until it is done or fails for good, or until
    /// the policy's waits run out, waiting each before trying a transient failure again. `op`
    /// is handed the state the last try left (each try gives it back with its outcome);
    /// `run` gives back the state the last try left, and the outcome.
    pub async fn run<S, T, E, F, Fut>(
        &mut self,
        mut state: S,
        mut op: F,
    ) -> (S, Result<T, RetryError<E>>)
    where
        F: FnMut(S) -> Fut,
        Fut: Future<Output = (S, Attempt<T, E>)>,
    {
        loop {
            self.tries += 1;
            let (left, attempt) = op(state).await;
            state = left;
            let error = |error, exhausted| RetryError {
                error,
                tries: self.tries,
                exhausted,
            };
            match attempt {
                Attempt::Done(value) => return (state, Ok(value)),
                Attempt::Reissue => {}
                Attempt::Permanent(e) => return (state, Err(error(e, false))),
                Attempt::Transient(e) => match self.delays.next() {
                    Some(delay) => {
                        // Not held through the wait (an answer holds its connection).
                        drop(e);
                        self.retries += 1;
                        tokio::time::sleep(delay).await;
                    }
                    None => return (state, Err(error(e, true))),
                },
            }
        }
    }
}

impl RetryPolicy {
    /// `op` tried under a fresh context ([`RetryContext::run`]), for an operation with no
    /// state of its own.
    pub async fn retry<T, E, F, Fut>(&self, mut op: F) -> Result<T, RetryError<E>>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Attempt<T, E>>,
    {
        let mut context = RetryContext::new(self);
        let run = context.run((), |()| {
            let attempt = op();
            async move { ((), attempt.await) }
        });
        run.await.1
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

    fn quick(max_retries: usize) -> RetryPolicy {
        RetryPolicy {
            max_retries,
            backoff: Duration::from_millis(1),
            timeout: Duration::from_secs(60),
        }
    }

    fn block_on<T>(future: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(future)
    }

    #[test]
    fn the_loop_counts_its_tries_carries_its_state_and_says_when_it_ran_out() {
        // Transient twice, then done: three tries, two waits, the state carried through.
        let mut context = RetryContext::new(&quick(3));
        let (seen, outcome) =
            block_on(context.run(Vec::new(), |mut seen: Vec<usize>| async move {
                seen.push(seen.len());
                let attempt = if seen.len() < 3 {
                    Attempt::Transient("not yet")
                } else {
                    Attempt::Done(seen.len())
                };
                (seen, attempt)
            }));
        assert_eq!(outcome.unwrap(), 3);
        assert_eq!(seen, [0, 1, 2]);
        assert_eq!((context.tries(), context.retries()), (3, 2));

        // The same context, carried on: its waits are shared, one left; then exhausted.
        let (_, outcome) =
            block_on(context.run((), |()| async { ((), Attempt::<(), _>::Transient("cut")) }));
        let error = outcome.unwrap_err();
        assert!(error.exhausted);
        assert_eq!(error.tries, 5);
        assert_eq!(context.retries(), 3);
        assert_eq!(error.to_string(), "cut (tried 5 times)");

        // A reissue takes no wait; a permanent failure stops at once and says no count.
        let mut tries = 0;
        let outcome = block_on(quick(0).retry(|| {
            tries += 1;
            let attempt = match tries {
                1 | 2 => Attempt::Reissue,
                _ => Attempt::<(), _>::Permanent("refused"),
            };
            async move { attempt }
        }));
        let error = outcome.unwrap_err();
        assert!(!error.exhausted);
        assert_eq!((error.tries, error.to_string().as_str()), (3, "refused"));
        // No retries allowed: a transient failure is the error of the first try.
        let error =
            block_on(quick(0).retry(|| async { Attempt::<(), _>::Transient("503") })).unwrap_err();
        assert!(error.exhausted && error.tries == 1, "{error:?}");
    }

    #[test]
    fn transient_is_decided_once() {
        use reqwest::StatusCode;
        for status in [500, 502, 503, 504, 429] {
            assert!(
                transient_status(StatusCode::from_u16(status).unwrap()),
                "{status}"
            );
        }
        for status in [200, 206, 301, 400, 401, 403, 404, 410, 416] {
            assert!(
                !transient_status(StatusCode::from_u16(status).unwrap()),
                "{status}"
            );
        }
    }
}
