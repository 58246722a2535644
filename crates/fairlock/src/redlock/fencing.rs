//! Fencing tokens over a majority.
//!
//! Each primary keeps a counter (`<prefix>{<name>}:seq`). A primary's vote
//! carries its floor, max(counter, its clock in µs). The grant takes
//! max(floors of the majority it won) + 1 and writes it back to that
//! majority (`redlock_fence.lua` never lowers a counter). Any later
//! majority shares at least one primary with this one, so its floor is at
//! least this token and its token is greater: **tokens strictly increase
//! across grants as long as consecutive majorities overlap**, which they do
//! unless a primary lost its counter. A primary that restarted empty has
//! lost it; the clock floor covers that case, as long as the primaries'
//! clocks do not go back (the same assumption as the single-primary lock).
//!
//! The write-back must reach a majority, or the next grant could miss it:
//! an attempt whose write-back reached fewer primaries fails and gives its
//! votes back.

use std::sync::Arc;

use fairlock_core::{RedLockKeys, RedlockFence};

use crate::error::{PrimaryFailure, PrimaryFailureKind};

use super::primaries::{call, Primaries};

/// How long a counter outlives its last grant. Losing it is safe (the
/// clock floor), so this only bounds what an idle lock leaves behind.
const COUNTER_IDLE_MS: u64 = 600_000;

/// The token of a grant whose majority answered with `floors`.
pub(crate) fn token_from_floors(floors: impl IntoIterator<Item = u64>) -> u64 {
    floors.into_iter().max().unwrap_or(0).saturating_add(1)
}

/// Writes `token` back to the primaries at `indexes`; returns the indexes
/// that confirmed it and the failures.
pub(crate) async fn write_back(
    primaries: &Primaries,
    indexes: &[usize],
    keys: &Arc<RedLockKeys>,
    token: u64,
) -> (Vec<usize>, Vec<PrimaryFailure>) {
    let answers = primaries
        .on(indexes.iter().copied(), |primary| {
            let keys = Arc::clone(keys);
            async move {
                let fence = RedlockFence {
                    token,
                    idle_ms: COUNTER_IDLE_MS,
                };
                call(&primary, &[keys.seq()], &fence).await
            }
        })
        .await;
    let mut confirmed = Vec::new();
    let mut failures = Vec::new();
    for (index, answer) in answers {
        match answer {
            Ok(counter) if counter >= token => confirmed.push(index),
            Ok(counter) => {
                if let Some(primary) = primaries.all().get(index) {
                    failures.push(primary.failure(PrimaryFailureKind::Failed(format!(
                        "its counter stayed at {counter}, below token {token}"
                    ))));
                }
            }
            Err(failure) => failures.push(failure),
        }
    }
    (confirmed, failures)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_token_is_above_every_floor() {
        assert_eq!(super::token_from_floors([5, 9, 7]), 10);
        assert_eq!(super::token_from_floors([]), 1);
        assert_eq!(super::token_from_floors([u64::MAX]), u64::MAX);
    }
}
