//! How many buyers are in checkout at once, as this process sees them: the
//! semaphore path enters the gauge after its permit is granted and leaves
//! it before the permit is released, so the gauge's maximum may never
//! exceed the permit count (checked by the swarm and the HTTP stats).
//!
//! [`Checkout`] bundles an item's semaphore with its gauge.
//!
//! The gauge counts this process's buyers only. Several processes selling
//! the same item share the semaphore's cap, not this gauge.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fairlock::Semaphore;

/// The checkout of one item on the semaphore path: its fair semaphore
/// (`client.semaphore(&item.checkout, permits)`), the gauge of buyers
/// inside, and how long the stand-in payment call takes. Cheap to clone.
#[derive(Clone)]
pub struct Checkout {
    /// The item's checkout semaphore.
    pub semaphore: Semaphore,
    /// Buyers of this process in checkout.
    pub gauge: Arc<CheckoutGauge>,
    /// A pause under the permit, before the sale, standing in for a call
    /// to a rate-limited payment API (zero: no pause).
    pub payment: Duration,
}

impl Checkout {
    /// A checkout over `semaphore` with a fresh gauge and no payment pause.
    pub fn new(semaphore: Semaphore) -> Self {
        Self {
            semaphore,
            gauge: Arc::new(CheckoutGauge::default()),
            payment: Duration::ZERO,
        }
    }

    /// The same checkout with a payment pause of `payment`.
    pub fn with_payment(mut self, payment: Duration) -> Self {
        self.payment = payment;
        self
    }

    /// The permits each buyer's acquire sends.
    pub fn permits(&self) -> u32 {
        self.semaphore.permits()
    }
}

/// Buyers in checkout now, and the most there ever were at once.
#[derive(Debug, Default)]
pub struct CheckoutGauge {
    now: AtomicU64,
    max: AtomicU64,
}

impl CheckoutGauge {
    /// Counts one more buyer in checkout until the returned pass drops.
    pub fn enter(&self) -> CheckoutPass<'_> {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        CheckoutPass { gauge: self }
    }

    /// Buyers in checkout now.
    pub fn now(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    /// The most buyers that were in checkout at once.
    pub fn max(&self) -> u64 {
        self.max.load(Ordering::SeqCst)
    }
}

/// One buyer in checkout; leaves the gauge when dropped.
#[derive(Debug)]
#[must_use = "the buyer leaves checkout as soon as the pass is dropped"]
pub struct CheckoutPass<'a> {
    gauge: &'a CheckoutGauge,
}

impl Drop for CheckoutPass<'_> {
    fn drop(&mut self) {
        self.gauge.now.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gauge_keeps_the_highest_overlap() {
        let gauge = CheckoutGauge::default();
        let a = gauge.enter();
        let b = gauge.enter();
        assert_eq!((gauge.now(), gauge.max()), (2, 2));
        drop(a);
        let c = gauge.enter();
        assert_eq!((gauge.now(), gauge.max()), (2, 2));
        drop((b, c));
        assert_eq!((gauge.now(), gauge.max()), (0, 2));
    }
}
