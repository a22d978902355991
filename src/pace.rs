//! A token bucket: how much one peer may ask at once (the burst) and then each second
//! (the rate). The broker's DNS stub and audit entries, a controller's workers and API
//! clients are each held to one.

use std::time::{Duration, Instant};

/// Tokens refilled at `rate` a second, at most `burst` saved.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    tokens: f64,
    refilled: Instant,
    burst: f64,
    rate: f64,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(burst: f64, rate: f64) -> TokenBucket {
        TokenBucket {
            tokens: burst,
            refilled: Instant::now(),
            burst,
            rate,
        }
    }

    fn refill(&mut self, now: Instant) {
        let earned = now.saturating_duration_since(self.refilled).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + earned).min(self.burst);
        self.refilled = now;
    }

    /// Takes a token if there is one at `now`; else how long until there is one.
    pub fn take_or_wait(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens < 1.0 {
            return Err(Duration::from_secs_f64(
                ((1.0 - self.tokens) / self.rate).max(0.0),
            ));
        }
        self.tokens -= 1.0;
        Ok(())
    }

    /// Takes a token if there is one at `now`.
    pub fn take(&mut self, now: Instant) -> bool {
        self.take_or_wait(now).is_ok()
    }

    /// Takes a token at `now`, owing it when there is none: how long the taker waits for
    /// its turn. At most `most_owed` tokens are owed, so that a peer asking without pause
    /// books no more than that much of the future.
    pub fn take_owing(&mut self, now: Instant, most_owed: f64) -> Duration {
        self.refill(now);
        self.tokens = (self.tokens - 1.0).max(-most_owed);
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }

    /// Whether the bucket would be full at `now` (forgetting it loses nothing).
    pub fn is_full(&self, now: Instant) -> bool {
        let earned = now.saturating_duration_since(self.refilled).as_secs_f64() * self.rate;
        self.tokens + earned >= self.burst
    }

    /// How long one token takes to come.
    pub fn token_time(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate_and_what_is_owed_is_bounded() {
        let start = Instant::now();
        let mut b = TokenBucket::new(3.0, 10.0);
        assert!((0..3).all(|_| b.take(start)));
        assert_eq!(
            b.take_or_wait(start).err(),
            Some(Duration::from_millis(100))
        );
        assert!(b.take(start + Duration::from_millis(100)));
        assert!(!b.is_full(start + Duration::from_millis(100)));
        assert!(b.is_full(start + Duration::from_secs(1)));
        // Owing: each take waits one token's time more, up to what may be owed.
        let later = start + Duration::from_secs(10);
        let mut b = TokenBucket::new(1.0, 10.0);
        let waits: Vec<Duration> = (0..5).map(|_| b.take_owing(later, 2.0)).collect();
        assert_eq!(waits[0], Duration::ZERO);
        assert_eq!(waits[1], Duration::from_millis(100));
        assert_eq!(waits[2], Duration::from_millis(200));
        assert_eq!(waits[4], Duration::from_millis(200));
        assert_eq!(b.token_time(), Duration::from_millis(100));
    }
}
